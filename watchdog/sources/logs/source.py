"""Log lines from files (tail -F), pipes and stdin, parsed into LogEvents once per tick.

Readers never block the loop and never raise: a file that is missing or unreadable shows up
in the reader's `error` attribute, and LogSource turns that into SourceHealth.down().
"""

from __future__ import annotations

import collections
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO, Protocol

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.model import LogEvent
from watchdog.core.state.openops import keep_with_ops
from watchdog.sources.base import Deadline, SourceHealth, SourceTick
from watchdog.sources.logs.parse import LogPatterns, clean_line, parse_line
from watchdog.sources.logs.scan import BlockScanner, StackBlocks, prefilter_for, tail_lines
from watchdog.sources.logs.split import Block, BlockSplitter, count_eols
from watchdog.sources.logs.stackdumps import StackScanner
from watchdog.sources.logs.stream import StreamReader

__all__ = ["BlockReader", "FileFollower", "LogSource", "StreamReader"]

log = logging.getLogger(__name__)

_CHUNK = 65536
_REPORT_EVERY_S = 60.0  # a sustained flood logs its skipped-line count once a minute
_TAIL_LINE_CHARS = 8192  # keeps the incident-bundle tail small even with huge lines
_TAIL_BYTES = 1 << 20  # the whole tail, whatever its line count
_REDRAW_KINDS = frozenset({"progress", "loading", "capture"})  # tqdm bars redrawn many times/s


class BlockReader(Protocol):
    """Anything that hands over the new complete lines since the last call, as blocks of
    bytes, without blocking: FileFollower, StreamReader, JournalReader."""

    name: str
    error: str | None

    def read_blocks(self) -> list[Block]: ...

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
        max_lag_bytes: int = 64 << 20,
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
        self._max_lag = max(max_lag_bytes, max_bytes_per_read)
        self._resync = False  # after skipping ahead: discard up to the next line end
        self.skipped = 0  # lines jumped over because the writer ran max_lag_bytes ahead
        self._splitter = BlockSplitter(max_line_bytes)

    def partials(self) -> list[str]:
        """The unterminated last line, if any (see LineSplitter.peek)."""
        held = self._splitter.peek()
        return [held] if held else []

    def read(self) -> list[str]:
        """The complete lines written since the last call; [] (and `error` set) on OSError."""
        return [line for block in self.read_blocks() for line in block.lines()]

    def read_blocks(self) -> list[Block]:
        """The complete lines written since the last call, as blocks; [] on OSError."""
        try:
            return self._read()
        except OSError as exc:
            self.error = f"cannot read log file {self.path}: {exc.strerror or exc}"
            self._close_file()
            return []

    def close(self) -> None:
        """Close the open file, if any."""
        self._close_file()

    def _read(self) -> list[Block]:
        if self._fh is None and not self._open():
            return []
        blocks = self._drain()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return blocks  # renamed away and not yet recreated: keep the old file open
        if (st.st_dev, st.st_ino) != self._id:
            # Rotated: the writer may have written more to the old file before moving on.
            blocks += self._drain()
            blocks += [partial] if (partial := self._splitter.flush()) else []
            self._close_file()
            if self._open():
                blocks += self._drain()
        return blocks

    def _open(self) -> bool:
        try:
            # O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, for ever.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._first_open = False  # a file that appears later is read from its start
            self.error = f"log file {self.path} does not exist (yet); waiting for it"
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.error = (
                f"log file {self.path} is not a regular file (a FIFO or a device?); "
                "pipe a stream into --log-file - instead"
            )
            return False
        fh = os.fdopen(fd, "rb")
        self._fh, self._id, self.error = fh, (st.st_dev, st.st_ino), None
        self._offset = 0
        self._splitter = BlockSplitter(self._max_line_bytes)
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

    def _drain(self) -> list[Block]:
        fh = self._fh
        if fh is None:
            return []
        size = os.fstat(fh.fileno()).st_size
        if size < self._offset:  # truncated in place (copytruncate)
            self._offset = fh.seek(0)
            self._splitter = BlockSplitter(self._max_line_bytes)
        elif size - self._offset > self._max_lag:
            self._skip_to(fh, size - self._max_bytes)
        data = fh.read(self._max_bytes)
        self._offset += len(data)
        if self._resync and data:
            ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
            data = data[min(ends) + 1 :] if ends else b""
            self._resync = not ends
        block = self._splitter.feed(data) if data else None
        return [block] if block is not None else []

    def _skip_to(self, fh: BinaryIO, target: int) -> None:
        """The writer is max_lag_bytes ahead: jump to the last max_bytes_per_read, counting
        the lines jumped over, rather than falling further behind (and growing) each tick."""
        self._splitter.flush()  # its line ends inside the skipped part: counted there
        skipped, last = 0, b"\n"
        while self._offset < target:
            chunk = fh.read(min(1 << 20, target - self._offset))
            if not chunk:
                break
            self._offset += len(chunk)
            skipped += count_eols(chunk)
            last = chunk[-1:]
        self.skipped += skipped + (last not in (b"\n", b"\r"))  # + the line cut at target
        self._resync = True

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._id = None, None

    def __repr__(self) -> str:
        return f"FileFollower({self.path!r})"


