"""Property tests for config and signature TOML: any document is a Config / SignatureSet or
the documented error (ConfigError, SignatureError), never another exception."""

from __future__ import annotations

import contextlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzzkit import FUZZ
from watchdog.config import KEYS, ConfigError, build_config, load_config
from watchdog.core.knowledge.signatures import SignatureError, _parse

TOML_VALUE = st.recursive(
    st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["a{99999999999}", "(a", "http://[::1", "dcgm:http://", "file:", "-"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(parent=FUZZ, max_examples=200)
@given(st.dictionaries(st.sampled_from(sorted(KEYS)), TOML_VALUE, max_size=5))
def test_any_config_mapping_is_a_config_or_a_config_error(values: dict) -> None:
    try:
        build_config(values, origin="fuzz")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode().replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"  # type: ignore[attr-defined]


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(KEYS)), TOML_VALUE, max_size=4))
def test_any_config_file_loads_or_is_a_config_error(tmp_path_factory, values: dict) -> None:
    path = Path(tmp_path_factory.mktemp("cfg")) / "c.toml"
    path.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in values.items()))
    with contextlib.suppress(ConfigError):
        load_config(path)


@FUZZ
@given(st.binary(max_size=200))
def test_config_bytes_load_or_are_a_config_error(tmp_path_factory, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("cfg")) / "c.toml"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        load_config(path)


SIG_KEYS = st.sampled_from(
    ["id", "title", "when", "state", "priority", "min_confidence", "fallback", "fix", "commands",
     "references", "evidence", "unless"]
)  # fmt: skip
RULE_KEYS = st.sampled_from(
    ["kind", "pattern", "frames", "files", "status", "weight", "label", "decisive", "required",
     "name", "values", "for_s"]
)  # fmt: skip
RULE = st.dictionaries(RULE_KEYS, TOML_VALUE, max_size=6)
SIGNATURE = st.dictionaries(
    SIG_KEYS, TOML_VALUE | st.lists(RULE, min_size=1, max_size=2), max_size=9
)


def _is_tables(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _tables(name: str, entries: list[dict]) -> str:
    out = []
    for e in entries:
        scalars = {k: v for k, v in e.items() if not _is_tables(v)}
        out.append(f"[[{name}]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in scalars.items()))
        for k, v in e.items():
            if k not in scalars:
                for rule in v:
                    out.append(
                        f"[[{name}.{k}]]\n"
                        + "".join(f"{rk} = {_toml(rv)}\n" for rk, rv in rule.items())
                    )
    return "".join(out)


@FUZZ
@given(st.lists(SIGNATURE, max_size=2), st.lists(RULE, max_size=2))
def test_any_signature_file_parses_or_is_a_signature_error(sigs: list, benign: list) -> None:
    text = _tables("signature", sigs) + _tables("benign", [{"state": "idle", **b} for b in benign])
    try:
        _parse(text, "fuzz.toml")
    except SignatureError as exc:
        assert str(exc).startswith("fuzz.toml")


@FUZZ
@given(st.text(max_size=300))
def test_signature_text_parses_or_is_a_signature_error(text: str) -> None:
    with contextlib.suppress(SignatureError):
        _parse(text, "fuzz.toml")
