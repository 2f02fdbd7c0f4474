"""Blocks of log bytes into LogEvents: prefilter first, then parse only the lines that matter.

The reference path (`parse_lines`: every line split, decoded, cleaned and parsed) and the
block path (`BlockScanner.scan`) keep the same events; tests/test_logscan.py runs both over the
same input and compares them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from watchdog.core.model import LogEvent
from watchdog.sources.linesplit import Block, split_records
from watchdog.sources.logparse import clean_line, literal_keys, parse_line
from watchdog.sources.prefilter import Prefilter, required_literals


def prefilter_for(
    keep: re.Pattern[str] | None, extra: Iterable[str] = (), *, hyperscan: bool = True
) -> Prefilter:
    """The prefilter for the parser's keys, the keep pattern's literals and `extra` keys."""
    keep_keys = required_literals(keep)
    if keep_keys is None:  # a keep rule without a literal: every line must be parsed
        return Prefilter(None)
    return Prefilter((*literal_keys(), *keep_keys, *extra), hyperscan=hyperscan)


def parse_text(raw: str, source: str, keep: re.Pattern[str] | None) -> list[LogEvent]:
    """The events of one decoded physical line (clean, split glued records, parse each)."""
    line = clean_line(raw)
    if not line:
        return []
    out = []
    for record in split_records(line):
        event = parse_line(record, source=source, keep=keep)
        if event is not None:
            out.append(event)
    return out


def parse_lines(lines: Iterable[str], source: str, keep: re.Pattern[str] | None) -> list[LogEvent]:
    """The reference path: every line parsed, none skipped."""
    return [ev for raw in lines for ev in parse_text(raw, source, keep)]


class BlockScanner:
    """Parses the candidate lines of each block, within a deadline the caller sets."""

    def __init__(
        self,
        keep: re.Pattern[str] | None,
        *,
        prefilter: Prefilter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep = keep
        self.prefilter = prefilter if prefilter is not None else prefilter_for(keep)
        self._clock = clock

    def scan(
        self, block: Block, source: str, deadline: float = float("inf")
    ) -> tuple[list[LogEvent], int]:
        """(events, candidate lines left unparsed because the deadline passed)."""
        events: list[LogEvent] = []
        spans = self.prefilter.spans(block.data)
        clock, keep = self._clock, self.keep
        for i, (start, end) in enumerate(spans):
            if i % 64 == 63 and clock() > deadline:
                return events, len(spans) - i
            events += parse_text(block.text(start, end), source, keep)
        return events, 0


def tail_lines(block: Block, n: int, width: int) -> list[str]:
    """The last `n` non-empty cleaned lines of a block (cut to `width`), oldest first."""
    out: list[str] = []
    if n <= 0:
        return out
    for text in block.last_lines():
        line = clean_line(text)
        if line:
            out.append(line[:width])
            if len(out) >= n:
                break
    out.reverse()
    return out
