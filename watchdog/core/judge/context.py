"""The derived views of a window that every evidence rule reads: thresholds, the stall, stacks.

Its own module so that the classifier and the evidence checks both import it, and neither
imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from watchdog.core.judge.derived import derived_lines
from watchdog.core.judge.spinsignals import spin_by
from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.model import Evidence, GpuSample, Observation, StackSample
from watchdog.core.state.leases import Lease, LeaseScan
from watchdog.core.state.logdumps import log_stacks
from watchdog.core.state.window import Window
from watchdog.core.thresholds import Thresholds


@dataclass(frozen=True)
class Stall:
    """How long the server has had work pending without progress, and whether that is a stall."""

    pending: bool
    seconds: float | None
    stalled: bool
    suspicious: bool
    busy: bool  # the GPU moves memory: a slow batch, not a hang
    detail: str
    # stall_after_s reached (not busy), whatever the GPU source: a stall whose cause is proven
    # is named now; without GPU figures and without proof `stalled` waits for the blind limit.
    due: bool = False
    witnesses: tuple[str, ...] = ()  # every witness of the pending work (core/state/witnesses.py)
    # proven_after_s reached (not busy): a cause that evidence proves is named from now on;
    # how soon depends on the proof, not on the unproven soft stage at stall_after_s.
    provable: bool = False
    # A known long operation that shows progress of its own holds the stall off (core/
    # leases.py): `lease` is the one that does now; `lapsed`, one that stopped showing any.
    lease: Lease | None = None
    lapsed: Lease | None = None


class Context:
    """Derived, cached views of the window for one classification."""

    def __init__(
        self, window: Window, obs: Observation, th: Thresholds, ops: tuple[OpDef, ...] = ()
    ) -> None:
        self.window, self.obs, self.th, self.ops = window, obs, th, ops
        self.gone = obs.procs is not None and not obs.procs.alive
        self.has_gpu = any(g.sm is not None for g in obs.gpus)
        self.stall = self._stall()

    def _stall(self) -> Stall:
        p, now = self.window.progress, self.obs.t
        pending_since, why, witnesses = p.pending_since, p.pending_why, p.pending_witnesses
        if not p.pending:
            # A kernel that spins on a GPU with compute processes is work in flight, whatever
            # the gauges say (TensorRT-LLM and SGLang write theirs after a batch returns).
            # Only while serving: CUDA-graph capture and warm-up spin the GPU on purpose.
            spun = self._spin_since() if p.phase == "ready" else None
            lapsed = self._lapsed() if spun is None else None
            overdue = self._load_overdue()
            if overdue is not None:
                why = f"{p.heartbeat_what or 'the launcher'} not ready past the loading deadline"
                pending_since, witnesses = overdue, (why,)
            elif lapsed is not None:
                # A known operation open with no progress of its own for its bound is work in
                # flight that does not move, whatever phase the server is in.
                why = f"{lapsed.op.what} open with no progress of its own"
                pending_since, witnesses = lapsed.last_t, (why,)
            elif spun is None or now - spun < self.th.gpu_spin_for_s:
                return Stall(False, None, False, False, False, "no work pending")
            else:
                why = "a GPU busy without memory traffic, with compute processes on it"
                pending_since, witnesses = spun, (why,)
        since = max(
            t for t in (p.last_progress_t, pending_since, self.window_start()) if t is not None
        )
        secs = max(0.0, now - since)
        held = self._held(now, secs)
        if held is not None and held[0] is not None:
            lease = held[0]
            detail = f"{why}, held by a lease: {lease.describe(now)}"
            return Stall(True, secs, False, False, False, detail, witnesses=witnesses, lease=lease)
        lapsed = held[1] if held is not None else None
        if lapsed is not None:
            # The stall clock runs from the last progress the operation showed.
            secs = max(0.0, now - max(since, lapsed.last_t))
        finished = self._scan.finished_t if held is not None else None
        if finished is not None and finished > now - secs:
            # An operation that held the stall finished: its end is progress (the canary sent
            # during a weight transfer answers after it, not before).
            secs = max(0.0, now - finished)
        busy = self._gpu_busy(now - self.th.stall_after_s)
        limit = self.th.stall_after_s if self.has_gpu else self.th.blind_stall_after_s
        detail = f"no progress for {secs:.0f} s with {why}"
        if p.last_progress_what:
            detail += f" (last progress: {p.last_progress_what})"
        stalled = secs >= limit and not busy
        suspicious = secs >= self.th.suspect_after_s and not busy
        due = secs >= self.th.stall_after_s and not busy
        provable = secs >= min(self.th.proven_after_s, self.th.stall_after_s) and not busy
        return Stall(
            True, secs, stalled, suspicious, busy, detail, due, witnesses, provable, None, lapsed
        )

    def _load_overdue(self) -> float | None:
        """When a launcher's wait for its shard (heartbeats, no load progress since) passed
        the loading deadline; None while within it, or with no such wait."""
        p = self.window.progress
        if p.heartbeat_since is None or p.phase == "ready":
            return None
        since = max(p.heartbeat_since, p.last_progress_t or p.heartbeat_since)
        due = since + self.th.load_deadline_s
        return due if self.obs.t >= due else None

    @cached_property
    def _scan(self) -> LeaseScan:
        """The leases over the window, from the state the window carried past its ring."""
        scan = LeaseScan(self.ops, self.window.carried)
        if scan.ops:
            for obs in self.window:
                scan.feed(obs)
        return scan

    @cached_property
    def leases(self) -> tuple[Lease, ...]:
        """The known long operations open now (core/state/leases.py) that the server has not moved
        past: one that showed no progress of its own since the server's last progress is
        not what holds it up (the rule `progress_after` applies to a replayed log). One that
        logs nothing until it ends (`start_holds`, a weight transfer) holds for its bound
        whatever answered meanwhile: a canary answered before the transfer paused the engine
        does not show the transfer done."""
        last, now = self.window.progress.last_progress_t, self.obs.t
        found = self._scan.leases()
        return tuple(
            le
            for le in found
            if last is None or le.last_t >= last or (le.op.start_holds and not le.lapsed(now))
        )

    def _lapsed(self) -> Lease | None:
        """With no other witness of work: an operation whose lease lapsed. Looked for only
        before the server is ready or while it holds a CDN socket (the cost of a scan)."""
        if not self.ops or (self.window.progress.phase == "ready" and not self.obs.conns):
            return None
        now = self.obs.t
        return next((le for le in self.leases if le.lapsed(now)), None)

    def _held(self, now: float, secs: float) -> tuple[Lease | None, Lease | None] | None:
        """(the lease holding the stall off, a lapsed one), looked for only once the stall
        would be suspicious; None before then."""
        if not self.ops or secs < self.th.suspect_after_s:
            return None
        holding = [le for le in self.leases if le.holds(now)]
        if holding:
            return max(holding, key=lambda le: le.last_t), None
        lapsed = [le for le in self.leases if le.lapsed(now)]
        return None, (max(lapsed, key=lambda le: le.last_t) if lapsed else None)

    def _spin_since(self) -> float | None:
        """When the newest unbroken run of spin-shaped samples on some GPU began, or None."""
        best: float | None = None
        for g in self.obs.gpus:
            start: float | None = None
            for o in reversed(list(self.window)):
                s = next((x for x in o.gpus if x.index == g.index), None)
                if s is None or spin_by(s, self.th) is None:
                    break
                start = o.t
            if start is not None and (best is None or start < best):
                best = start
        return best

    def window_start(self) -> float | None:
        first = next(iter(self.window), None)
        return first.t if first is not None else None

    def _gpu_busy(self, since: float) -> bool:
        recent = [g.dram for o in self.window.since(since) for g in o.gpus if g.dram is not None]
        return bool(recent) and max(recent) > self.th.gpu_busy_dram

    def recent(self, seconds: float) -> Iterable[Observation]:
        """The last `seconds` of the current server: a restart starts its evidence afresh
        (an old EngineDeadError must not keep a healthy new server `dead`)."""
        since = self.obs.t - seconds
        restarted = self.window.progress.restarted_t
        return self.window.since(since if restarted is None else max(since, restarted))

    @cached_property
    def stacks(self) -> tuple[StackSample, ...]:
        """The newest dumps, if taken since the server last made progress: a dump from before
        is a moment the server has since moved past, not evidence of this stall."""
        p = self.window.progress
        fresh = max((t for t in (p.last_progress_t, p.restarted_t) if t is not None), default=None)
        # Dumps the server wrote into its own log (SGLang's watchdog, faulthandler) count
        # too, after the watchdog's own (core/state/logdumps.py).
        since = [o for o in self.window if fresh is None or o.t >= fresh]
        from_log = log_stacks(ev for o in since for ev in o.logs if ev.kind == "stack")
        for o in reversed(since):
            if o.stacks:
                return o.stacks + from_log
        return from_log

    @cached_property
    def derived_lines(self) -> tuple[str, ...]:
        """Lines the window's log implies but no process wrote (core/judge/derived.py): ranks
        that diverged, a communicator set-up that failed."""
        return derived_lines([ev for o in self.recent(float("inf")) for ev in o.logs])

    def capture_problems(self) -> tuple[Evidence, ...]:
        errs = {(s.error, s.fix) for s in self.stacks if s.error}
        return tuple(
            Evidence("stacks", "capture", f"{e}. Fix: {f}" if f else e)
            for e, f in sorted(errs, key=str)
        )

    def gpu_figures(self) -> tuple[Evidence, ...]:
        return tuple(
            Evidence("gpu", "gpu", f"GPU {g.index}: SM {g.sm:.2f}, {_memory(g)} ({g.method})")
            for g in self.obs.gpus
            if g.sm is not None
        )


def _memory(g: GpuSample) -> str:
    """DRAM and power: what kept a busy GPU from being called a spin (core/judge/spinsignals.py)."""
    power = "power unknown"
    if g.power_w is not None:
        limit = f" of {g.power_limit_w:.0f} W" if g.power_limit_w else " (limit unknown)"
        power = f"power {g.power_w:.0f} W{limit}"
    tensor = "" if g.tensor is None else f", tensor {g.tensor:.2f}"
    if g.dram is not None:
        return f"DRAM {g.dram:.2f}, {power}{tensor}"
    return f"no DRAM figures, {power}{tensor}"


__all__ = ["Context", "Stall", "Thresholds"]
