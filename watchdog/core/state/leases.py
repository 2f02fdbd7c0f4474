"""Leases: a known long operation that shows progress of its own holds off the stall (pure).

A FlashInfer autotune, a JIT build, a cubin download or a weight load can run for minutes with
no progress the engine's own counters show. While it shows progress of its own (its bar or
milestone lines, bytes received on its CDN socket, live compiler children) it holds a lease:
the stall deadline waits for it, and past its bound (`bound_s`) it is `crawling`. Once it
shows none for `quiet_s` the lease lapses and the stall clock runs from the last progress it
showed: the hang (wedged). The operations and their bounds are data (openops.toml).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.model import Connection, Observation
from watchdog.core.state.events import READY_MILESTONES
from watchdog.core.state.openops import who_of


@dataclass(frozen=True)
class Lease:
    """One known long operation open now, and the last progress of its own it showed."""

    op: OpDef
    started_t: float
    last_t: float
    last_what: str
    bytes_per_s: float | None = None  # its socket's receive rate, over the window
    eta_s: float | None = None  # from its bar's rate and total, when it has one
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
            text += ", ETA unknown (the download's size is not visible to the watchdog)"
        return text


@dataclass
class _Open:
    whos: set[str]  # the processes that have it open ("" when the log does not say)
    started_t: float
    last_t: float
    last_what: str
    eta_s: float | None = None
    shown: bool = False


def leases(observations: Iterable[Observation], ops: Sequence[OpDef]) -> tuple[Lease, ...]:
    """The operations with a lease (a `quiet_s`) open at the end of `observations`, in op
    order. An operation opens at its start line, or at a first sign of its own progress when
    its start is older than the window; its end (or fail) lines close it."""
    leased = [op for op in ops if op.quiet_s is not None]
    if not leased:
        return ()
    opened: dict[str, _Open] = {}
    prev_bytes: dict[tuple[int, str, int], int] = {}
    first_bytes: tuple[float, int] | None = None
    last_bytes: tuple[float, int] | None = None
    prev_t: float | None = None
    for obs in observations:
        for ev in obs.logs:
            if ev.kind == "milestone" and ev.fields.get("name") in READY_MILESTONES:
                for op in leased:
                    if op.startup:  # the server is up: its startup steps are over
                        opened.pop(op.id, None)
            elif ev.kind != "stack":
                for op in leased:
                    _on_line(opened, op, ev.line, obs.t, ev.fields)
        received = _received(obs.conns, prev_bytes)
        dt, prev_t = (obs.t - prev_t if prev_t is not None else 0.0), obs.t
        total = sum(c.bytes_received or 0 for c in obs.conns)
        if obs.conns and any(c.bytes_received is not None for c in obs.conns):
            first_bytes = first_bytes or (obs.t, total)
            last_bytes = (obs.t, total)
        compilers = obs.procs.compilers if obs.procs is not None else ()
        for op in leased:
            fast = dt > 0 and received / dt >= op.min_bytes_per_s
            if received and fast and "socket_bytes" in op.signals:
                started = obs.t - max((c.age_s for c in obs.conns), default=0.0)
                _progress(opened, op, obs.t, f"{received} bytes received on its socket", started)
            if compilers and "compilers" in op.signals and op.id in opened:
                _progress(opened, op, obs.t, f"compiler children alive: {', '.join(compilers)}")
    rate = None
    if first_bytes and last_bytes and last_bytes[0] > first_bytes[0]:
        rate = max(0.0, (last_bytes[1] - first_bytes[1]) / (last_bytes[0] - first_bytes[0]))
    return tuple(
        Lease(
            op,
            o.started_t,
            o.last_t,
            o.last_what,
            bytes_per_s=rate if "socket_bytes" in op.signals else None,
            eta_s=o.eta_s,
            shown=o.shown,
        )
        for op in leased
        if (o := opened.get(op.id)) is not None
    )


def _on_line(opened: dict[str, _Open], op: OpDef, line: str, t: float, fields: dict) -> None:  # type: ignore[type-arg]
    if op.end.search(line) or (op.fail is not None and op.fail.search(line)):
        o = opened.get(op.id)
        if o is not None:
            who = who_of(line)
            if who and who in o.whos:
                o.whos.discard(who)
            else:
                o.whos.clear()
            if not o.whos:
                del opened[op.id]
        return
    moving = op.start.search(line) or (op.progress is not None and op.progress.search(line))
    if moving and _complete(fields):  # its bar reached its total: done, whatever end follows
        opened.pop(op.id, None)
        return
    if op.start.search(line):
        o = opened.get(op.id)
        if o is None:
            opened[op.id] = _Open({who_of(line)}, t, t, _short(line))
        else:
            # Its start line again (a bar whose description is the start, another rank): moving.
            o.whos.add(who_of(line))
            o.last_t, o.last_what, o.shown = t, _short(line), True
        return
    if op.progress is not None and op.progress.search(line):
        _progress(opened, op, t, _short(line))
        opened[op.id].eta_s = _eta(fields)


def _progress(
    opened: dict[str, _Open], op: OpDef, t: float, what: str, started: float | None = None
) -> None:
    o = opened.get(op.id)
    if o is None:
        o = opened[op.id] = _Open({""}, t if started is None else min(t, started), t, what)
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
