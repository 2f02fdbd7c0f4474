"""Signature files: the shipped knowledge base loads, and every error names file, entry and key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.simfixtures import run_watchdog
from watchdog.core.knowledge.signatures import (
    EVIDENCE_KINDS,
    SignatureError,
    load_file,
    load_signatures,
)

GOOD = """
schema = 1

[[signature]]
id = "my_hang"
title = "My hang"
fix = "restart it"

[[signature.evidence]]
kind = "log"
pattern = 'my engine is stuck'
weight = 0.6
"""


def _write(tmp_path: Path, text: str, name: str = "ops.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(tmp_path: Path, text: str) -> tuple[str, Path]:
    path = _write(tmp_path, text)
    with pytest.raises(SignatureError) as info:
        load_file(path)
    return str(info.value), path


def _sig(evidence: str, head: str = 'id = "my_hang"') -> str:
    return f"schema = 1\n[[signature]]\n{head}\n[[signature.evidence]]\n{evidence}\n"


def test_shipped_knowledge_base_loads_and_covers_every_evidence_kind() -> None:
    sigs = load_signatures()
    used = {r.kind for s in sigs.signatures for r in s.evidence + s.unless}
    assert used <= EVIDENCE_KINDS
    assert all(s.fix and s.references for s in sigs.signatures)
    assert all(s.fallback in sigs.fallbacks for s in sigs.signatures if s.fallback)
    assert sigs.log_keep_pattern() is not None


def test_good_operator_file_loads(tmp_path: Path) -> None:
    sigs = load_file(_write(tmp_path, GOOD))
    assert sigs.ids == ("my_hang",)
    rule = sigs.signatures[0].evidence[0]
    assert rule.pattern is not None and rule.pattern.search("now my engine is stuck")


@pytest.mark.parametrize(
    ("text", "entry", "key"),
    [
        (_sig('kind = "log"\npattern = "x"\ncolour = "red"'), "my_hang", "colour"),
        (_sig('kind = "log"\npattern = "(unclosed"'), "my_hang", "pattern"),
        (_sig('kind = "telepathy"'), "my_hang", "kind"),
        (_sig('kind = "log"'), "my_hang", "pattern"),
        (_sig('kind = "stack"'), "my_hang", "frames"),
        (_sig('kind = "package"\nvalues = ["1"]'), "my_hang", "name"),
        (_sig('kind = "gpu_cc"'), "my_hang", "values"),
        (_sig('kind = "log"\npattern = "x"\nweight = "high"'), "my_hang", "weight"),
        (_sig('kind = "log"\npattern = "x"\nweight = 1.5'), "my_hang", "weight"),
        (_sig('kind = "log"\npattern = "x"\nweight = -0.1'), "my_hang", "weight"),
        (_sig('kind = "log"\npattern = "x"\nrequired = "yes"'), "my_hang", "required"),
        (_sig('kind = "stack"\nframes = "download_file"'), "my_hang", "frames"),
        (
            _sig('kind = "log"\npattern = "x"', 'id = "my_hang"\npriority = "high"'),
            "my_hang",
            "priority",
        ),
        (
            _sig('kind = "log"\npattern = "x"', 'id = "my_hang"\nwhen = "sometimes"'),
            "my_hang",
            "when",
        ),
        (_sig('kind = "log"\npattern = "x"', 'id = "my_hang"\nstate = "sad"'), "my_hang", "state"),
        (
            _sig('kind = "log"\npattern = "x"', 'id = "my_hang"\ncolour = "red"'),
            "my_hang",
            "colour",
        ),
        (_sig('kind = "log"\npattern = "x"', 'id = "My Hang"'), "signature[0]", "id"),
        ('schema = 1\n[[signature]]\nid = "my_hang"\n', "my_hang", "evidence"),
    ],
    ids=[
        "unknown_key",
        "bad_regex",
        "bad_kind",
        "missing_pattern",
        "stack_without_frames",
        "package_without_name",
        "gpu_cc_without_values",
        "weight_wrong_type",
        "weight_above_1",
        "weight_below_0",
        "required_wrong_type",
        "frames_not_a_list",
        "priority_wrong_type",
        "bad_when",
        "bad_state",
        "unknown_signature_key",
        "bad_id",
        "no_evidence",
    ],
)
def test_errors_name_file_entry_and_key(tmp_path: Path, text: str, entry: str, key: str) -> None:
    msg, path = _error(tmp_path, text)
    assert str(path) in msg
    assert entry in msg
    assert f"'{key}'" in msg


def test_evidence_errors_name_the_item(tmp_path: Path) -> None:
    text = GOOD + '\n[[signature.evidence]]\nkind = "log"\npattern = "[bad"\n'
    msg, _ = _error(tmp_path, text)
    assert "evidence[1]" in msg and "pattern" in msg and "[bad" in msg


def test_duplicate_id_is_an_error(tmp_path: Path) -> None:
    msg, path = _error(tmp_path, GOOD + GOOD.replace("schema = 1", ""))
    assert str(path) in msg and "duplicate" in msg and "my_hang" in msg


def test_bad_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    msg, path = _error(tmp_path, "[[signature]\nid = ")
    assert str(path) in msg and "TOML" in msg


def test_unknown_top_level_key_is_named(tmp_path: Path) -> None:
    msg, path = _error(tmp_path, GOOD + "\n[extras]\nx = 1\n")
    assert str(path) in msg and "'extras'" in msg


def test_bad_known_bad_and_benign_entries_are_named(tmp_path: Path) -> None:
    msg, _ = _error(
        tmp_path, 'schema = 1\n[[known_bad]]\nid = "old_fi"\nseverity = "meh"\npackage = "x"\n'
    )
    assert "old_fi" in msg and "'severity'" in msg
    msg, _ = _error(
        tmp_path, 'schema = 1\n[[benign]]\nstate = "napping"\nkind = "stack"\nframes = ["x"]\n'
    )
    assert "benign[0]" in msg and "'state'" in msg


def test_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SignatureError, match="nope.toml"):
        load_file(tmp_path / "nope.toml")


def test_operator_file_with_an_existing_id_replaces_it(tmp_path: Path) -> None:
    shipped = load_signatures()
    original = shipped.get("gpu_kernel_spin")
    assert original is not None
    text = GOOD.replace('"my_hang"', '"gpu_kernel_spin"').replace("My hang", "Site-specific spin")
    merged = load_signatures([_write(tmp_path, text)])
    replaced = merged.get("gpu_kernel_spin")
    assert replaced is not None and replaced.title == "Site-specific spin"
    assert replaced.origin == str(tmp_path / "ops.toml")
    assert merged.ids.count("gpu_kernel_spin") == 1
    assert set(merged.ids) == set(shipped.ids)


def test_operator_file_with_a_new_id_adds_it(tmp_path: Path) -> None:
    merged = load_signatures([_write(tmp_path, GOOD)])
    assert set(merged.ids) == set(load_signatures().ids) | {"my_hang"}


def _check(path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return run_watchdog("signatures", "--check", str(path), *more)


def test_signatures_check_cli_exit_codes(tmp_path: Path) -> None:
    good = _check(_write(tmp_path, GOOD, "good.toml"))
    assert good.returncode == 0, good.stderr
    assert "ok" in good.stdout
    bad_path = _write(tmp_path, _sig('kind = "log"\npattern = "(unclosed"'), "bad.toml")
    bad = _check(bad_path)
    assert bad.returncode == 2
    assert str(bad_path) in bad.stderr and "'pattern'" in bad.stderr and "my_hang" in bad.stderr


def test_boolean_weight_is_a_wrong_type(tmp_path: Path) -> None:
    msg, _ = _error(tmp_path, _sig('kind = "log"\npattern = "x"\nweight = true'))
    assert "'weight'" in msg


def test_known_bad_error_names_a_file_whose_path_has_a_colon(tmp_path: Path) -> None:
    folder = tmp_path / "site:a"
    folder.mkdir()
    path = _write(
        folder, 'schema = 1\n[[known_bad]]\nid = "old_fi"\nseverity = "meh"\npackage = "x"\n'
    )
    with pytest.raises(SignatureError) as info:
        load_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            _sig('kind = "log"\npattern = "x"', 'id = "my_hang"\nmin_confidence = nan'),
            "min_confidence",
        ),
        (
            _sig('kind = "log"\npattern = "x"', 'id = "my_hang"\nmin_confidence = -inf'),
            "min_confidence",
        ),
        (_sig('kind = "log"\npattern = "x"\nweight = nan'), "weight"),
        (_sig('kind = "log"\npattern = "x"\nwithin_s = inf'), "within_s"),
        (_sig('kind = "setting"\nname = "x"\nequals = nan'), "equals"),
    ],
    ids=["min_confidence_nan", "min_confidence_-inf", "weight_nan", "within_s_inf", "equals_nan"],
)
def test_non_finite_numbers_are_refused(tmp_path: Path, text: str, key: str) -> None:
    # min_confidence = nan made every stalled tick "hung" with no evidence at all.
    msg, path = _error(tmp_path, text)
    assert str(path) in msg and "my_hang" in msg and f"'{key}'" in msg and "finite" in msg


def test_nan_min_confidence_fails_signatures_check(tmp_path: Path) -> None:
    path = _write(tmp_path, _sig('kind = "log"\npattern = "x"', 'id = "a"\nmin_confidence = nan'))
    done = _check(path)
    assert done.returncode == 2 and "'min_confidence'" in done.stderr


UNKNOWN_FALLBACK = GOOD.replace(
    'fix = "restart it"', 'fix = "restart it"\nfallback = "nonexistent"'
)


def test_an_undefined_fallback_is_refused_at_load(tmp_path: Path) -> None:
    path = _write(tmp_path, UNKNOWN_FALLBACK)
    with pytest.raises(SignatureError) as info:
        load_signatures([path])
    msg = str(info.value)
    assert str(path) in msg and "my_hang" in msg and "'fallback'" in msg and "nonexistent" in msg
    done = _check(path)
    assert done.returncode == 2, done.stdout
    assert "'fallback'" in done.stderr and "[fallback.nonexistent]" in done.stderr


@pytest.mark.parametrize("name", ["none", "restart", "disable_nvls"])
def test_shipped_fallbacks_may_be_named(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, UNKNOWN_FALLBACK.replace("nonexistent", name))
    sig = load_signatures([path]).get("my_hang")
    assert sig is not None and sig.fallback == name
    assert _check(path).returncode == 0


def test_a_fallback_defined_in_an_operator_file_may_be_named(tmp_path: Path) -> None:
    table = '\n[fallback.nonexistent]\ndescription = "site fallback"\nenv = { X = "1" }\n'
    same = _write(tmp_path, UNKNOWN_FALLBACK + table, "same.toml")
    assert load_signatures([same]).fallbacks["nonexistent"].env == {"X": "1"}
    other = _write(tmp_path, "schema = 1\n" + table, "other.toml")
    uses = _write(tmp_path, UNKNOWN_FALLBACK, "uses.toml")
    assert load_signatures([other, uses]).get("my_hang") is not None
    done = _check(uses, "--signatures", str(other))
    assert done.returncode == 0, done.stderr


def test_a_signature_file_that_is_not_utf8_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "ops.toml"
    path.write_bytes(b"\xff\xfes\x00c\x00")
    with pytest.raises(SignatureError, match="not UTF-8") as info:
        load_file(path)
    assert str(path) in str(info.value)
    for argv in (
        ["signatures", "--check", str(path)],
        ["signatures", "--signatures", str(path)],
        [
            "run",
            "--server-url",
            "http://127.0.0.1:8000",
            "--no-cdn-default",
            "--signatures",
            str(path),
        ],
    ):
        done = run_watchdog(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert (
            "Traceback" not in done.stderr and str(path) in done.stderr and "UTF-8" in done.stderr
        )
