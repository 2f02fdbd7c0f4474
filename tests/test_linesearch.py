"""LineIndex.matching finds exactly the lines a loop of `pattern.search` finds."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from watchdog.core.judge.linesearch import LineIndex
from watchdog.core.knowledge.signatures import load_signatures

DATA = Path(__file__).parent / "data" / "logs"
SIGS = load_signatures()
RULES = [r.pattern for s in SIGS.signatures for r in s.evidence + s.unless if r.pattern]
RULES += [r.pattern for c in SIGS.generic for r in c.rules if r.pattern]
TRICKY = [
    r"^INFO",  # anchors mean line start and end, not text start and end
    r"OK$",
    r"\s+$",  # \s can run across the newline that joins two lines
    r"(?i)enginedead",  # no literal: the joined search path
    r"\d+ reqs",
    r"^(?!.*Error).*timed out",  # negative lookahead: line by line
    r"(?>\w+)\s",  # atomic group: line by line
    r"a[^x]*b",  # [^x] matches the joining newline
    r"",  # matches every line
]


def loop(pattern: re.Pattern[str], lines: list[str]) -> list[str]:
    return [line for line in lines if pattern.search(line)]


def sample_lines() -> list[str]:
    lines = [x for p in sorted(DATA.glob("*.log")) for x in p.read_text().splitlines()]
    return lines + ["", "a", "b", "a\tb", "  ", "INFO x OK", "x timed out", "Error timed out"]


@pytest.mark.parametrize("seed", [1, 2])
def test_matching_is_a_loop_over_the_lines(seed: int) -> None:
    lines = sample_lines()
    random.Random(seed).shuffle(lines)
    index = LineIndex(lines)
    patterns = RULES + [re.compile(p) for p in TRICKY]
    assert any(loop(p, lines) for p in RULES)  # the samples match some rules
    for pattern in patterns:
        assert index.matching(pattern) == loop(pattern, lines), pattern.pattern


def test_lines_with_a_newline_and_empty_input() -> None:
    lines = ["first EngineDeadError", "two\nlines EngineDeadError", "x"]
    pattern = re.compile(r"lines EngineDeadError$")
    assert LineIndex(lines).matching(pattern) == loop(pattern, lines)
    assert LineIndex([]).matching(re.compile("x")) == []
