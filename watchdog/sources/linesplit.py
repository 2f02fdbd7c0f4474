"""Bytes from a pipe or file into log records: line splitting and tqdm-glued records.

Pure: no I/O. A vLLM log is not line-clean: tqdm redraws with a bare `\r`, a frozen bar is
never terminated, and the next record lands on the bar's physical line.
"""

from __future__ import annotations

import re

_TRUNCATED = " …[truncated]"
_EOL = re.compile(rb"\r\n|\r|\n")


# A tqdm redraw has no newline after it, so the next log record lands on the same physical line
# ("...| 0/768 [00:00<?, ...]2026-11-30 08:08:29,185 - INFO - ... flashinfer.jit: Fetching").
_GLUED = re.compile(
    r"(?<=\])[ \t]*(?=\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
    r"|\([A-Za-z][\w:.-]* pid=\d+\) "
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d{2}-\d{2} \d{2}:)"
)


def split_records(line: str) -> list[str]:
    """One physical line as the log records glued into it (usually just the line)."""
    if "]" not in line:
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
