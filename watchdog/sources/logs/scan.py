"""Blocks of log bytes into LogEvents: prefilter first, then parse only the lines that matter.

The reference path (`parse_lines`: every line split, decoded, cleaned and parsed) and the
block path (`BlockScanner.scan`) keep the same events; tests/test_logscan.py runs both over the
same input and compares them.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from watchdog.core.model import LogEvent
from watchdog.sources.logs.parse import LogPatterns, clean_line, literal_keys, parse_line
from watchdog.sources.logs.prefilter import Prefilter, required_literals
from watchdog.sources.logs.split import Block, split_records

if TYPE_CHECKING:
    from watchdog.sources.logs.stackdumps import StackScanner


def prefilter_for(
    keep: re.Pattern[str] | None,
    extra: Iterable[str] = (),
    *,
    hyperscan: bool = True,
    patterns: LogPatterns | None = None,
    in_child: bool = False,
) -> Prefilter:
    """The prefilter for the parser's keys (of `patterns`, else the engine-neutral ones), the keep
    pattern's literals and `extra` keys (`in_child`: see Prefilter)."""
    keep_keys = required_literals(keep)
    if keep_keys is None:  # a keep rule without a literal: every line must be parsed
        return Prefilter(None)
    keys = (*literal_keys(patterns), *keep_keys, *extra)
    return Prefilter(keys, hyperscan=hyperscan, in_child=in_child)


def parse_text(
    raw: str, source: str, keep: re.Pattern[str] | None, patterns: LogPatterns | None = None
) -> list[LogEvent]:
    """The events of one decoded physical line (clean, split glued records, parse each)."""
    line = clean_line(raw)
    if not line:
        return []
    out = []
    for record in split_records(line):
        event = parse_line(record, source=source, keep=keep, patterns=patterns)
        if event is not None:
            out.append(event)
    return out


def parse_lines(
    lines: Iterable[str],
    source: str,
    keep: re.Pattern[str] | None,
    patterns: LogPatterns | None = None,
) -> list[LogEvent]:
    """The reference path: every line parsed, none skipped."""
    return [ev for raw in lines for ev in parse_text(raw, source, keep, patterns)]


