"""Stack dumps that a server (or an operator) already wrote into its log, found line by line.

Hang reports and SGLang's own watchdog paste stacks into the log: py-spy text (with and without
`--native`), `faulthandler` tracebacks, gdb `bt` / pstack output and Python tracebacks.
StackScanner finds them inside an ordinary log stream, with engine prefixes (`(Worker_TP1 pid=7)
`, `[2025-01-01 12:00:00 TP0] `, `ERROR 01-12 02:58:31 [x.py:654] `) and with other processes'
lines interleaved, and turns each dump into a `stack` LogEvent that carries it as a StackSample
(`LogEvent.stack`), so the same signature stack rules apply to it (watchdog/core/state/logdumps.py
pairs the dumps of one process). Pure and bounded: every regex is anchored and linear, and an
open dump holds at most `max_frames` frames per thread and `max_threads` threads.

Formats, read from upstream:
- py-spy 0.4 `dump` text (benfred/py-spy src/dump.rs `print_traces`): `Process PID: CMDLINE`,
  `Python vX.Y.Z (EXE)`, `Thread TID (active|idle|active+gil): "NAME"`, frames
  `    NAME (FILE:LINE)`; `--native` frames without a line: `    NAME (LIBRARY)`.
- faulthandler (cpython Python/traceback.c `dump_traceback`): `Thread 0x... (most recent call
  first):` / `Current thread 0x...` / `Stack (most recent call first):`, frames
  `  File "FILE", line N in NAME`, innermost first.
- gdb `bt` / `thread apply all bt` / pstack: `Thread N (Thread 0x... (LWP L)):` and
  `#N  0xADDR in NAME (ARGS) at FILE:LINE` / `from LIB`, innermost first.
- Python tracebacks (cpython Lib/traceback.py): `Traceback (most recent call last):`,
  `  File "FILE", line N, in NAME`, outermost first (reversed here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from watchdog.core.model import Frame, LogEvent, StackSample, ThreadStack
from watchdog.sources.logs.stackformats import (
    FH_FRAME,
    FH_THREAD,
    GDB_FRAME,
    GDB_THREAD,
    PYSPY_FRAME,
    PYSPY_LOCALS,
    PYSPY_PROCESS,
    PYSPY_PYTHON,
    PYSPY_THREAD,
    PYSPY_WHERE,
    SGLANG_DUMP,
    TB_END,
    TB_FRAME,
    TB_START,
    strip_prefixes,
)


@dataclass
class _Thread:
    tid: int
    name: str
    active: bool = False
    frames: list[Frame] = field(default_factory=list)


@dataclass
class _Dump:
    fmt: str
    pid: int | None
    title: str
    stream: str
    first_line: str
    threads: list[_Thread] = field(default_factory=list)
    gap: int = 0  # unrelated lines of this stream since the last dump line
    fed: bool = True  # got a line since the last tick
    last: int = 0  # the scanner's line count at this dump's last line
    reverse: bool = False  # tracebacks list the outermost frame first
    exc: str = ""

    def thread(self) -> _Thread:
        if not self.threads:
            self.threads.append(
                _Thread(self.pid or 0, "MainThread" if self.fmt == "traceback" else "")
            )
        return self.threads[-1]


class StackScanner:
    """Feed it cleaned log lines in order; it hands back each dump once it has ended.

    A dump ends after `max_gap` unrelated lines of its own stream, or after `max_span` lines of
    any stream without one of its own: a process writes its dump in one burst, so a dump whose
    stream went quiet while others kept logging (a busy API server's access lines) has ended.
    That bound is also what lets the block path stop feeding every line soon after a dump.
    """

    def __init__(
        self,
        *,
        max_gap: int = 3,
        max_span: int = 200,
        max_frames: int = 128,
        max_threads: int = 128,
    ) -> None:
        self.max_gap, self.max_frames, self.max_threads = max_gap, max_frames, max_threads
        self.max_span = max_span
        self._n = 0  # lines fed
        self._open: dict[str, _Dump] = {}
        self._pending_pid: dict[str, tuple[int, str]] = {}  # SGLang's "Pyspy dump for PID N:"

    def feed(self, raw: str, source: str = "", *, may_start: bool = True) -> list[LogEvent]:
        """The dumps this line ends (usually none). `may_start=False` says the line holds none
        of start_keys(), so it neither starts a dump nor names SGLang's dump pid (the block
        path knows that from its prefilter, and the start patterns are then not tried)."""
        if len(raw) > 4096:
            raw = raw[:4096]
        msg, key, pid = strip_prefixes(raw)
        self._n += 1
        out: list[LogEvent] = []
        for open_dump in self._open.values():
            if self._n - open_dump.last > self.max_span:
                out = self._expire(key, source)
                break
        dump = self._open.get(key)
        if dump is not None and self._extend(dump, msg):
            return out
        if not may_start:
            self._no_start(dump, key, msg, source, out)
            return out
        started = self._start(msg, key, pid, raw)
        if started is not None:
            if dump is not None:
                out += self._close(key, source)
            started.last = self._n
            self._open[key] = started
            return out
        self._no_start(dump, key, msg, source, out)
        m = SGLANG_DUMP.search(msg)
        if m is not None:
            self._pending_pid[key] = (int(m.group("pid")), raw)
        return out

    def _no_start(
        self, dump: _Dump | None, key: str, msg: str, source: str, out: list[LogEvent]
    ) -> None:
        """A line of an open dump's stream that neither continues nor restarts it: a gap."""
        if dump is not None:
            # py-spy separates threads with blank lines; elsewhere a blank line is a gap too
            dump.gap += 0 if dump.fmt == "py-spy" and not msg.strip() else 1
            if dump.gap > self.max_gap:
                out += self._close(key, source)

    def advance(self, source: str = "") -> list[LogEvent]:
        """`feed` of a line that holds no start key and belongs to no open dump's stream
        (block path: see `open_streams`): it is only counted, so dumps past their span end."""
        self._n += 1
        for dump in self._open.values():
            if self._n - dump.last > self.max_span:
                return self._expire(None, source)
        return []

    def open_streams(self) -> tuple[str, ...]:
        """The stream keys of the open dumps ("" is a line without an engine prefix)."""
        return tuple(self._open)

    def _expire(self, key: str | None, source: str) -> list[LogEvent]:
        """Close the other streams' dumps that got no line in the last `max_span` lines."""
        out: list[LogEvent] = []
        for other in [k for k, d in self._open.items() if self._n - d.last > self.max_span]:
            if other != key:
                out += self._close(other, source)
        return out

    @property
    def has_open(self) -> bool:
        """Whether a dump is open (then every line must be fed; see start_keys)."""
        return bool(self._open)

    def tick(self, source: str = "") -> list[LogEvent]:
        """Dumps that got no line since the previous tick have ended (a live log's last dump)."""
        out: list[LogEvent] = []
        for key in list(self._open):
            if self._open[key].fed:
                self._open[key].fed = False
            else:
                out += self._close(key, source)
        return out

    def flush(self, source: str = "") -> list[LogEvent]:
        """Every open dump, ended (end of a replayed file)."""
        out: list[LogEvent] = []
        for key in list(self._open):
            out += self._close(key, source)
        return out

    def _start(self, msg: str, key: str, pid: int | None, raw: str) -> _Dump | None:
        m = PYSPY_PROCESS.match(msg)
        if m is not None:
            return _Dump("py-spy", int(m.group("pid")), m.group("title").strip(), key, raw)
        m = PYSPY_THREAD.match(msg)
        if m is not None:
            pend = self._pending_pid.pop(key, None)
            dump = _Dump("py-spy", pend[0] if pend else pid, key, key, pend[1] if pend else raw)
            self._pyspy_thread(dump, m)
            return dump
        m = FH_THREAD.match(msg)
        if m is not None:
            dump = _Dump("faulthandler", pid, key, key, raw)
            self._fh_thread(dump, m)
            return dump
        m = GDB_THREAD.match(msg)
        if m is not None:
            dump = _Dump("gdb", pid, key, key, raw)
            dump.threads.append(
                _Thread(int(m.group("lwp") or m.group("n")), f"Thread {m.group('n')}")
            )
            return dump
        m = GDB_FRAME.match(msg) if msg.startswith("#0 ") else None
        if m is not None:
            dump = _Dump("gdb", pid, key, key, raw)
            self._add(dump, self._gdb_frame(m))
            return dump
        if TB_START.match(msg):
            return _Dump("traceback", pid, key, key, raw, reverse=True)
        return None

    def _extend(self, dump: _Dump, msg: str) -> bool:
        """True when `msg` belongs to the open dump of its stream."""
        dump.fed = True
        matched = self._continue(dump, msg)
        if matched:
            dump.gap = 0
            dump.last = self._n
        return matched

    def _continue(self, dump: _Dump, msg: str) -> bool:
        if dump.fmt == "py-spy":
            return self._pyspy(dump, msg)
        if dump.fmt == "faulthandler":
            return self._faulthandler(dump, msg)
        if dump.fmt == "gdb":
            return self._gdb(dump, msg)
        return self._traceback(dump, msg)

    def _pyspy(self, dump: _Dump, msg: str) -> bool:
        if PYSPY_PYTHON.match(msg) or (PYSPY_LOCALS.match(msg) and dump.threads):
            return True  # `Python v3.12 (...)`, and `--locals` lines under a frame
        m = PYSPY_THREAD.match(msg)
        if m is not None:
            self._pyspy_thread(dump, m)
            return True
        m = PYSPY_FRAME.match(msg)
        if m is not None and dump.threads:
            self._add(dump, self._pyspy_frame(m))
            return True
        return False

    def _faulthandler(self, dump: _Dump, msg: str) -> bool:
        m = FH_THREAD.match(msg)
        if m is not None:
            self._fh_thread(dump, m)
            return True
        m = FH_FRAME.match(msg)
        if m is not None:
            self._add(dump, _frame(m.group("name"), m.group("file"), int(m.group("line"))))
            return True
        return msg.strip() in ("<no Python frame>", "...")

    def _gdb(self, dump: _Dump, msg: str) -> bool:
        m = GDB_THREAD.match(msg)
        if m is not None:
            if len(dump.threads) < self.max_threads:
                dump.threads.append(
                    _Thread(int(m.group("lwp") or m.group("n")), f"Thread {m.group('n')}")
                )
            return True
        m = GDB_FRAME.match(msg)
        if m is None:
            return False
        if m.group("n") == "0" and dump.threads and dump.threads[-1].frames:
            dump.threads.append(_Thread(0, ""))  # a second `bt` without a thread header
        self._add(dump, self._gdb_frame(m))
        return True

    def _traceback(self, dump: _Dump, msg: str) -> bool:
        m = TB_FRAME.match(msg)
        if m is not None:
            self._add(dump, _frame(m.group("name"), m.group("file"), int(m.group("line"))))
            return True
        if dump.exc:
            return False
        if msg.startswith((" ", "\t")) and dump.threads and msg.strip():
            return True  # the source line (and `^^^^` markers) under a frame
        m = TB_END.match(msg)
        if m is not None and dump.threads:
            dump.exc = msg.strip()[:300]
            dump.gap = self.max_gap  # the next unrelated line ends it
            return True
        return msg.startswith(("During handling", "The above exception")) or not msg.strip()

    def _pyspy_thread(self, dump: _Dump, m: re.Match[str]) -> None:
        if len(dump.threads) >= self.max_threads:
            return
        tid = m.group("tid") or "0"  # py-spy can omit it: `Thread (active+gil): "MainThread"`
        dump.threads.append(
            _Thread(
                int(tid, 16) if tid.startswith("0x") else int(tid),
                m.group("name"),
                "active" in m.group("state"),
            )
        )

    def _fh_thread(self, dump: _Dump, m: re.Match[str]) -> None:
        if len(dump.threads) >= self.max_threads:
            return
        tid = int(m.group("tid"), 16) if m.group("tid") else 0
        name = "current" if m.group("current") or m.group("stack") else ""
        dump.threads.append(_Thread(tid, name, active=bool(m.group("current"))))

    @staticmethod
    def _pyspy_frame(m: re.Match[str]) -> Frame:
        where = m.group("where")
        w = PYSPY_WHERE.match(where)
        if w is not None:
            return _frame(m.group("name").strip(), w.group("file"), int(w.group("line")))
        return _frame(m.group("name").strip(), where, 0)  # --native: the library, no line

    @staticmethod
    def _gdb_frame(m: re.Match[str]) -> Frame:
        return _frame(
            m.group("name"), m.group("file") or m.group("lib") or "", int(m.group("line") or 0)
        )

    def _add(self, dump: _Dump, frame: Frame) -> None:
        th = dump.thread()
        if len(th.frames) < self.max_frames:
            th.frames.append(frame)

    def _close(self, key: str, source: str) -> list[LogEvent]:
        dump = self._open.pop(key)
        threads = [t for t in dump.threads if t.frames]
        if not threads:
            return []
        return [_event(dump, threads, source)]


