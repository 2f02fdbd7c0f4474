"""One signature against one window: its rules' evidence, and whether that evidence proves it.

A signature whose evidence holds but proves nothing yet (a download stack and no socket or log
line, before the blind limit) is returned as a suspect, not dropped: the judge's soft stage
names the stall with it (core/judge/stages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.core.judge.context import Context
from watchdog.core.judge.evidence import EVALUATORS, HELD, SOURCE, UNCHANGED
from watchdog.core.knowledge.signatures import Rule, Signature
from watchdog.core.model import Evidence

DEATHS = frozenset({"crash", "dead"})  # signature states that name a death, not its cause


@dataclass(frozen=True)
class Match:
    """A signature whose rules hold: proven (named now) or a suspect (not proven yet)."""

    sig: Signature
    confidence: float
    evidence: tuple[Evidence, ...]
    proven: bool
    # The labels of its evidence rules that did not hold: what would add to its case.
    missing: tuple[str, ...] = ()


def match(sig: Signature, ctx: Context, dying: bool = False) -> Match | None:
    """`dying`: the server died; only a cause proven by evidence from before counts."""
    st = ctx.stall
    if sig.when == "stalled" and not (st.stalled or st.provable or dying):
        return None
    if any(evaluate(r, ctx) is not None for r in sig.unless):
        return None
    pairs: list[tuple[Rule, Evidence]] = []
    missing: list[str] = []
    for rule in sig.evidence:
        ev = evaluate(rule, ctx)
        if ev is None and rule.required:
            return None
        if ev is not None:
            pairs.append((rule, ev))
        elif rule.label:
            missing.append(rule.label)
    found = [ev for _, ev in pairs]
    conf = sum(e.weight for e in found)
    if conf + 1e-9 < sig.min_confidence:
        return None
    stall_matters = sig.when == "stalled" or any(r.kind == "no_progress" for r, _ in pairs)
    if dying or (stall_matters and not st.stalled):
        # Past stall_after_s but before the blind limit (no GPU figures): only a cause the
        # evidence proves is named now; the GPU adds nothing to a proof of a download or a wait.
        proof = _proof(pairs)
        if proof is None:
            return None if dying else Match(sig, conf, tuple(found), False, tuple(missing))
        found.append(Evidence("progress", "proof", f"cause proven by {proof}"))
    return Match(sig, conf, tuple(found), True, tuple(missing))


def cause_of_death(ctx: Context, sigs: tuple[Signature, ...]) -> Match | None:
    """The proven cause of a stall the server died in (FlashInfer gave up after its retries and
    the scheduler raised; a collective timed out and the worker aborted), or None."""
    found = [
        m
        for s in sigs
        if s.state not in DEATHS
        for m in (match(s, ctx, dying=True),)
        if m is not None
    ]
    return max(found, key=lambda m: (m.sig.priority, m.confidence)) if found else None


def consequence(sig: Signature, ev: tuple[Evidence, ...], engine: str) -> tuple[Evidence, ...]:
    """The death, as consequence lines under the cause."""
    title = sig.text_for(engine).title
    lines = [e for e in ev if e.kind != "proof"][:2] or [Evidence("procs", "", "")]
    return tuple(
        Evidence(e.source, "consequence", f"then {title} ({sig.id}): {e.detail}".rstrip(": "))
        for e in lines
    )


def _proof(pairs: list[tuple[Rule, Evidence]]) -> str | None:
    """What proves the cause without GPU figures, or None: the engine's own decisive words; a
    stack rule that holds only on a thread unchanged across two dumps (a collective frame on
    the waiting ranks); a stack unchanged across two dumps with a matching socket or log line."""
    for rule, _ in pairs:
        if rule.kind == "log" and rule.decisive:
            return f"the server's own words ({rule.label})"
        if rule.kind == "stack" and rule.unchanged:
            return f"{rule.label}, unchanged across two dumps"
    stuck = next(
        (
            r
            for r, ev in pairs
            if r.kind == "stack" and (UNCHANGED in ev.detail or HELD in ev.detail)
        ),
        None,
    )
    other = next((r for r, _ in pairs if r.kind in ("cdn_socket", "log")), None)
    if stuck is not None and other is not None:
        return f"{stuck.label} (in that frame in both dumps) with {other.label}"
    return None


def evaluate(rule: Rule, ctx: Context) -> Evidence | None:
    """Evidence for one rule, or None when it does not hold."""
    detail = EVALUATORS[rule.kind](rule, ctx)
    if detail is None:
        return None
    source = SOURCE[rule.kind]
    return Evidence(
        source=source, kind=rule.kind, detail=f"{rule.label}: {detail}", weight=rule.weight
    )


__all__ = ["DEATHS", "Match", "cause_of_death", "consequence", "evaluate", "match"]
