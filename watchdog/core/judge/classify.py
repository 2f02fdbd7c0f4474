"""The pure classifier: a window of observations and the signature data in, a Verdict out.

No clock, no I/O: the same window always gives the same verdict, so `replay` can re-run a
recorded incident and tests need no sleeping. The judge runs as ordered stages
(core/judge/stages.py) that each propose candidates; the first stage with any names the verdict,
its best candidate is picked here, and core/judge/candidate.py `build` is the one place the Verdict
is made.
"""

from __future__ import annotations

from watchdog.core.judge.candidate import Candidate, Shared, build
from watchdog.core.judge.causelive import with_cause
from watchdog.core.judge.context import Context, Stall
from watchdog.core.judge.ranks import Attribution, attribute, describe
from watchdog.core.judge.stages import STAGES, Case
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import Evidence, Observation, Verdict
from watchdog.core.state.rankprogress import describe_progress, rank_progress
from watchdog.core.state.window import Window
from watchdog.core.states import State
from watchdog.core.thresholds import Thresholds

UNKNOWN_CAUSE = "unknown"  # the verdict's signature when the evidence cannot decide the cause


def classify(window: Window, sigs: SignatureSet, th: Thresholds) -> Verdict:
    """The state of the server, and the best-matching signature with its evidence, with the
    root cause its log names (core/judge/causelive.py)."""
    return with_cause(_classify(window, sigs, th), window)


def _classify(window: Window, sigs: SignatureSet, th: Thresholds) -> Verdict:
    obs = window.latest
    if obs is None:
        return build(Candidate(State.STARTING, "no observations yet"), Shared())
    ctx = Context(window, obs, th, sigs.ops)
    ranks = _ranks(ctx, sigs)
    progress = rank_progress(window, th.gpu_busy_dram)
    per_rank = describe_progress(progress)
    shared = Shared(
        suspicious=ctx.stall.suspicious,
        seconds_since_progress=ctx.stall.seconds,
        progress_ratio=window.progress.ratio,
        ranks=ranks.views,
        cause_rank=ranks.cause_rank,
        cause_role=ranks.cause_role,
        waiting_ranks=ranks.waiting_ranks,
        rank_progress=progress,
        engine=_engine_label(window, obs),
        witnesses=ctx.stall.witnesses,
    )
    ranks_ev = _rank_evidence(ranks) + (
        (Evidence("ranks", "rank_progress", per_rank),) if per_rank else ()
    )
    case = Case(ctx, sigs, ranks_ev, _ras_evidence(ctx))
    for stage in STAGES:
        found = stage(case)
        if found:
            return build(pick(found), shared)
    raise AssertionError("the last stage always proposes a state")  # pragma: no cover


def pick(found: list[Candidate]) -> Candidate:
    """The best candidate by rank; when another of equal rank would have the operator do
    something else (another family), the evidence cannot decide: the cause is unknown."""
    best = max(found, key=lambda c: c.rank)
    rivals = [
        c
        for c in found
        if c.signature != best.signature
        and c.family != best.family
        and (c.rank[0], round(c.rank[1], 6)) == (best.rank[0], round(best.rank[1], 6))
    ]
    return _undecided(best, rivals) if rivals else best


def _undecided(best: Candidate, rivals: list[Candidate]) -> Candidate:
    """Two causes the evidence fits equally: the state stays, the cause is `unknown`, and the
    verdict lists what would decide it (each cause's rules that did not hold)."""
    fits = [best, *rivals]
    names = " or ".join(f"{c.title} ({c.signature})" for c in fits)
    decide = "; ".join(
        f"for {c.signature}: {', '.join(c.decides) if c.decides else 'no rule left unseen'}"
        for c in fits
    )
    evidence = tuple(dict.fromkeys(e for c in fits for e in c.evidence))  # in order, once
    would = Evidence("judge", "undecided", f"what would decide it: {decide}")
    title = f"cause unknown: the evidence fits {names} equally"
    return Candidate(
        state=best.state,
        reason=title,
        evidence=(would, *evidence),
        fix=(
            f"The evidence fits {names} equally, and they call for different fixes. "
            f"Look for what would decide it ({decide}) in the incident bundle before acting."
        ),
        signature=UNKNOWN_CAUSE,
        title=title,
        confidence=best.confidence,
        references=tuple(dict.fromkeys(r for c in fits for r in c.references)),
        priority=best.priority,
        rank=best.rank,
    )


def _engine_label(window: Window, obs: Observation) -> str:
    """ "sglang 0.5.23": the engine in force and the version the facts source read for it."""
    name = (obs.procs.engine if obs.procs is not None else "") or str(
        window.progress.facts.get("engine") or ""
    )
    if not name or name == "unknown":
        return ""
    facts = window.progress.facts
    version = facts.get("engine_version") if facts.get("engine") == name else None
    return f"{name} {version}" if isinstance(version, str) and version else name


def _ranks(ctx: Context, sigs: SignatureSet) -> Attribution:
    """Which rank is the cause, from the freshest stacks (nothing without stacks)."""
    procs = ctx.obs.procs.procs if ctx.obs.procs is not None else ()
    return attribute(procs, ctx.stacks, ctx.obs.gpus, ctx.obs.conns, kb=sigs.ranks)


def _ras_evidence(ctx: Context) -> tuple[Evidence, ...]:
    """NCCL's own view (sources/nccl_ras.py): dead, unresponsive and lagging ranks."""
    ras = ctx.obs.nccl_ras
    lines = ras.get("evidence") if isinstance(ras, dict) else None
    if not isinstance(lines, list):
        return ()
    return tuple(Evidence("nccl_ras", "nccl_ras", str(line)) for line in lines[:8])


def _rank_evidence(ranks: Attribution) -> tuple[Evidence, ...]:
    """Evidence only with peers waiting: alone, the rank's stack evidence already says it all."""
    line = describe(ranks) if ranks.waiting_ranks else ""
    return (Evidence("stacks", "rank_cause", line),) if line else ()


__all__ = ["Context", "Stall", "Thresholds", "classify"]
