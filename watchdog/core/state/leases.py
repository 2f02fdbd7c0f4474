"""Leases: a known long operation that shows progress of its own holds off the stall (pure).

A FlashInfer autotune, a JIT build, a cubin download or a weight load can run for minutes with
no progress the engine's own counters show. While it shows progress of its own (its bar or
milestone lines, bytes received on its CDN socket, live compiler children) it holds a lease:
the stall deadline waits for it, and past its bound (`bound_s`) it is `crawling`. Once it
shows none for `quiet_s` the lease lapses and the stall clock runs from the last progress it
showed: the hang (wedged). The operations and their bounds are data (openops.toml).

The scan is incremental (`LeaseScan`): the window carries the state of the observations its
ring dropped (core/state/window.py), so an operation opened 40 minutes ago keeps its start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.model import Connection, LogEvent, Observation
from watchdog.core.state.events import READY_MILESTONES
from watchdog.core.state.openops import who_of

MAX_WHOS = 256  # processes one open operation remembers (ranks); bounds the carried state
MAX_ANCHORS = 16  # start lines one open operation keeps to be rebuilt from (core/state/window.py)
Anchor = tuple[float, float, LogEvent]  # (t, wall, the line): what opened or moved it


@dataclass(frozen=True)
class Lease:
    """One known long operation open now, and the last progress of its own it showed."""

    op: OpDef
    started_t: float
    last_t: float
    last_what: str
    bytes_per_s: float | None = None  # its socket's receive rate, over the window
    eta_s: float | None = None  # from its bar's rate and total, or its size and byte rate
    shown: bool = False  # it showed progress of its own, not only its start line

    def holds(self, now: float) -> bool:
        """It showed progress of its own within its quiet bound: the stall waits for it."""
        return self.shown and not self.lapsed(now)

    def lapsed(self, now: float) -> bool:
        """No progress of its own (nor a start) for its quiet bound: wedged."""
        return self.op.quiet_s is not None and now - self.last_t >= self.op.quiet_s

    def crawling(self, now: float) -> bool:
        """Still progressing, but open longer than the operation's bound."""
        bound = self.op.bound_s
        return self.holds(now) and bound is not None and now - self.started_t >= bound

    def describe(self, now: float) -> str:
        """One line: what, open how long against its bound, last progress, rate and ETA."""
        text = f"{self.op.what} open for {now - self.started_t:.0f} s"
        if self.op.bound_s is not None:
            text += f" (its bound: {self.op.bound_s:.0f} s)"
        text += f", last progress of its own {now - self.last_t:.0f} s ago ({self.last_what})"
        if self.bytes_per_s is not None:
            text += f", receiving {self.bytes_per_s:.0f} B/s"
        if self.eta_s is not None:
            text += f", ETA {self.eta_s:.0f} s"
        elif self.bytes_per_s is not None:
            text += ", ETA unknown (its size is neither logged nor visible on the wire)"
        return text


@dataclass
class OpenLease:
    """One operation open in a scan (the state the window carries past its ring)."""

    whos: set[str]  # the processes that have it open ("" when the log does not say)
    started_t: float
    last_t: float
    last_what: str
    eta_s: float | None = None
    shown: bool = False
    size: int | None = None  # bytes, when its start line names them (a `size` group)
    got: int = 0  # bytes its socket received since it opened
    # The lines that rebuild this state when fed again in order (a bundle's timeline holds
    # them ahead of the window): the ones that opened it, and its latest progress line.
    anchors: list[Anchor] = field(default_factory=list)
    latest: Anchor | None = None

    def copy(self) -> OpenLease:
        return replace(self, whos=set(self.whos), anchors=list(self.anchors))


class LeaseScan:
    """The lease state over observations fed in order: the operations open and their
    progress, and the socket byte counts the next observation's growth is read against."""

    def __init__(self, ops: Sequence[OpDef], opened: Mapping[str, OpenLease] | None = None) -> None:
        self.ops = [op for op in ops if op.quiet_s is not None]
        self.opened = {k: o.copy() for k, o in opened.items()} if opened else {}
        self._prev_bytes: dict[tuple[int, str, int], int] = {}
        self._prev_t: float | None = None
        self._first_bytes: tuple[float, int] | None = None
        self._last_bytes: tuple[float, int] | None = None
        # When an operation last finished (its end line, a bar at its total): progress, so a
        # stall held by its lease is not timed from before it once it ends.
        self.finished_t: float | None = None

    def feed(self, obs: Observation) -> None:
        """One observation: its log lines, its sockets' bytes, its compiler children."""
        opened = self.opened
        for ev in obs.logs:
            if ev.kind == "milestone" and ev.fields.get("name") in READY_MILESTONES:
                for op in self.ops:
                    if op.startup:  # the server is up: its startup steps are over
                        opened.pop(op.id, None)
            elif ev.kind != "stack":
                for op in self.ops:
                    if _on_line(opened, op, ev, (obs.t, obs.wall)):
                        self.finished_t = obs.t
        received = _received(obs.conns, self._prev_bytes)
        dt, self._prev_t = (obs.t - self._prev_t if self._prev_t is not None else 0.0), obs.t
        total = sum(c.bytes_received or 0 for c in obs.conns)
        if obs.conns and any(c.bytes_received is not None for c in obs.conns):
            self._first_bytes = self._first_bytes or (obs.t, total)
            self._last_bytes = (obs.t, total)
        compilers = obs.procs.compilers if obs.procs is not None else ()
        for op in self.ops:
            fast = dt > 0 and received / dt >= op.min_bytes_per_s
            if received and fast and "socket_bytes" in op.signals:
                started = obs.t - max((c.age_s for c in obs.conns), default=0.0)
                _progress(opened, op, obs.t, f"{received} bytes received on its socket", started)
                opened[op.id].got += received
            if compilers and "compilers" in op.signals and op.id in opened:
                _progress(opened, op, obs.t, f"compiler children alive: {', '.join(compilers)}")

    def leases(self) -> tuple[Lease, ...]:
        """The operations open now, in op order, with the byte rate over what was fed."""
        rate = None
        first, last = self._first_bytes, self._last_bytes
        if first and last and last[0] > first[0]:
            rate = max(0.0, (last[1] - first[1]) / (last[0] - first[0]))
        out = []
        for op in self.ops:
            o = self.opened.get(op.id)
            if o is None:
                continue
            socket = "socket_bytes" in op.signals
            eta = o.eta_s
            if socket and eta is None and o.size is not None and rate:
                eta = max(0, o.size - o.got) / rate  # only a size the log stated
            out.append(
                Lease(
                    op,
                    o.started_t,
                    o.last_t,
                    o.last_what,
                    bytes_per_s=rate if socket else None,
                    eta_s=eta,
                    shown=o.shown,
                )
            )
        return tuple(out)


