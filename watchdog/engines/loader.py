"""Load and validate engine profiles: the shipped ones, then operator files (`--engines FILE`).

Every error names the file, the entry and the key, so `run` can exit 2 with a message the
operator can act on. An operator entry with a shipped name replaces the shipped profile.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.core.knowledge.tomlcheck import (
    SignatureError,
    array,
    check_keys,
    get,
    read_toml,
    read_toml_text,
    regex,
    str_map,
    strs,
    table,
)
from watchdog.engines.profile import (
    COUNTER_FIELDS,
    GAUGE_FIELDS,
    HEALTH_MEANINGS,
    LOG_KINDS,
    ROLES,
    EngineProfile,
    LogExtra,
    LogRule,
    MetricSample,
    RoleRule,
    Spelling,
)

SHIPPED = ("vllm", "sglang", "trtllm", "tgi")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_TYPES = frozenset({"int", "float", "ratio%"})
# A distribution name as PEP 508 spells it (packaging's NAME rule).
_DIST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")


class EngineError(ValueError):
    """An engine profile file is invalid; the message names file, entry and key."""


@dataclass(frozen=True)
class EngineSet:
    """The profiles in force, in detection order (operator files first)."""

    profiles: tuple[EngineProfile, ...]

    def get(self, name: str) -> EngineProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


def load_engines(extra: Sequence[Path | str] = ()) -> EngineSet:
    """The shipped profiles, then each operator file in order (same name replaces)."""
    base = Path(__file__).parent.joinpath("profiles")  # not importlib.resources: its zipfile
    shipped: list[EngineProfile] = []
    for name in SHIPPED:
        text = base.joinpath(f"{name}.toml").read_text(encoding="utf-8")
        shipped.extend(parse_profiles(text, f"engines/{name}.toml (built-in)"))
    operator: list[EngineProfile] = []
    for path in extra:
        operator.extend(load_file(Path(path)))
    names = {p.name for p in operator}
    return EngineSet(tuple(operator) + tuple(p for p in shipped if p.name not in names))


def load_file(path: Path) -> list[EngineProfile]:
    """One operator profile file, validated."""
    try:
        text = read_toml_text(path, "engine file")
    except SignatureError as exc:
        raise EngineError(str(exc)) from exc
    return parse_profiles(text, str(path))


def parse_profiles(text: str, origin: str) -> list[EngineProfile]:
    """Every [[engine]] entry of one file; EngineError on the first problem."""
    try:
        doc = read_toml(text, origin, "an engine file")
    except SignatureError as exc:
        raise EngineError(str(exc)) from exc
    try:
        check_keys(doc, {"schema", "engine"}, origin)
        if doc.get("schema", 1) != 1:
            raise EngineError(f"{origin}: key 'schema': unsupported version {doc['schema']!r}")
        entries = array(doc, "engine", origin)
        if not entries:
            raise EngineError(f"{origin}: no [[engine]] entry")
        profiles = [_engine(e, origin, i) for i, e in enumerate(entries)]
    except SignatureError as exc:
        raise EngineError(str(exc)) from exc
    names = [p.name for p in profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EngineError(f"{origin}: engine name(s) defined twice: {', '.join(dupes)}")
    return profiles


def _engine(e: Any, origin: str, i: int) -> EngineProfile:
    if not isinstance(e, dict):
        raise EngineError(f"{origin}: engine[{i}]: expected a table")
    name = e.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise EngineError(
            f"{origin}: engine[{i}]: key 'name': expected a short lowercase name like "
            f"'sglang', got {name!r}"
        )
    where = f"{origin}: engine '{name}'"
    check_keys(
        e,
        {"name", "title", "version", "version_package", "packages", "source", "detect", "role",
         "metrics", "health", "log", "fallback", "preflight"},
        where,
    )  # fmt: skip
    detect = table(e, "detect", where)
    check_keys(detect, {"cmdline", "titles"}, f"{where}: detect")
    metrics = table(e, "metrics", where)
    check_keys(metrics, {"path", "sample"}, f"{where}: metrics")
    health = table(e, "health", where)
    check_keys(health, {"path", "answers", "no_answer"}, f"{where}: health")
    no_answer = health.get("no_answer")
    if no_answer is not None and no_answer not in HEALTH_MEANINGS:
        raise EngineError(
            f"{where}: health: key 'no_answer': {no_answer!r} is not one of "
            f"{', '.join(sorted(HEALTH_MEANINGS))}"
        )
    log = table(e, "log", where)
    check_keys(log, {"prefixes", "rule"}, f"{where}: log")
    pre = table(e, "preflight", where)
    check_keys(
        pre, {"attention_flags", "trtllm_values", "trtllm_default_cc"}, f"{where}: preflight"
    )
    return EngineProfile(
        name=name,
        title=get(e, "title", str, where, name),
        origin=origin,
        version=get(e, "version", str, where, ""),
        version_package=_dist(get(e, "version_package", str, where, ""), where, "version_package"),
        packages=tuple(_dist(p, where, "packages") for p in strs(e, "packages", where)),
        cmdline=tuple(
            regex(p, f"{where}: detect: key 'cmdline'") for p in strs(detect, "cmdline", where)
        ),
        titles=tuple(
            regex(p, f"{where}: detect: key 'titles'") for p in strs(detect, "titles", where)
        ),
        roles=tuple(_role(r, f"{where}: role[{j}]") for j, r in enumerate(array(e, "role", where))),
        metrics_path=_path(get(metrics, "path", str, where, "/metrics"), f"{where}: metrics"),
        samples=_samples(array(metrics, "sample", where), f"{where}: metrics"),
        health_path=_path(get(health, "path", str, where, "/health"), f"{where}: health"),
        health=_answers(health.get("answers", {}), f"{where}: health: key 'answers'"),
        health_no_answer=no_answer,
        log_prefixes=tuple(
            _prefix(p, f"{where}: log: key 'prefixes'") for p in strs(log, "prefixes", where)
        ),
        logs=tuple(
            _rule(r, name, f"{where}: log.rule[{j}]")
            for j, r in enumerate(array(log, "rule", where))
        ),
        attention_flags=tuple(strs(pre, "attention_flags", f"{where}: preflight")),
        trtllm_values=frozenset(strs(pre, "trtllm_values", f"{where}: preflight")),
        trtllm_default_cc=frozenset(strs(pre, "trtllm_default_cc", f"{where}: preflight")),
        fallbacks={
            fname: _spelling(body, f"{where}: fallback.{fname}")
            for fname, body in table(e, "fallback", where).items()
        },
    )


def _dist(value: str, where: str, key: str) -> str:
    """A distribution name as pip installs it (e.g. 'sglang', 'tensorrt-llm'); '' is none."""
    if value and not _DIST.match(value):
        raise EngineError(
            f"{where}: key '{key}': {value!r} is not a distribution name; use the name pip "
            "installs, e.g. 'sglang' or 'tensorrt-llm'"
        )
    return value


def _path(value: str, where: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise EngineError(
            f"{where}: key 'path': expected a URL path like '/metrics', got {value!r}"
        )
    return value


def _role(r: Any, where: str) -> RoleRule:
    if not isinstance(r, dict):
        raise EngineError(f"{where}: expected a table")
    check_keys(r, {"role", "title"}, where)
    role = r.get("role")
    if role not in ROLES:
        raise EngineError(
            f"{where}: key 'role': unknown role {role!r}; use one of {', '.join(sorted(ROLES))}"
        )
    return RoleRule(role=role, title=regex(r.get("title"), f"{where}: key 'title'"))


def _samples(rows: Iterable[Any], where: str) -> tuple[MetricSample, ...]:
    out = []
    for j, s in enumerate(rows):
        w = f"{where}: sample[{j}]"
        if not isinstance(s, dict):
            raise EngineError(f"{w}: expected a table")
        check_keys(s, {"name", "field", "type"}, w)
        name, fld, tp = s.get("name"), s.get("field"), s.get("type")
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_:][A-Za-z0-9_:]*$", name):
            raise EngineError(f"{w}: key 'name': not a Prometheus sample name: {name!r}")
        if (
            tp == "counter"
            and fld not in COUNTER_FIELDS
            or tp == "gauge"
            and fld not in GAUGE_FIELDS
        ):
            allowed = COUNTER_FIELDS if tp == "counter" else GAUGE_FIELDS
            raise EngineError(
                f"{w}: key 'field': a {tp} feeds one of {', '.join(sorted(allowed))}, got {fld!r}"
            )
        if tp not in ("counter", "gauge"):
            raise EngineError(f"{w}: key 'type': expected 'counter' or 'gauge', got {tp!r}")
        assert isinstance(fld, str)  # one of the field names, checked above
        out.append(MetricSample(name=name, field=fld, type=tp))
    return tuple(out)


def _answers(value: Any, where: str) -> dict[int, str]:
    if not isinstance(value, dict):
        raise EngineError(f'{where}: expected a table like {{ 503 = "dead" }}')
    out: dict[int, str] = {}
    for status, meaning in value.items():
        if not str(status).isdigit() or not 100 <= int(status) <= 599:
            raise EngineError(f"{where}: {status!r} is not an HTTP status")
        if meaning not in HEALTH_MEANINGS:
            raise EngineError(
                f"{where}: {status}: {meaning!r} is not one of {', '.join(sorted(HEALTH_MEANINGS))}"
            )
        out[int(status)] = meaning
    return out


def _prefix(p: str, where: str) -> re.Pattern[str]:
    if not p.startswith("^"):
        raise EngineError(f"{where}: a log prefix must be anchored with '^', got {p!r}")
    return regex(p, where)


def _rule(r: Any, engine: str, where: str) -> LogRule:
    if not isinstance(r, dict):
        raise EngineError(f"{where}: expected a table")
    check_keys(r, {"kind", "needle", "pattern", "before", "extra", "set", "types"}, where)
    kind = r.get("kind")
    if kind not in LOG_KINDS:
        raise EngineError(
            f"{where}: key 'kind': {kind!r} is not one of {', '.join(sorted(LOG_KINDS))}"
        )
    needle = r.get("needle")
    if not isinstance(needle, str) or not needle:
        raise EngineError(f"{where}: key 'needle': expected the literal text the line contains")
    pattern = regex(r.get("pattern"), f"{where}: key 'pattern'")
    head = _literal_head(pattern.pattern)
    if not (head.startswith(needle) or needle.startswith(head)):
        raise EngineError(f"{where}: key 'pattern': must start with the needle {needle!r}")
    before = r.get("before")
    extras = []
    for k, x in enumerate(array(r, "extra", where)):
        w = f"{where}: extra[{k}]"
        if not isinstance(x, dict):
            raise EngineError(f"{w}: expected a table")
        check_keys(x, {"needle", "pattern"}, w)
        xn = x.get("needle")
        if not isinstance(xn, str) or not xn:
            raise EngineError(f"{w}: key 'needle': expected literal text")
        extras.append(LogExtra(needle=xn, pattern=regex(x.get("pattern"), f"{w}: key 'pattern'")))
    types = str_map(r, "types", where)
    for group, tp in types.items():
        if tp not in _TYPES:
            raise EngineError(f"{where}: key 'types': {group} = {tp!r}; use int, float or ratio%")
    const = table(r, "set", where)
    return LogRule(
        engine=engine,
        kind=kind,
        needle=needle,
        pattern=pattern,
        before=regex(before, f"{where}: key 'before'") if before is not None else None,
        extras=tuple(extras),
        set=dict(const),
        types=types,
    )


def _literal_head(pattern: str) -> str:
    """The literal characters a pattern starts with (escapes undone, stops at a metachar)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in ".^$*+?{}[]\\|()":
            break
        out.append(c)
        i += 1
    return "".join(out)


def _spelling(body: Any, where: str) -> Spelling:
    if not isinstance(body, dict):
        raise EngineError(f"{where}: expected a table")
    check_keys(body, {"args", "env", "note"}, where)
    return Spelling(
        args=tuple(strs(body, "args", where)),
        env=str_map(body, "env", where),
        note=get(body, "note", str, where, ""),
    )


def as_mapping(profiles: EngineSet) -> Mapping[str, EngineProfile]:
    """Name -> profile, for lookups by `--engine`."""
    return {p.name: p for p in profiles.profiles}