_BAR_KINDS = frozenset({"progress", "loading", "capture"})


class LogSource:
    """Polls every reader once per tick and parses the new lines into LogEvents.

    Every reader hands over blocks of bytes (`read_blocks`), which are prefiltered: only lines
    holding one of the parser's or the keep pattern's literal keys are decoded and parsed, within
    `budget_s` per poll; what the budget left is carried to the next poll, never dropped
    (`skipped["budget"]` stays for the metric's label). Lines a reader dropped or jumped over
    are counted by reason in `skipped` (each Observation carries them: the metrics hook
    exports hang_watchdog_log_lines_skipped_total), logged, and passed to `on_skip` if set.
    """

    part = "logs"

    def __init__(
        self,
        readers: Sequence[BlockReader],
        *,
        patterns: LogPatterns,
        keep: re.Pattern[str] | None = None,
        ops: Sequence[OpDef] = (),
        max_events_per_tick: int = 500,
        tail_lines: int = 2000,
        name: str = "logs",
        budget_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
        on_skip: Callable[[str, int], None] | None = None,
        compile_in_child: bool = False,
    ) -> None:
        """`compile_in_child`: the prefilters' Hyperscan databases are compiled by a child
        process (a long-running daemon's memory: sources/logs/hsbuild.py)."""
        self.name = name
        self.health = SourceHealth(name)
        self.dropped_events = 0
        self.skipped: dict[str, int] = {"dropped": 0, "lag": 0, "budget": 0}
        self.on_skip = on_skip
        self._readers = list(readers)
        # Start and end lines of operations (core/state/openops.py, SignatureSet.ops) are kept too:
        # a stall that lasts inside one of them names its cause.
        self._keep = keep_with_ops(keep, ops)
        # The engine log formats (shipped plus operator `--engines` profiles) this source reads;
        # required, so that a source built without them cannot silently read no engine's lines
        # (parse.NO_ENGINES says so explicitly). Each source holds its own: nothing module-wide.
        self._patterns = patterns
        prefilter = prefilter_for(self._keep, patterns=patterns, in_child=compile_in_child)
        self._scanner = BlockScanner(
            self._keep, prefilter=prefilter, patterns=patterns, clock=clock
        )
        self._stack_blocks = StackBlocks(self._scanner, clock=clock, in_child=compile_in_child)
        self._budget_s = budget_s
        self._clock = clock
        self._max_events = max_events_per_tick
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._tail_chars = 0
        # Blocks a poll's budget left unparsed, per reader: finished before it is read again.
        self._carry: dict[int, list[Block]] = {}
        self.carried = 0  # bytes waiting in the carry after the last poll
        self._held: dict[tuple[int, int], str] = {}
        # Stack dumps the server wrote into its log (SGLang's watchdog, faulthandler, ...).
        self._scanners: dict[int, StackScanner] = {}
        self._seen: dict[tuple[int, str], int] = {}  # reader counters already folded in
        self._reported: dict[str, int] = {}
        self._last_report = float("-inf")

    def deadline(self, tick_s: float) -> Deadline:
        # A FIFO or a hung network mount at a log path blocks open() or read() for ever; lines
        # read late are still evidence, so a late poll's events go into the next tick.
        return Deadline(
            max(0.5, tick_s),
            keep_late=True,
            hint="a FIFO or a hung network mount at the log path, or a flood of lines?",
        )

    def poll(self, tick: SourceTick | None = None) -> tuple[LogEvent, ...]:
        """The events parsed from all lines that arrived since the last poll."""
        events: list[LogEvent] = []
        errors: list[str] = []
        deadline = self._clock() + self._budget_s
        for reader in self._readers:
            stacks = self._scanners.setdefault(id(reader), StackScanner())
            events += self._scan_blocks(reader, stacks, deadline)
            events.extend(stacks.tick(reader.name))
            events.extend(self._held_bars(reader))
            if reader.error:
                errors.append(reader.error)
        if errors:
            self.health.down("; ".join(errors))
        else:
            self.health.ok()
        self._report_skips()
        return tuple(self._cap(events))

    def _scan_blocks(
        self,
        reader: BlockReader,
        stacks: StackScanner,
        deadline: float,
    ) -> list[LogEvent]:
        """The reader's blocks, parsed until the poll's budget is spent. What the budget left
        (the lines that can matter) is carried to the next poll, which finishes it before it
        reads more: the reader's own bounds (FileFollower's lag, StreamReader's queue) then
        hold, and a signature line behind a burst is late, never lost."""
        key = id(reader)
        blocks = self._carry.pop(key, None)
        if blocks is None:
            blocks = reader.read_blocks()
            for block in blocks:
                self._tail_add(tail_lines(block, self._tail.maxlen or 0, _TAIL_LINE_CHARS))
        events: list[LogEvent] = []
        for i, block in enumerate(blocks):
            found, rest = self._stack_blocks.scan(block, reader.name, stacks, deadline)
            events += found
            if rest is not None:
                self._carry[key] = [rest, *blocks[i + 1 :]]
                self.carried = sum(len(b.data) for b in self._carry[key])
                break
        else:
            self.carried = 0
        return events

    def _tail_add(self, lines: list[str]) -> None:
        """Append to the tail, holding it to _TAIL_BYTES: 2000 lines of 8 KB were 16 MB."""
        for line in lines:
            if len(self._tail) == self._tail.maxlen:
                self._tail_chars -= len(self._tail[0])
            self._tail.append(line)
            self._tail_chars += len(line)
        while self._tail_chars > _TAIL_BYTES and len(self._tail) > 1:
            self._tail_chars -= len(self._tail.popleft())

    def _report_skips(self) -> None:
        """Fold the readers' drop/lag counters in; hand increases to on_skip; log now and then."""
        for reader in self._readers:
            for reason, attr in (("dropped", "dropped"), ("lag", "skipped")):
                total = getattr(reader, attr, 0)
                key = (id(reader), reason)
                self.skipped[reason] += total - self._seen.get(key, 0)
                self._seen[key] = total
        new = {r: n - self._reported.get(r, 0) for r, n in self.skipped.items()}
        if not any(new.values()):
            return
        self._reported = dict(self.skipped)
        if self.on_skip is not None:
            for reason, count in new.items():
                if count > 0:
                    self.on_skip(reason, count)
        now = self._clock()
        if now - self._last_report >= _REPORT_EVERY_S:
            self._last_report = now
            log.warning(
                "log source fell behind: %d log lines not parsed so far (%s); the server "
                "writes its log faster than the watchdog reads it",
                sum(self.skipped.values()),
                ", ".join(f"{r} {n}" for r, n in self.skipped.items() if n),
            )

    def _held_bars(self, reader: BlockReader) -> list[LogEvent]:
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

    @property
    def prefilter_engine(self) -> str:
        """The prefilter's scanner: "hyperscan", "find" or "off"."""
        return self._scanner.prefilter.engine

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