def leases(
    observations: Iterable[Observation],
    ops: Sequence[OpDef],
    carried: Mapping[str, OpenLease] | None = None,
) -> tuple[Lease, ...]:
    """The operations with a lease (a `quiet_s`) open at the end of `observations`, in op
    order. An operation opens at its start line, or at a first sign of its own progress when
    its start is older than the window (and not in `carried`, the state of the observations
    the window dropped); its end (or fail) lines close it."""
    scan = LeaseScan(ops, carried)
    if not scan.ops:
        return ()
    for obs in observations:
        scan.feed(obs)
    return scan.leases()


def _on_line(
    opened: dict[str, OpenLease], op: OpDef, ev: LogEvent, when: tuple[float, float]
) -> bool:
    """Apply one line to `op`'s state; True when the line finished it (its end, not a fail)."""
    line, fields, t = ev.line, ev.fields, when[0]
    anchor = (t, when[1], ev)
    ended = bool(op.end.search(line))
    if ended or (op.fail is not None and op.fail.search(line)):
        o = opened.get(op.id)
        if o is None:
            return False
        who = who_of(line)
        if who and who in o.whos:
            o.whos.discard(who)
        else:
            o.whos.clear()
        if not o.whos:
            del opened[op.id]
        return ended
    moving = op.start.search(line) or (op.progress is not None and op.progress.search(line))
    if moving and _complete(fields):  # its bar reached its total: done, whatever end follows
        return opened.pop(op.id, None) is not None
    m = op.start.search(line)
    if m is not None:
        o = opened.get(op.id)
        if o is None:
            # An operation that logs nothing between its start and its end (a weight transfer):
            # its start line is the progress it shows, for its quiet bound.
            o = opened[op.id] = OpenLease({who_of(line)}, t, t, _short(line))
            o.shown, o.size, o.anchors = op.start_holds, _size(m), [anchor]
        else:
            # Its start line again (a bar whose description is the start, another rank): moving.
            who = who_of(line)
            if who not in o.whos and len(o.anchors) < MAX_ANCHORS:
                o.anchors.append(anchor)
            if len(o.whos) < MAX_WHOS:
                o.whos.add(who)
            o.last_t, o.last_what, o.shown, o.latest = t, _short(line), True, anchor
        return False
    if op.progress is not None and op.progress.search(line):
        _progress(opened, op, t, _short(line))
        o = opened[op.id]
        o.eta_s, o.latest = _eta(fields), anchor
        o.anchors = o.anchors or [anchor]  # opened by this line: it rebuilds the opening
    return False


def _progress(
    opened: dict[str, OpenLease], op: OpDef, t: float, what: str, started: float | None = None
) -> None:
    o = opened.get(op.id)
    if o is None:
        o = opened[op.id] = OpenLease({""}, t if started is None else min(t, started), t, what)
    o.last_t, o.last_what, o.shown = t, what, True


def _received(conns: Sequence[Connection], prev: dict[tuple[int, str, int], int]) -> int:
    """Bytes the CDN sockets received since the last observation (updates `prev`)."""
    grown = 0
    seen: dict[tuple[int, str, int], int] = {}
    for c in conns:
        if c.bytes_received is None:
            continue
        key = (c.pid, c.ip, c.port)
        seen[key] = seen.get(key, 0) + c.bytes_received
    for key, now in seen.items():
        before = prev.get(key)
        if before is not None and now > before:
            grown += now - before
    prev.clear()
    prev.update(seen)
    return grown


def _size(m: re.Match[str]) -> int | None:
    """The bytes a start line names in its `size` group, if the op's pattern has one."""
    size = m.groupdict().get("size")
    return int(size) if size and size.isdigit() else None


def _complete(fields: dict) -> bool:  # type: ignore[type-arg]
    """A progress bar at its total (tqdm's `67/67`)."""
    try:
        n, total = int(fields.get("n") or 0), int(fields.get("total") or 0)
    except (TypeError, ValueError):
        return False
    return total > 0 and n >= total


def _eta(fields: dict) -> float | None:  # type: ignore[type-arg]
    """Seconds left, from a bar's elapsed time and n/total (tqdm's own estimate)."""
    try:
        n, total = int(fields.get("n") or 0), int(fields.get("total") or 0)
        elapsed = float(fields.get("elapsed_s") or 0.0)
    except (TypeError, ValueError):
        return None
    if n <= 0 or total <= n or elapsed <= 0:
        return None
    return elapsed / n * (total - n)


def _short(line: str, limit: int = 120) -> str:
    line = line.strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
