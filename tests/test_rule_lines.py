"""A log rule's line answers (literal prefilter, then remembered) are its regex's own."""

from __future__ import annotations

import re
from pathlib import Path

from tests.shipped import KNOWLEDGE
from watchdog.core.knowledge import sigmodel
from watchdog.core.knowledge.sigmodel import Rule

DATA = Path(__file__).parent / "data"
LOGS = sorted([*DATA.glob("*.log"), *(DATA / "logs").glob("*.log")])


def _lines() -> list[str]:
    out: list[str] = []
    for path in LOGS:
        out += path.read_text(errors="replace").splitlines()
    return out


def test_every_shipped_log_rule_answers_as_its_regex_on_the_real_logs() -> None:
    lines = _lines()
    rules = [r for s in KNOWLEDGE.signatures.signatures for r in s.evidence if r.kind == "log"]
    assert len(rules) > 10 and len(lines) > 500
    matched = 0
    for rule in rules:
        assert rule.pattern is not None
        want = [bool(rule.pattern.search(line)) for line in lines]
        # Twice: the second pass answers from memory (and past LINE_MEMO, afresh).
        assert [rule.matches_line(line) for line in lines] == want, rule.label
        assert [rule.matches_line(line) for line in lines] == want, rule.label
        matched += sum(want)
    assert matched > 50  # the rules do match lines of these logs: not a vacuous comparison


def test_a_rule_without_literals_searches_every_line_and_the_memory_is_bounded(
    monkeypatch: object,
) -> None:
    rule = Rule(kind="log", pattern=re.compile(r"nccl.*timeout", re.IGNORECASE))
    assert rule.literals == ()  # case-insensitive: no literal can stand in for it
    assert rule.matches_line("NCCL watchdog Timeout after 600000 ms")
    assert not rule.matches_line("nccl ok")
    literal = Rule(kind="log", pattern=re.compile(r"attempt \d+ failed"))
    assert literal.literals and all("attempt " in k or " failed" in k for k in literal.literals)
    for i in range(sigmodel.LINE_MEMO + 10):
        assert literal.matches_line(f"attempt {i} failed") is True
        assert literal.matches_line(f"attempt {i} worked") is False
    assert len(literal.line_answers) <= sigmodel.LINE_MEMO
