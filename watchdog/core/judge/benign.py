"""The judge's last word: the state when no cause is named (core/judge/stages.py `benign`).

A leased operation that shows progress of its own is reported (crawling, loading,
compiling), never a hang; a measured stall is `stalled` unless a benign rule explains it.
"""

from __future__ import annotations

from watchdog.core.judge.context import Context
from watchdog.core.judge.matching import evaluate
from watchdog.core.knowledge.sigmodel import Benign
from watchdog.core.state.leases import Lease
from watchdog.core.states import State


def benign_state(ctx: Context, rules: tuple[Benign, ...]) -> tuple[State, str]:
    """The state no cause names: the server gone, a leased operation progressing, compilers
    running, a measured stall (unless a benign rule explains it), a phase, or work pending."""
    if ctx.gone:
        if ctx.obs.procs is not None and ctx.obs.procs.target_pid is None:
            return State.DEAD, "no server process found: nothing matches the target (yet)"
        return State.DEAD, "the server process is gone"
    lease = ctx.stall.lease or _progressing(ctx)
    if lease is not None:
        # A known long operation showing progress of its own: reported, never a hang.
        now = ctx.obs.t
        if lease.crawling(now):
            return State.CRAWLING, f"crawling: {lease.describe(now)}"
        return State(lease.op.state), lease.describe(now)
    if ctx.obs.procs is not None and ctx.obs.procs.compilers:
        return State.COMPILING, f"compiler processes running: {', '.join(ctx.obs.procs.compilers)}"
    if ctx.stall.stalled:
        return _stalled_or_benign_rule(ctx, rules)
    return _unstalled(ctx)


def _stalled_or_benign_rule(ctx: Context, rules: tuple[Benign, ...]) -> tuple[State, str]:
    """A measured stall, unless a benign rule of the knowledge explains it."""
    for rule in rules:
        ev = evaluate(rule.rule, ctx)
        if ev is not None:
            return State(rule.state), f"{rule.rule.label}: {ev.detail}"
    return State.STALLED, ctx.stall.detail


_PHASES = {
    "loading": (State.LOADING, "loading weights"),
    "compiling": (State.COMPILING, "compiling or capturing CUDA graphs"),
    "capturing": (State.COMPILING, "compiling or capturing CUDA graphs"),
    "starting": (State.STARTING, "waiting for the server to become ready"),
}


def _unstalled(ctx: Context) -> tuple[State, str]:
    """No stall measured: the startup phase, work pending below the threshold, or idle."""
    p, stall = ctx.window.progress, ctx.stall
    if p.phase in _PHASES:
        return _PHASES[p.phase]
    if not stall.pending:
        return State.IDLE, "no work pending"
    if (stall.seconds or 0.0) < ctx.th.suspect_after_s:
        return State.SERVING, f"work pending ({p.pending_why}), progressing"
    if stall.busy:
        return (
            State.SERVING,
            f"{stall.detail}, but the GPU is moving memory: a long batch, not a hang",
        )
    return State.SERVING, f"{stall.detail}; below the stall threshold"


def _progressing(ctx: Context) -> Lease | None:
    """A leased operation past its bound and still progressing (crawling), looked for only
    while no stall is measured and something is open (a phase before ready, a CDN socket)."""
    if ctx.stall.stalled or (ctx.window.progress.phase == "ready" and not ctx.obs.conns):
        return None
    now = ctx.obs.t
    return next((le for le in ctx.leases if le.crawling(now)), None)


__all__ = ["benign_state"]
