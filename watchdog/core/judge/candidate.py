"""What a stage of the judge proposes, and the one place a Verdict is built from it.

Each stage of classify() (core/judge/stages.py) returns candidates; classify() picks one and
`build` turns it, with the facts every verdict carries (`Shared`), into the Verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.core.model import Evidence, RankProgress, RankView, Verdict
from watchdog.core.states import State


@dataclass(frozen=True)
class Candidate:
    """A state and why, with the cause when a signature names one."""

    state: State
    reason: str
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""
    signature: str | None = None
    title: str = ""
    confidence: float = 0.0
    commands: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    fallback: str | None = None
    priority: int = 0
    # How candidates of one stage are ranked: (priority, confidence) of the match that
    # proposed it (a death keeps its own rank when its proven cause is named instead).
    rank: tuple[int, float] = (0, 0.0)
    # Candidates of one family would have the operator do the same thing (the same
    # fallback): between two of them the evidence need not decide.
    family: str = ""
    # What would add to this cause's case: the labels of its rules that did not hold.
    decides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shared:
    """What every verdict of one window carries, whichever stage named it."""

    suspicious: bool = False
    seconds_since_progress: float | None = None
    progress_ratio: float | None = None
    ranks: tuple[RankView, ...] = ()
    cause_rank: int | None = None
    cause_role: str = ""
    waiting_ranks: tuple[int, ...] = ()
    rank_progress: tuple[RankProgress, ...] = ()
    engine: str = ""
    witnesses: tuple[str, ...] = ()


def build(c: Candidate, s: Shared) -> Verdict:
    """The Verdict: the only place classify() makes one."""
    return Verdict(
        state=c.state,
        signature=c.signature,
        title=c.title,
        confidence=c.confidence,
        evidence=c.evidence,
        fix=c.fix,
        commands=c.commands,
        references=c.references,
        fallback=c.fallback,
        reason=c.reason,
        priority=c.priority,
        suspicious=s.suspicious,
        seconds_since_progress=s.seconds_since_progress,
        progress_ratio=s.progress_ratio,
        ranks=s.ranks,
        cause_rank=s.cause_rank,
        cause_role=s.cause_role,
        waiting_ranks=s.waiting_ranks,
        rank_progress=s.rank_progress,
        engine=s.engine,
        witnesses=s.witnesses,
    )


__all__ = ["Candidate", "Shared", "build"]