class BlockScanner:
    """Parses the candidate lines of each block, within a deadline the caller sets."""

    def __init__(
        self,
        keep: re.Pattern[str] | None,
        *,
        prefilter: Prefilter | None = None,
        patterns: LogPatterns | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`patterns`: the engine log formats to read (None: no engine's, see parse_line)."""
        self.keep = keep
        self.patterns = patterns
        if prefilter is None:
            prefilter = prefilter_for(keep, patterns=patterns)
        self.prefilter = prefilter
        self._clock = clock

    def scan(
        self, block: Block, source: str, deadline: float = float("inf")
    ) -> tuple[list[LogEvent], Block | None]:
        """(events, the candidate lines left when the deadline passed, as a block to scan on
        the next tick; None when none are left). At least one line is parsed per call, and the
        clock is read after every line: one 64 KB line can cost milliseconds of regex work."""
        events: list[LogEvent] = []
        spans = self.prefilter.spans(block.data)
        clock, keep, pats = self._clock, self.keep, self.patterns
        for i, (start, end) in enumerate(spans):
            events += parse_text(block.text(start, end), source, keep, pats)
            if clock() > deadline and i + 1 < len(spans):
                return events, carry(block, spans[i + 1 :])
        return events, None


def carry(block: Block, spans: Sequence[tuple[int, int]], rest_from: int | None = None) -> Block:
    """A block of the lines at `spans` (and, from `rest_from` on, every line): what a scan cut
    short still has to look at. Lines no prefilter key is in cannot matter and are not kept."""
    data = block.data
    end = rest_from if rest_from is not None else len(data)
    parts = [data[s:e] for s, e in spans if s < end]
    out = b"\n".join(parts) + b"\n" if parts else b""
    if rest_from is not None:
        out += data[rest_from:]
    first = block.first_truncated and bool(spans) and spans[0][0] == 0
    first = first or (block.first_truncated and not parts and rest_from == 0)
    return Block(out, first_truncated=first, max_line_bytes=block.max_line_bytes)


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


class StackBlocks:
    """The block path with stack dumps in the log (logstacks.StackScanner) kept exact.

    While no dump is open, a line without a dump-start key changes nothing in the stack
    scanner, so only parse candidates are visited; from a line with a start key until the dump
    closes, every line is fed to the stack scanner, as the line path does. Events come out in
    line order: a line's stack events, then its parsed events.
    """

    def __init__(
        self,
        parser: BlockScanner,
        *,
        clock: Callable[[], float] = time.monotonic,
        in_child: bool = False,
    ) -> None:
        from watchdog.sources.logs.stackdumps import start_keys

        self.parser = parser
        keys = start_keys()
        self.starts = Prefilter(keys, in_child=in_child) if keys is not None else Prefilter(None)
        self._clock = clock
        self._odd = True  # the block being scanned has an escape or a non-ASCII byte

    def scan(
        self, block: Block, source: str, stacks: StackScanner, deadline: float = float("inf")
    ) -> tuple[list[LogEvent], Block | None]:
        """(events, what is left when the deadline passed, as a block for the next tick).

        The clock is read after every line handled, and at least one is handled per call."""
        data = block.data
        self._odd = b"\x1b" in data or not data.isascii()  # once per block, not per line
        cands = self.parser.prefilter.spans(data)
        starts = [s for s, _e in self.starts.spans(data)]
        events: list[LogEvent] = []
        ci = si = 0
        pos, end = 0, len(data)
        keep, clock, pats = self.parser.keep, self._clock, self.parser.patterns

        def rest(at: int) -> Block | None:
            """Unhandled from `at`: with a dump open every line; else the candidates before
            the next dump start, then everything from it."""
            if at >= end:
                return None
            if stacks.has_open:
                return carry(block, (), at)
            nxt = next((s for s in starts if s >= at), None)
            left = [c for c in cands[ci:] if c[0] >= at]
            if nxt is None and not left:
                return None
            return carry(block, left, nxt)

        while pos < end:
            if not stacks.has_open:
                while si < len(starts) and starts[si] < pos:
                    si += 1
                next_start = starts[si] if si < len(starts) else end
                while ci < len(cands) and cands[ci][0] < next_start:
                    if cands[ci][0] >= pos:
                        events += parse_text(block.text(*cands[ci]), source, keep, pats)
                        ci += 1
                        if clock() > deadline:
                            return events, rest(cands[ci - 1][1])
                    else:
                        ci += 1
                pos = next_start
                if pos >= end:
                    break
            start, stop = _line_at(data, pos)
            pos = _next_line(data, stop)
            if stop == start:
                continue
            while si < len(starts) and starts[si] < start:
                si += 1
            may_start = si < len(starts) and starts[si] == start
            line = self._feed(block, start, stop, stacks, source, may_start, events)
            while ci < len(cands) and cands[ci][0] < start:
                ci += 1
            if ci < len(cands) and cands[ci][0] == start:
                line = clean_line(block.text(start, stop)) if line is None else line
                events += parse_text(line, source, keep, pats)
                ci += 1
            if clock() > deadline:
                return events, rest(pos)
        return events, None

    def _feed(
        self,
        block: Block,
        start: int,
        stop: int,
        stacks: StackScanner,
        source: str,
        may_start: bool,
        events: list[LogEvent],
    ) -> str | None:
        """One line to the stack scanner while a dump is open; its cleaned text, or None when
        it was only counted (no start key, no open dump's stream: a busy server's access
        lines between a cut traceback and the end of its span are neither decoded nor split)."""
        members = stream_members(stacks.open_streams(), self._odd)
        fed = may_start or members is None
        for member in () if fed else members:  # type: ignore[union-attr]
            if member.search(block.data, start, stop) is not None:
                fed = True
                break
        if fed:
            line = clean_line(block.text(start, stop))
            events += stacks.feed(line, source, may_start=may_start)
            return line
        events += stacks.advance(source)
        return None


_ODD_BYTE = re.compile(rb"[\x1b\x80-\xff]")


@functools.lru_cache(maxsize=64)
def stream_members(
    streams: tuple[str, ...], odd: bool = True
) -> tuple[re.Pattern[bytes], ...] | None:
    """Patterns one of which every line of one of these dump streams matches (strip_prefixes
    names a stream by its prefix text); None when any line may be one (a dump of lines without
    a prefix is open). A line with an escape or a non-ASCII byte always counts: cleaning can
    join the escape's neighbours, and `\\d` matches Unicode digits that int() reads. Each
    pattern starts with a literal or is one class, so `re` scans for it quickly. `odd=False`:
    the block holds no such byte, so that class is not searched line by line."""
    parts = [_ODD_BYTE] if odd else []
    for key in streams:
        if not key:
            return None
        proc, sep, pid = key.partition(" pid=")
        if sep:  # vLLM `(Proc pid=N) `: N as written may have leading zeros
            text = re.escape(f"({proc} pid=".encode()) + rb"0*" + pid.encode() + rb"\)"
        else:  # SGLang's `[... TP0]` ranks, torch's `[rank0]`: the key is in the line
            text = re.escape(key.encode())
        parts.append(re.compile(text))
    return tuple(parts)


def _line_at(data: bytes, pos: int) -> tuple[int, int]:
    """(start, end) of the line starting at `pos` (`end` excludes its EOL)."""
    nl = data.find(b"\n", pos)
    limit = nl if nl >= 0 else len(data)
    cr = data.find(b"\r", pos, limit)
    return pos, cr if cr >= 0 else limit


def _next_line(data: bytes, stop: int) -> int:
    """Where the next line starts after a line ending at `stop` (past `\\n`, `\\r\\n`, `\\r`)."""
    if data[stop : stop + 2] == b"\r\n":
        return stop + 2
    return stop + 1
