"""Log lines from files (tail -F), pipes and stdin, parsed into LogEvents once per tick.

Readers never block the loop and never raise: a file that is missing or unreadable shows up
in the reader's `error` attribute, and LogSource turns that into SourceHealth.down().
"""

from __future__ import annotations

import collections
import os
import re
import threading
from collections.abc import Sequence
from typing import BinaryIO, Protocol

from watchdog.core.model import LogEvent
from watchdog.core.openops import keep_with_ops, load_ops
from watchdog.sources.base import SourceHealth
from watchdog.sources.linesplit import LineSplitter, split_records
from watchdog.sources.logparse import LogPatterns, clean_line, parse_line
from watchdog.sources.logstacks import StackScanner

_CHUNK = 65536
_TAIL_LINE_CHARS = 8192  # keeps the incident-bundle tail small even with huge lines
_REDRAW_KINDS = frozenset({"progress", "loading", "capture"})  # tqdm bars redrawn many times/s


class LineReader(Protocol):
    """Anything that hands over the new lines since the last call, without blocking."""

    name: str
    error: str | None

    def read(self) -> list[str]: ...

    def close(self) -> None: ...


class FileFollower:
    """`tail -F` for one path: waits for it, follows rename-rotation and truncation."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        from_start: bool = False,
        max_bytes_per_read: int = 8 << 20,
        max_line_bytes: int = 65536,
    ) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.error: str | None = None
        self._from_start = from_start
        self._first_open = True
        self._max_bytes = max_bytes_per_read
        self._max_line_bytes = max_line_bytes
        self._fh: BinaryIO | None = None
        self._id: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._offset = 0
        self._splitter = LineSplitter(max_line_bytes)

    def partials(self) -> list[str]:
        """The unterminated last line, if any (see LineSplitter.peek)."""
        held = self._splitter.peek()
        return [held] if held else []

    def read(self) -> list[str]:
        """The complete lines written since the last call; [] (and `error` set) on OSError."""
        try:
            lines = self._read()
        except OSError as exc:
            self.error = f"cannot read log file {self.path}: {exc.strerror or exc}"
            self._close_file()
            return []
        return lines

    def close(self) -> None:
        """Close the open file, if any."""
        self._close_file()

    def _read(self) -> list[str]:
        if self._fh is None and not self._open():
            return []
        lines = self._drain()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return lines  # renamed away and not yet recreated: keep the old file open
        if (st.st_dev, st.st_ino) != self._id:
            # Rotated: the writer may have written more to the old file before moving on.
            lines += self._drain()
            lines += [partial] if (partial := self._splitter.flush()) else []
            self._close_file()
            if self._open():
                lines += self._drain()
        return lines

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across calls, closed in close()
        except FileNotFoundError:
            self._first_open = False  # a file that appears later is read from its start
            self.error = f"log file {self.path} does not exist (yet); waiting for it"
            return False
        st = os.fstat(fh.fileno())
        self._fh, self._id, self.error = fh, (st.st_dev, st.st_ino), None
        self._offset = 0
        self._splitter = LineSplitter(self._max_line_bytes)
        if self._first_open and not self._from_start:
            self._offset = fh.seek(0, os.SEEK_END)
            self._hold_unterminated_tail(fh)
        self._first_open = False
        return True

    def _hold_unterminated_tail(self, fh: BinaryIO) -> None:
        """Joining at the end skips the past, but not an unterminated last line: a tqdm bar
        that froze before the watchdog attached is never terminated, and it is the server's
        current state (only bars are reported from held text: LogSource._held_bars)."""
        start = max(0, self._offset - self._max_line_bytes)
        fh.seek(start)
        tail = fh.read(self._offset - start)
        cut = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
        held = tail[cut + 1 :] if cut >= 0 or start == 0 else b""
        if held:
            self._splitter.feed(held)

    def _drain(self) -> list[str]:
        fh = self._fh
        if fh is None:
            return []
        if os.fstat(fh.fileno()).st_size < self._offset:  # truncated in place (copytruncate)
            self._offset = fh.seek(0)
            self._splitter = LineSplitter(self._max_line_bytes)
        lines: list[str] = []
        budget = self._max_bytes
        while budget > 0:
            data = fh.read(min(_CHUNK, budget))
            if not data:
                break
            self._offset += len(data)
            budget -= len(data)
            lines += self._splitter.feed(data)
        return lines

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._id = None, None

    def __repr__(self) -> str:
        return f"FileFollower({self.path!r})"


class StreamReader:
    """Reads a pipe or stdin on a daemon thread into a bounded queue of lines.

    When the consumer falls behind by more than `max_lines` lines or `max_chars` characters,
    the oldest lines are dropped and counted in `dropped`. `tee` receives every byte read
    (supervise mode echoes the child's output through to the watchdog's own stdout/stderr).
    """

    def __init__(
        self,
        stream: BinaryIO,
        name: str,
        *,
        tee: BinaryIO | None = None,
        max_lines: int = 10000,
        max_chars: int = 8 << 20,
        max_line_bytes: int = 65536,
    ) -> None:
        self.name = name
        self.error: str | None = None
        self.eof = False
        self.dropped = 0
        self._stream = stream
        self._tee = tee
        self._lines: collections.deque[str] = collections.deque()
        self._max_lines, self._max_chars, self._chars = max_lines, max_chars, 0
        self._lock = threading.Lock()
        self._splitter = LineSplitter(max_line_bytes)
        self._thread = threading.Thread(target=self._run, name=f"log-reader-{name}", daemon=True)
        self._thread.start()

    def partials(self) -> list[str]:
        """The unterminated last line, if any (see LineSplitter.peek)."""
        held = self._splitter.peek()
        return [held] if held else []

    def read(self) -> list[str]:
        """All lines queued since the last call."""
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
            self._chars = 0
        return lines

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
        partial = self._splitter.flush()
        self._push([partial] if partial else [])
        self.eof = True

    def _push(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock:
            self._lines.extend(lines)
            self._chars += sum(map(len, lines))
            while len(self._lines) > self._max_lines or self._chars > self._max_chars:
                self._chars -= len(self._lines.popleft())
                self.dropped += 1

    def _echo(self, data: bytes) -> None:
        tee = self._tee
        if tee is None:
            return
        try:
            tee.write(data)
            tee.flush()
        except (OSError, ValueError):
            self._tee = None  # our own stdout went away; keep reading the child regardless


_BAR_KINDS = frozenset({"progress", "loading", "capture"})


class LogSource:
    """Polls every reader once per tick and parses the new lines into LogEvents."""

    def __init__(
        self,
        readers: Sequence[LineReader],
        *,
        keep: re.Pattern[str] | None = None,
        max_events_per_tick: int = 500,
        tail_lines: int = 2000,
        name: str = "logs",
        patterns: LogPatterns | None = None,
    ) -> None:
        self.name = name
        self._patterns = patterns  # engine log formats (None: the shipped profiles')
        self.health = SourceHealth(name)
        self.dropped_events = 0
        self._readers = list(readers)
        # Start and end lines of operations (core/openops.py) are kept too: a stall that
        # lasts inside one of them names its cause.
        self._keep = keep_with_ops(keep, load_ops())
        self._max_events = max_events_per_tick
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._held: dict[tuple[int, int], str] = {}
        # Stack dumps the server wrote into its log (SGLang's watchdog, faulthandler, ...).
        self._scanners: dict[int, StackScanner] = {}

    def poll(self) -> tuple[LogEvent, ...]:
        """The events parsed from all lines that arrived since the last poll."""
        events: list[LogEvent] = []
        errors: list[str] = []
        for reader in self._readers:
            scanner = self._scanners.setdefault(id(reader), StackScanner())
            for raw in reader.read():
                line = clean_line(raw)
                events.extend(scanner.feed(line, reader.name))
                if not line:
                    continue
                self._tail.append(line[:_TAIL_LINE_CHARS])
                for record in split_records(line):
                    event = parse_line(
                        record, source=reader.name, keep=self._keep, patterns=self._patterns
                    )
                    if event is not None:
                        events.append(event)
            events.extend(scanner.tick(reader.name))
            events.extend(self._held_bars(reader))
            if reader.error:
                errors.append(reader.error)
        if errors:
            self.health.down("; ".join(errors))
        else:
            self.health.ok()
        return tuple(self._cap(events))

    def _held_bars(self, reader: LineReader) -> list[LogEvent]:
        """A progress bar left unterminated (a hung tqdm never redraws) is still the bar's
        current state: report it once per distinct text."""
        partials = getattr(reader, "partials", None)
        out: list[LogEvent] = []
        for i, raw in enumerate(partials() if partials is not None else ()):
            key = (id(reader), i)
            line = clean_line(raw)
            if not line or self._held.get(key) == line:
                continue
            self._held[key] = line
            event = parse_line(line, source=reader.name, patterns=self._patterns)
            if event is not None and event.kind in _BAR_KINDS:
                out.append(event)
        return out

    def tail(self, n: int = 200) -> list[str]:
        """The last `n` cleaned lines from all readers, oldest first (for incident bundles)."""
        if n <= 0:
            return []
        return list(self._tail)[-n:]

    @property
    def dropped_lines(self) -> int:
        """Lines the stream readers dropped because the loop fell behind."""
        return sum(getattr(r, "dropped", 0) for r in self._readers)

    def close(self) -> None:
        """Close every reader."""
        for reader in self._readers:
            reader.close()

    def _cap(self, events: list[LogEvent]) -> list[LogEvent]:
        if len(events) <= self._max_events:
            return events
        # Over the cap: collapse tqdm redraws to the last one per bar, never dropping
        # milestone/jit/stats/line events in their favour; then keep the newest.
        last_redraw: dict[tuple[str, str, object], int] = {}
        for i, ev in enumerate(events):
            if ev.kind in _REDRAW_KINDS:
                last_redraw[(ev.source, ev.kind, ev.fields.get("desc"))] = i
        keep_idx = set(last_redraw.values())
        kept = [ev for i, ev in enumerate(events) if ev.kind not in _REDRAW_KINDS or i in keep_idx]
        if len(kept) > self._max_events:  # still over: drop redraws first, then the oldest
            ranked = sorted(range(len(kept)), key=lambda i: (kept[i].kind not in _REDRAW_KINDS, i))
            chosen = sorted(ranked[-self._max_events :])
            kept = [kept[i] for i in chosen]
        self.dropped_events += len(events) - len(kept)
        return kept
