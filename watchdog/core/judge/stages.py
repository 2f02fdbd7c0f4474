"""The judge's stages, in the order classify() asks them: each returns candidates, or none.

1. `signatures`: deaths and proven causes (a death keeps the cause proven before it);
2. `stopped`: a process of the server in state T;
3. `stuck`: a stall inside an operation the log opened (its signature) or one that lapsed;
4. `soft`: a stall with a suspected cause not proven yet (the soft stage, at stall_after_s);
5. `benign`: what the leases, the phase and the work pending say (the stall, or no alarm),
   with the generic class the live log shows when no signature named a cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from watchdog.core.judge.benign import benign_state
from watchdog.core.judge.candidate import Candidate
from watchdog.core.judge.context import Context
from watchdog.core.judge.genericlive import with_generic
from watchdog.core.judge.matching import DEATHS, Match, cause_of_death, consequence, match
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.knowledge.sigtext import fill
from watchdog.core.model import Evidence
from watchdog.core.redact import redact_argv
from watchdog.core.state.openops import open_operations, stuck_cause
from watchdog.core.states import State

STALLED_FIX = (
    "The server has work pending and has made no progress, and no known signature matched. "
    "Read the stacks in the incident bundle (py-spy), check the server log, and restart it if "
    "it does not recover."
)
STOPPED_FIX = (
    "A process of the server is stopped (state T: SIGSTOP, Ctrl-Z, or a debugger that stopped "
    "it), so it makes no progress whatever it was doing. Resume it with `kill -CONT PID` (or "
    "detach the debugger); restarting is not needed."
)
STOPPED_STATUS = "stopped"  # psutil.STATUS_STOPPED; "tracing-stop" (py-spy's pause) is not it


@dataclass
class Case:
    """One window under judgement: the context and what more than one stage reads."""

    ctx: Context
    sigs: SignatureSet
    ranks_ev: tuple[Evidence, ...]  # the cause rank and each rank's progress, when known
    ras_ev: tuple[Evidence, ...]  # NCCL's own view of the ranks

    @property
    def engine(self) -> str:
        procs = self.ctx.obs.procs
        return procs.engine if procs is not None else ""

    @cached_property
    def matches(self) -> tuple[Match, ...]:
        """Every signature whose rules hold, proven or suspected (core/judge/matching.py)."""
        found = (match(s, self.ctx) for s in self.sigs.signatures)
        return tuple(m for m in found if m is not None)

    @cached_property
    def suspect(self) -> Match | None:
        """The highest-priority cause whose evidence holds but is no proof yet."""
        suspects = [] if self.ctx.gone else [m for m in self.matches if not m.proven]
        return max(suspects, key=lambda m: m.sig.priority) if suspects else None

    @cached_property
    def benign(self) -> tuple[State, str]:
        """The state the leases, the phase and the work pending say, and why."""
        return benign_state(self.ctx, self.sigs.benign)

    @cached_property
    def soft(self) -> bool:
        """A suspected cause past stall_after_s while the stall is not yet measured."""
        due = self.ctx.stall.due
        return self.suspect is not None and self.benign[0] == State.SERVING and due

    @property
    def stalled(self) -> bool:
        return self.benign[0] == State.STALLED or self.soft

    def unknown_engine(self) -> str:
        """What a verdict could not use when no engine profile matched the server."""
        if self.engine != "unknown":
            return ""
        return (
            " (engine not recognised: watched with the generic signals only; missing the "
            "engine's progress counters in /metrics, its stats lines in the log and its process "
            "roles; give --engine or add a profile with --engines FILE)"
        )


Stage = Callable[[Case], list[Candidate]]


def signatures(case: Case) -> list[Candidate]:
    """Deaths and proven causes; a hang that ends in a crash keeps its cause, the death is
    its consequence."""
    return [_named(case, m) for m in case.matches if m.proven]


def _named(case: Case, m: Match) -> Candidate:
    ctx, sig, conf, ev = case.ctx, m.sig, m.confidence, m.evidence
    state = State(("dead" if ctx.gone else "hung") if sig.state == "crash" else sig.state)
    if sig.state in DEATHS:
        cause = _cause_of_death(case, m)
        if cause is not None:
            ev = cause.evidence + consequence(sig, ev, case.engine)
            sig, conf = cause.sig, cause.confidence
    text = sig.text_for(case.engine)
    title = fill(text.title, ctx.window.progress.facts)
    # The GPU figures as context when no GPU rule spoke (a download stall's idle GPU).
    gpu = () if any(e.source == "gpu" for e in ev) else ctx.gpu_figures()
    return Candidate(
        state=state,
        signature=sig.id,
        title=title,
        confidence=round(min(conf, 1.0), 3),
        evidence=ev + case.ranks_ev + case.ras_ev + gpu + ctx.capture_problems(),
        priority=sig.priority,
        fix=text.fix,
        commands=text.commands,
        references=sig.references,
        fallback=sig.fallback,
        reason=title + case.unknown_engine(),
        rank=(m.sig.priority, m.confidence),
        family=sig.fallback or "",
        decides=m.missing,
    )


def _cause_of_death(case: Case, death: Match) -> Match | None:
    """A hang proven by the death, else, for a death that is a consequence (engine_dead,
    engine_worker_failed), a cause named beside it (a communicator that never came up, a JIT
    toolchain that is missing), as `replay` ranks it (core/judge/logverdict.py causes_first)."""
    hang = cause_of_death(case.ctx, case.sigs.signatures)
    if hang is not None or not death.sig.consequence:
        return hang
    named = [
        c
        for c in case.matches
        if c.proven and c.sig.state in DEATHS and not c.sig.consequence and c.sig != death.sig
    ]
    return max(named, key=lambda c: (c.sig.priority, c.confidence)) if named else None


def stopped(case: Case) -> list[Candidate]:
    """A process of the server stopped (state T) in the last two observations."""
    found = None if case.ctx.gone else _stopped(case.ctx)
    if found is None:
        return []
    ev = (Evidence("procs", "stopped", found),)
    return [Candidate(State.STALLED, found, evidence=ev, fix=STOPPED_FIX)]


def _stopped(ctx: Context) -> str | None:
    obs = ctx.window.last(2)
    if len(obs) < 2 or any(o.procs is None or not o.procs.alive for o in obs):
        return None
    both = [
        {p.pid: p for p in o.procs.procs if p.status == STOPPED_STATUS}
        for o in obs
        if o.procs is not None
    ]
    pids = sorted(set(both[0]) & set(both[1]))
    if not pids:
        return None
    p = both[1][pids[0]]
    more = f" (and {len(pids) - 1} more)" if len(pids) > 1 else ""
    # The title is the command line, which may carry a secret (--api-key VALUE): redacted.
    title = " ".join(redact_argv((p.title or p.name).split()))
    title = title if len(title) <= 80 else title[:77] + "..."
    return f"pid {p.pid} ({title}) is stopped (state T){more}"


def stuck(case: Case) -> list[Candidate]:
    """A stall inside an operation the log opened, or one whose own progress lapsed."""
    if not case.stalled:
        return []
    named = _open_operation(case) or _wedged(case.ctx)
    return [named] if named is not None else []


def _open_operation(case: Case) -> Candidate | None:
    """A stall that lasts inside an operation the log started and never finished (a cubin
    fetch, a communicator init, a JIT build) is named by the signature that operation points
    to, the same evidence `replay --stuck` uses (core/state/openops.py)."""
    ctx, sigs = case.ctx, case.sigs
    # Only what started since the server last made progress: an operation it moved past is
    # not what blocks it (the same rule as `progress_after` in a replayed log).
    since = ctx.window.progress.last_progress_t
    lines = [
        ev.line
        for o in ctx.window
        if since is None or o.t >= since
        for ev in o.logs
        if ev.kind != "stack"
    ]
    cause = stuck_cause(open_operations(lines, sigs.ops))
    sig = sigs.get(cause.signature or "") if cause is not None else None
    if cause is None or sig is None:
        return None
    opened = f"open operation: {cause.describe()}: {cause.line!r}"
    evidence = (
        Evidence("log", "open_operation", opened, 0.3),
        Evidence("progress", "no_progress", ctx.stall.detail, 0.2),
    )
    return Candidate(
        state=State.HUNG,
        signature=sig.id,
        title=sig.title,
        confidence=0.5,
        evidence=evidence + ctx.gpu_figures() + ctx.capture_problems(),
        fix=sig.fix,
        commands=sig.commands,
        references=sig.references,
        fallback=sig.fallback,
        reason=f"stalled inside an unfinished {cause.op.what}",
        priority=sig.priority,
    )


def _wedged(ctx: Context) -> Candidate | None:
    """A stall inside a known long operation that stopped showing progress of its own, when
    no signature names its cause: the hang, named by the operation."""
    lapsed = ctx.stall.lapsed
    if lapsed is None:
        return None
    quiet = lapsed.op.quiet_s or 0.0
    line = (
        f"wedged: {lapsed.op.what} showed no progress of its own for "
        f"{ctx.obs.t - lapsed.last_t:.0f} s (its bound: {quiet:.0f} s)"
    )
    evidence = (
        Evidence("log", "wedged", f"{line}; {lapsed.describe(ctx.obs.t)}", 0.3),
        Evidence("progress", "no_progress", ctx.stall.detail, 0.2),
        *ctx.gpu_figures(),
        *ctx.capture_problems(),
    )
    return Candidate(State.STALLED, line, evidence=evidence, fix=STALLED_FIX)


def soft(case: Case) -> list[Candidate]:
    """Cause evidence without proof (a download stack and no socket or log line): the soft
    stage now, not after the blind limit; the cause is named once something proves it."""
    if not case.soft or case.suspect is None:
        return []
    sig, ev = case.suspect.sig, case.suspect.evidence
    reason = (
        f"{case.ctx.stall.detail}; suspected: {sig.title} ({sig.id}), not proven yet: "
        + "; ".join(e.detail for e in ev if e.kind != "no_progress")
    )
    return [_plain(case, State.STALLED, reason)]


def benign(case: Case) -> list[Candidate]:
    """The state without a named cause: a stall, or what the server is busy with."""
    state, reason = case.benign
    return [_plain(case, state, reason)]


def _plain(case: Case, state: State, reason: str) -> Candidate:
    """A candidate no signature named, with the generic class the live log shows, if any."""
    ctx = case.ctx
    c = Candidate(state, reason)
    if state == State.STALLED:
        suspected = case.suspect.evidence if case.suspect is not None else ()
        evidence = (
            (Evidence("progress", "no_progress", ctx.stall.detail),)
            + case.ranks_ev
            + case.ras_ev
            + ctx.gpu_figures()
            + ctx.capture_problems()
            + tuple(e for e in suspected if e.kind != "no_progress")
        )
        c = Candidate(state, reason + case.unknown_engine(), evidence=evidence, fix=STALLED_FIX)
    elif state == State.CRAWLING:
        # The operation against its bound, its rate and ETA: what an operator reads to wait.
        c = Candidate(state, reason, evidence=(Evidence("log", "crawling", reason),))
    # No signature named a cause: the class the live log shows, if any (core/judge/genericlive.py).
    return with_generic(c, ctx.window, case.sigs, ctx.th.load_deadline_s)


# The order is the judge's: the first stage with a candidate names the verdict.
STAGES: tuple[Stage, ...] = (signatures, stopped, stuck, soft, benign)

__all__ = ["STAGES", "STALLED_FIX", "STOPPED_FIX", "Case", "Stage"]
