"""A pipe or stdin (a supervised child's output, journalctl) read on a thread, bounded.

The thread only cuts the bytes at the last line end; the log source prefilters the blocks.
"""

from __future__ import annotations

import collections
import threading
from typing import BinaryIO

from watchdog.sources.logs.split import Block, BlockSplitter, line_spans

_CHUNK = 65536


class StreamReader:
    """Reads a pipe or stdin on a daemon thread into a bounded queue of line blocks.

    The thread only cuts the bytes at the last line end (no per-line work, so a flood costs
    it little). When the consumer falls behind by more than `max_lines` lines or `max_chars`
    bytes, the oldest lines are dropped and counted in `dropped`. `tee` receives every byte
    read (supervise mode echoes the child's output through to the watchdog's stdout/stderr).
    """

    def __init__(
        self,
        stream: BinaryIO,
        name: str,
        *,
        tee: BinaryIO | None = None,
        max_lines: int = 100_000,
        max_chars: int = 16 << 20,
        max_line_bytes: int = 65536,
    ) -> None:
        self.name = name
        self.error: str | None = None
        self.eof = False
        self.dropped = 0
        self._stream = stream
        self._tee = tee
        self._blocks: collections.deque[tuple[Block, int]] = collections.deque()
        self._max_lines, self._max_chars = max_lines, max_chars
        self._lines = self._bytes = 0
        self._lock = threading.Lock()
        self._splitter = BlockSplitter(max_line_bytes)
        self._thread = threading.Thread(target=self._run, name=f"log-reader-{name}", daemon=True)
        self._thread.start()

    def partials(self) -> list[str]:
        """The unterminated last line, if any (see LineSplitter.peek)."""
        held = self._splitter.peek()
        return [held] if held else []

    def read(self) -> list[str]:
        """All lines queued since the last call."""
        return [line for block in self.read_blocks() for line in block.lines()]

    def read_blocks(self) -> list[Block]:
        """All line blocks queued since the last call."""
        with self._lock:
            blocks = [block for block, _n in self._blocks]
            self._blocks.clear()
            self._lines = self._bytes = 0
        return blocks

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the stream hits EOF (for tests and shutdown); True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop echoing; the thread ends by itself at EOF (closing a pipe mid-read is unsafe)."""
        self._tee = None

    def _run(self) -> None:
        read = getattr(self._stream, "read1", self._stream.read)
        try:
            while True:
                data = read(_CHUNK)
                if not data:
                    break
                self._echo(data)
                self._push(self._splitter.feed(data))
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed under us
            self.error = f"reading {self.name} failed: {exc}"
        self._push(self._splitter.flush())
        self.eof = True

    def _push(self, block: Block | None) -> None:
        if block is None:
            return
        n = block.count()
        with self._lock:
            self._blocks.append((block, n))
            self._lines += n
            self._bytes += len(block.data)
            while self._blocks and (self._lines > self._max_lines or self._bytes > self._max_chars):
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Drop the oldest lines until the queue fits (whole blocks, then part of one)."""
        block, n = self._blocks.popleft()
        self._lines -= n
        self._bytes -= len(block.data)
        over_lines = self._lines - self._max_lines  # still over without this block?
        over_bytes = self._bytes - self._max_chars
        if over_lines >= 0 or over_bytes >= 0:
            self.dropped += n
            return
        spans = line_spans(block.data)
        room = -over_lines  # keep this many of the block's newest lines, bytes permitting
        keep_from = len(spans) - min(room, len(spans))
        while keep_from < len(spans) and len(block.data) - spans[keep_from][0] > -over_bytes:
            keep_from += 1
        self.dropped += keep_from
        if keep_from < len(spans):
            rest = Block(block.data[spans[keep_from][0] :], max_line_bytes=block.max_line_bytes)
            self._blocks.appendleft((rest, len(spans) - keep_from))
            self._lines += len(spans) - keep_from
            self._bytes += len(rest.data)

    def _echo(self, data: bytes) -> None:
        tee = self._tee
        if tee is None:
            return
        try:
            tee.write(data)
            tee.flush()
        except (OSError, ValueError):
            self._tee = None  # our own stdout went away; keep reading the child regardless
