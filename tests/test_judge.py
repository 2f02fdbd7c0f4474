"""The judge's shape: ordered stages, one place that builds the Verdict, states as an enum,
and `unknown` when the evidence cannot decide between two causes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.obsbuilder import Timeline, events, final, procs
from watchdog.core.judge import stages
from watchdog.core.judge.candidate import Candidate
from watchdog.core.judge.classify import pick
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import STATES, to_dict
from watchdog.core.states import State

LINE = "RuntimeError: frobnicator lost its quorum on rank 3"


def _sig(sid: str, fallback: str, weight: float, other: str) -> str:
    return f"""
[[signature]]
id = "{sid}"
title = "{sid} title"
when = "any"
state = "crash"
priority = 77
min_confidence = 0.5
fallback = "{fallback}"
fix = "fix {sid}"
references = ["https://example.invalid/{sid}"]

[[signature.evidence]]
kind = "log"
pattern = 'frobnicator lost its quorum'
decisive = true
weight = {weight}
label = "{sid} quorum line"

[[signature.evidence]]
kind = "log"
pattern = '{other}'
weight = 0.3
label = "{sid} own line"
"""


def _two(tmp_path: Path, a: tuple[str, float], b: tuple[str, float]) -> SignatureSet:
    path = tmp_path / "two.toml"
    path.write_text(
        _sig("cause_a", a[0], a[1], "alpha wobble") + _sig("cause_b", b[0], b[1], "beta wobble"),
        encoding="utf-8",
    )
    return load_signatures([path])


def _verdict(sigs: SignatureSet, lines: list[str]):  # type: ignore[no-untyped-def]
    tl = Timeline(procs=procs())
    tl.tick(logs=events(lines, sigs))
    tl.ticks(2)
    return final(tl.obs, sigs)


def test_two_causes_the_evidence_fits_equally_are_unknown(tmp_path: Path) -> None:
    sigs = _two(tmp_path, ("restart", 0.6), ("none", 0.6))
    v = _verdict(sigs, [LINE])
    assert v.state == "hung" and v.signature == "unknown"
    assert "cause_a" in v.title and "cause_b" in v.title
    (undecided,) = [e for e in v.evidence if e.kind == "undecided"]
    # What would decide it: each cause's rule that did not hold.
    assert "cause_a own line" in undecided.detail and "cause_b own line" in undecided.detail
    assert v.fallback is None  # nothing to remediate until the cause is known


def test_evidence_that_decides_names_the_cause(tmp_path: Path) -> None:
    sigs = _two(tmp_path, ("restart", 0.6), ("none", 0.6))
    v = _verdict(sigs, [LINE, "beta wobble"])
    assert v.signature == "cause_b" and v.state == "hung"


def test_equal_causes_of_one_family_keep_the_first(tmp_path: Path) -> None:
    """The same fallback: the operator does the same whichever it is, so no `unknown`."""
    sigs = _two(tmp_path, ("restart", 0.6), ("restart", 0.6))
    assert _verdict(sigs, [LINE]).signature == "cause_a"


def test_a_higher_confidence_wins_without_unknown(tmp_path: Path) -> None:
    sigs = _two(tmp_path, ("restart", 0.6), ("none", 0.7))
    assert _verdict(sigs, [LINE]).signature == "cause_b"


def test_pick_compares_rank_and_family_only() -> None:
    a = Candidate(State.HUNG, "a", signature="a", rank=(5, 0.5), family="restart")
    b = Candidate(State.HUNG, "b", signature="b", rank=(5, 0.5), family="none")
    c = Candidate(State.HUNG, "c", signature="c", rank=(6, 0.1), family="none")
    assert pick([a, b]).signature == "unknown"
    assert pick([a, b, c]) is c
    assert pick([a]) is a


def test_the_stages_run_in_the_judges_order() -> None:
    names = [s.__name__ for s in stages.STAGES]
    assert names == ["signatures", "stopped", "stuck", "soft", "benign"]


def test_states_are_one_enum_that_reads_as_before() -> None:
    assert STATES == (
        "starting",
        "loading",
        "compiling",
        "idle",
        "serving",
        "crawling",
        "stalled",
        "hung",
        "dead",
    )
    assert json.dumps([State.HUNG]) == '["hung"]' and f"{State.HUNG}" == str(State.HUNG) == "hung"
    with pytest.raises(ValueError):
        State("wedged")


def test_a_verdict_states_is_the_enum_and_serialises_as_text(tmp_path: Path) -> None:
    sigs = load_signatures()
    tl = Timeline(procs=procs())
    tl.ticks(3)
    v = final(tl.obs, sigs)
    assert isinstance(v.state, State)
    assert json.loads(json.dumps(to_dict(v)))["state"] == v.state.value