def _frame(name: str, filename: str, line: int) -> Frame:
    return Frame(name=name, filename=filename, line=line)


def _event(dump: _Dump, threads: list[_Thread], source: str) -> LogEvent:
    """One dump as a `stack` LogEvent: the StackSample in `stack`, what it came from in fields."""
    frames = sum(len(t.frames) for t in threads)
    who = f"pid {dump.pid}" if dump.pid is not None else (dump.stream or "the log")
    title = dump.title or dump.stream
    shown = f" ({title})" if title and title != who else ""
    line = f"{dump.fmt} stack dump in the log: {who}{shown}, {len(threads)} thread(s)"
    line += f", {frames} frame(s)"
    if dump.exc:
        line += f": {dump.exc}"
    return LogEvent(
        kind="stack",
        line=line,
        source=source,
        fields={
            "format": dump.fmt,
            "pid": dump.pid,
            "title": title,
            "stream": dump.stream,
            "exception": dump.exc or None,
        },
        stack=StackSample(
            pid=dump.pid or 0,
            title=title,
            threads=tuple(
                ThreadStack(
                    thread_id=t.tid,
                    name=t.name,
                    frames=tuple(reversed(t.frames) if dump.reverse else t.frames),
                    active=t.active,
                )
                for t in threads
            ),
        ),
    )


def scan_lines(lines: list[str], source: str = "") -> list[LogEvent]:
    """Every dump in a finished list of lines (replay of a plain log)."""
    scanner = StackScanner()
    out: list[LogEvent] = []
    for line in lines:
        out += scanner.feed(line, source)
    return out + scanner.flush(source)


def start_keys() -> tuple[str, ...] | None:
    """Literals one of which every line that can start a dump (or name SGLang's dump pid)
    holds, from the patterns `_start` and `feed` try; None if one has no literal. While no dump
    is open, a line holding none of them changes nothing, so the log source's prefilter may
    skip it (watchdog/sources/logs/scan.py)."""
    from watchdog.sources.logs.prefilter import required_literals

    keys: list[str] = ["#0 "]  # _start's guard before GDB_FRAME
    for pattern in (PYSPY_PROCESS, PYSPY_THREAD, FH_THREAD, GDB_THREAD, TB_START, SGLANG_DUMP):
        found = required_literals(pattern)
        if not found:
            return None
        keys += found
    return tuple(keys)
