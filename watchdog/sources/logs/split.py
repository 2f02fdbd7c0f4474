"""Bytes from a pipe or file into log records: line splitting and tqdm-glued records.

Pure: no I/O. A vLLM log is not line-clean: tqdm redraws with a bare `\r`, a frozen bar is
never terminated, and the next record lands on the bar's physical line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_TRUNCATED = " …[truncated]"
_EOL = re.compile(rb"\r\n|\r|\n")


# A tqdm redraw has no newline after it, so the next log record lands on the same physical line
# ("...| 0/768 [00:00<?, ...]2026-11-30 08:08:29,185 - INFO - ... flashinfer.jit: Fetching").
_GLUED = re.compile(
    r"(?<=\])[ \t]*(?=\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
    r"|\([A-Za-z][\w:.-]* pid=\d+\) "
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d{2}-\d{2} \d{2}:)"
)


# Where _GLUED can split, loosened to a pattern that starts with a literal (`re` then scans for
# the `]` quickly instead of trying a lookbehind at every position): most lines with a `]`
# (`[loggers.py:123] `) have no record glued on.
_MAY_GLUE = re.compile(r"\][ \t]*(?:\d|\(|INFO |WARNING |ERROR |DEBUG |CRITICAL )")


def split_records(line: str) -> list[str]:
    """One physical line as the log records glued into it (usually just the line)."""
    if "]" not in line or _MAY_GLUE.search(line) is None:
        return [line]
    return [part for part in _GLUED.split(line) if part.strip()] or [line]


class LineSplitter:
    """Bytes from a pipe or file in, complete text lines out, with bounded memory.

    Splits on `\n`, `\r\n` and bare `\r` (tqdm redraws a bar with `\r`), drops NUL bytes
    and empty lines, decodes UTF-8 with replacement, and keeps only the first
    `max_line_bytes` of an over-long line (marked with a trailing " …[truncated]").
    """

    def __init__(self, max_line_bytes: int = 65536) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be at least 1, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._truncated = False  # the buffered line overflowed; discard until the next EOL
        self._after_cr = False  # the last chunk ended in \r, so a leading \n is its pair

    def feed(self, data: bytes) -> list[str]:
        """The lines completed by `data`; a trailing partial line is held back."""
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        if not data:
            return []
        self._after_cr = data.endswith(b"\r")
        parts = _EOL.split(data.replace(b"\x00", b""))
        lines: list[str] = []
        for part in parts[:-1]:
            self._append(part)
            lines.extend(self._take())
        self._append(parts[-1])
        return lines

    def peek(self) -> str:
        """The held partial line without taking it: a frozen tqdm bar is never terminated,
        because tqdm writes `\r` before each redraw, not after it."""
        return bytes(self._buf).decode("utf-8", errors="replace")

    def flush(self) -> str:
        """The held partial line (at EOF or rotation); "" when there is none."""
        taken = self._take()
        return taken[0] if taken else ""

    def _append(self, part: bytes) -> None:
        room = self.max_line_bytes - len(self._buf)
        if len(part) > room:
            part = part[: max(room, 0)]
            self._truncated = True
        self._buf += part

    def _take(self) -> list[str]:
        text = self._buf.decode("utf-8", errors="replace")
        if self._truncated:
            text += _TRUNCATED
        self._buf = bytearray()
        self._truncated = False
        return [text] if text else []


class Block:
    """Complete lines as bytes, as one block: NULs removed, every line ended by an EOL except
    at EOF. Lines are decoded one at a time, only those a caller asks for."""

    __slots__ = ("data", "first_truncated", "max_line_bytes")

    def __init__(self, data: bytes, *, first_truncated: bool = False, max_line_bytes: int = 65536):
        self.data = data
        self.first_truncated = first_truncated  # the first line overflowed in an earlier feed
        self.max_line_bytes = max_line_bytes

    def text(self, start: int, end: int) -> str:
        """The line data[start:end] as LineSplitter would have produced it."""
        raw = self.data[start:end]
        truncated = start == 0 and self.first_truncated
        if len(raw) > self.max_line_bytes:
            raw, truncated = raw[: self.max_line_bytes], True
        text = raw.decode("utf-8", errors="replace")
        return text + _TRUNCATED if truncated else text

    def lines(self) -> list[str]:
        """Every non-empty line (the slow path, for readers' list-of-lines API)."""
        return [self.text(s, e) for s, e in line_spans(self.data)]

    def last_lines(self) -> Iterator[str]:
        """The lines from the last backwards, decoded lazily (the log tail needs only a few)."""
        data, end = self.data, len(self.data)
        while end > 0:
            while end > 0 and data[end - 1] in b"\r\n":
                end -= 1
            if end == 0:
                return
            nl = data.rfind(b"\n", 0, end)
            start = max(nl, data.rfind(b"\r", nl + 1, end)) + 1
            yield self.text(start, end)
            end = start

    def count(self) -> int:
        """How many lines LineSplitter would have produced from this block."""
        return count_lines(self.data)


def line_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every non-empty line of `data`, EOLs excluded."""
    out: list[tuple[int, int]] = []
    start = 0
    for m in _EOL.finditer(data):
        if m.start() > start:
            out.append((start, m.start()))
        start = m.end()
    if start < len(data):
        out.append((start, len(data)))
    return out


def count_eols(data: bytes) -> int:
    """Line ends (`\n`, `\r\n`, `\r`) in `data`: a cheap line count, blank lines included."""
    if b"\r" not in data:
        return data.count(b"\n")
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def count_lines(data: bytes) -> int:
    """Non-empty lines in `data` (EOLs `\\n`, `\\r\\n`, `\\r`) without splitting it.

    EOL tokens minus empty lines; an empty line is a token right after another token (the
    byte pairs `\\n\\n`, `\\n\\r`, `\\r\\r`, overlapping, rare in logs) or at the very start.
    """
    if not data:
        return 0
    has_cr = b"\r" in data
    tokens = count_eols(data)
    empty = 1 if data[0] in b"\r\n" else 0
    for pair in (b"\n\n", b"\n\r", b"\r\r") if has_cr else (b"\n\n",):
        i = data.find(pair)
        while i >= 0:
            empty += 1
            i = data.find(pair, i + 1)
    partial = 0 if data[-1] in b"\r\n" else 1
    return tokens - empty + partial


class BlockSplitter:
    """LineSplitter's contract (same lines, same truncation) but whole blocks out, not lines:
    a reader hands the block to the prefilter, which decodes only the lines that matter."""

    def __init__(self, max_line_bytes: int = 65536) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be at least 1, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._truncated = False
        self._after_cr = False

    def feed(self, data: bytes) -> Block | None:
        """The complete lines `data` ends (with any held partial before them), or None."""
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        if not data:
            return None
        self._after_cr = data.endswith(b"\r")
        if b"\x00" in data:
            data = data.replace(b"\x00", b"")
        nl = data.rfind(b"\n")
        cut = max(nl, data.rfind(b"\r", nl + 1)) + 1
        if cut == 0:
            self._append(data)
            return None
        head = bytes(self._buf) + data[:cut] if self._buf else data[:cut]
        block = Block(head, first_truncated=self._truncated, max_line_bytes=self.max_line_bytes)
        self._buf, self._truncated = bytearray(), False
        self._append(data[cut:])
        return block

    def peek(self) -> str:
        """The held partial line (see LineSplitter.peek)."""
        return bytes(self._buf).decode("utf-8", errors="replace")

    def flush(self) -> Block | None:
        """The held partial line as a block (at EOF or rotation); None when there is none."""
        if not self._buf:
            return None
        block = Block(
            bytes(self._buf), first_truncated=self._truncated, max_line_bytes=self.max_line_bytes
        )
        self._buf, self._truncated = bytearray(), False
        return block

    def _append(self, part: bytes) -> None:
        room = self.max_line_bytes - len(self._buf)
        if len(part) > room:
            part = part[: max(room, 0)]
            self._truncated = True
        self._buf += part
