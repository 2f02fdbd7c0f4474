# ruff: noqa: E501  (log lines are quoted whole, as the engines print them)
"""The engines' death vocabulary held to its readings, both ways.

tests/data/deaths.toml lists each line vLLM, SGLang, TensorRT-LLM and Dynamo log on the path to
a process or request loop dying, read from their source and cited there. Here:
- each `death` line, written after a healthy line of its engine, is read with its signature or
  generic class, and the root cause names the loop it came from where the loop table knows it;
- each `quiet` line (printed on a clean shutdown too) and `left_out` line reads as nothing;
- the live watch reads the same lines the same way;
- each alternative of the death patterns (engine_dead, engine_worker_failed,
  sglang_scheduler_crashed, the `crashed` class's engine rules, the root-cause loop table) is
  matched by some line of the table: a pattern nobody can show a source line for fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomllib

from tests.test_rootcause_deaths import live, replay
from watchdog.core.judge.loopdeath import LOOP, loop_name
from watchdog.core.knowledge.signatures import load_signatures

TABLE: dict[str, Any] = tomllib.loads(
    (Path(__file__).parent / "data" / "deaths.toml").read_text(encoding="utf-8")
)
DEATHS: list[dict[str, str]] = TABLE["death"]
QUIET: list[dict[str, str]] = TABLE["quiet"] + TABLE["left_out"]
SIGS = load_signatures()

# The signatures and the `crashed` class rules whose patterns are the death vocabulary.
DEATH_SIGNATURES = ("engine_dead", "engine_worker_failed", "sglang_scheduler_crashed")
DEATH_RULES = (
    "the engine's own fatal line",
    "an engine's request loop died",
    "a Dynamo worker's handler or engine loop failed with an exception (the worker exits)",
)


def case(entry: dict[str, str]) -> str:
    """The entry's line as the engine logs it, after a healthy line of the same engine."""
    return TABLE["before"][entry["engine"]] + "\n" + entry["line"] + "\n"


def _id(entry: dict[str, str]) -> str:
    return entry["line"][:70]


@pytest.mark.parametrize("entry", DEATHS, ids=map(_id, DEATHS))
def test_each_death_line_reads_as_its_signature_or_class(entry: dict[str, str]) -> None:
    names, cls, _, cause = replay(case(entry))
    if "signature" in entry:
        assert names and names[0] == entry["signature"], f"named {names}, class {cls}"
    else:
        assert (names, cls) == ((), entry["class"])
    loop = loop_name(entry["line"])
    if loop is not None:  # the root cause names the loop the line comes from
        assert cause is not None and loop in cause.summary, cause


@pytest.mark.parametrize("entry", QUIET, ids=map(_id, QUIET))
def test_a_line_printed_on_a_clean_shutdown_too_reads_as_nothing(entry: dict[str, str]) -> None:
    names, cls, _, cause = replay(case(entry))
    assert (names, cls, cause) == ((), None, None)


# The live watch reads the same lines: a death leaves the server dead or hung (a crash signature
# while the process is still alive), a clean-shutdown line leaves it as it was.
FAILED = ("dead", "hung")


@pytest.mark.parametrize("entry", DEATHS, ids=map(_id, DEATHS))
def test_the_live_watch_reads_each_death_line_as_a_failure(entry: dict[str, str]) -> None:
    assert live(case(entry)).split("|")[0] in FAILED


@pytest.mark.parametrize("entry", QUIET, ids=map(_id, QUIET))
def test_the_live_watch_leaves_a_clean_shutdown_line_alone(entry: dict[str, str]) -> None:
    assert live(case(entry)).split("|")[0] not in FAILED


def test_every_entry_cites_its_source_and_versions() -> None:
    for e in DEATHS + QUIET:
        assert e["engine"] in TABLE["before"], e
        assert re.search(r"\w+/[\w.-]+ |CPython ", e["source"]), e["source"]
    for e in DEATHS:
        assert e.get("versions") and ("signature" in e) != ("class" in e), e
    for e in TABLE["left_out"]:
        assert e.get("why"), e


def alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regex (one group around the whole pattern unwrapped)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    if len(parts) == 1 and pattern.startswith("(") and pattern.endswith(")"):
        inner = alternatives(pattern[1:-1])
        if len(inner) > 1:
            return inner
    return parts


def test_alternatives_split_at_the_top_level_only() -> None:
    assert alternatives(r"(a|b\|c|(?:d|e)f|[|]g)") == ["a", r"b\|c", "(?:d|e)f", "[|]g"]
    assert alternatives(r"(?:a|b) c") == [r"(?:a|b) c"]


def vocabulary() -> list[tuple[str, str]]:
    """(where, alternative) for every alternative of the death patterns."""
    out = []
    for sig in SIGS.signatures:
        if sig.id in DEATH_SIGNATURES:
            for rule in sig.evidence:
                if (
                    rule.kind == "log"
                    and rule.pattern is not None
                    and "File" not in rule.pattern.pattern
                ):
                    out += [(sig.id, a) for a in alternatives(rule.pattern.pattern)]
    crashed = next(c for c in SIGS.generic if c.id == "crashed")
    for grule in crashed.rules:
        if grule.label in DEATH_RULES and grule.pattern is not None:
            out += [(grule.label, a) for a in alternatives(grule.pattern.pattern)]
    out += [("rootcause loop table", a) for pat, _ in LOOP for a in alternatives(pat.pattern)]
    return out


def test_the_death_patterns_are_all_shipped_and_found() -> None:
    found = {w for w, _ in vocabulary()}
    assert found == {*DEATH_SIGNATURES, *DEATH_RULES, "rootcause loop table"}


# Alternatives of the `crashed` class's fatal-line rule that stand for a family rather than one
# line (`RuntimeError: Engine` prefixes several start-up errors) or come from outside the
# engines swept here; each with the source its rule cites.
OUTSIDE_THE_SWEEP = {
    # Triton's model table (triton-inference-server/core src/status.cc Status::CodeString)
    "UNAVAILABLE: (?:Internal|Not found|Invalid argument|Unavailable|Unknown|Unsupported"
    "|Already exists|Cancelled): ",
    "RuntimeError: Engine",  # vLLM's start-up errors, each read by a line of its own here
    "Exception in thread (?P<n>[^\\s:]+(?: \\(\\w+\\))?):",  # CPython threading: left_out
}


def test_the_alternatives_outside_the_sweep_are_still_shipped() -> None:
    assert {a for _, a in vocabulary()} >= OUTSIDE_THE_SWEEP


SWEPT = [(w, a) for w, a in vocabulary() if a not in OUTSIDE_THE_SWEEP]


@pytest.mark.parametrize("where, alt", SWEPT, ids=lambda x: str(x)[:60])
def test_every_alternative_of_the_death_patterns_has_a_source_line(where: str, alt: str) -> None:
    rx = re.compile(alt)
    lines = [e["line"] for e in DEATHS + TABLE["left_out"]]
    assert any(rx.search(x) for x in lines), f"{where}: no line in deaths.toml for {alt!r}"
