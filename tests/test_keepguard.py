"""The guarded keep (watchdog/sources/logs/keepguard.py) answers exactly as the keep pattern does,
on every line of the real upstream logs, on hostile long lines and on fuzzed text."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzkit import FUZZ, growth
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.state.openops import keep_with_ops
from watchdog.sources.logs.keepguard import keeps, top_level_alternatives

KEEP = keep_with_ops(load_signatures([]).log_keep_pattern(), load_ops())
assert KEEP is not None
LOGS = Path(__file__).parent / "data" / "logs"


def test_every_real_log_line_gets_the_same_answer() -> None:
    lines = [
        line
        for path in sorted(LOGS.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]
    assert len(lines) > 300
    kept = 0
    for line in lines:
        want = KEEP.search(line) is not None
        assert keeps(KEEP, line) == want, line
        kept += want
    assert kept > 20  # the logs do hold signature lines


PIECES = st.sampled_from(
    ["EngineDeadError", "ProcessGroupNCCL", " Timeout", "timeout", "NCCL WARN", "flashinfer.jit: ",
     "Fetching ", " from ", "Init START", "comm 0x1 rank 0 nranks 2 ", "SIGQUIT received. ",
     "one child failed", "Hang detected after 3 seconds.", "x", " ", "\u00e9", "[", "("]
)  # fmt: skip


@FUZZ
@given(st.lists(PIECES | st.text(max_size=8), max_size=30).map("".join))
def test_fuzzed_lines_get_the_same_answer(line: str) -> None:
    assert keeps(KEEP, line) == (KEEP.search(line) is not None)


def test_the_split_keeps_groups_classes_and_escapes_whole() -> None:
    assert top_level_alternatives(r"a|(b|c)|[|]|\||d") == ["a", "(b|c)", "[|]", r"\|", "d"]
    assert top_level_alternatives(r"[]|]x|y") == ["[]|]x", "y"]
    assert top_level_alternatives("(a|b") is None
    assert keeps(re.compile(r"(?:x\d)|(?:y+z)"), "..yyz") and not keeps(re.compile("a|b"), "c")


def test_a_long_line_costs_its_literal_checks_not_every_alternative() -> None:
    def make(n: int) -> str:
        return "[2026-12-01 10:00:00 TP0] Received request: prompt: " + "word " * n

    assert growth(make, lambda line: keeps(KEEP, line), 2000) < 24  # type: ignore[arg-type]
