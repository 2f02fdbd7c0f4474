"""The pure classifier: a window of observations and the signature data in, a Verdict out.

No clock, no I/O: the same window always gives the same verdict, so `replay` can re-run a
recorded incident and tests need no sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from watchdog.config import Config
from watchdog.evidence import EVALUATORS, SOURCE
from watchdog.model import Evidence, Observation, StackSample, Verdict
from watchdog.signatures import Rule, Signature, SignatureSet
from watchdog.window import Window

STALLED_FIX = (
    "The server has work pending and has made no progress, and no known signature matched. "
    "Read the stacks in the incident bundle (py-spy), check the server log, and restart it if "
    "it does not recover."
)


@dataclass(frozen=True)
class Thresholds:
    """The numbers classification depends on (all from the config)."""

    stall_after_s: float = 15.0
    suspect_after_s: float = 8.0
    blind_stall_after_s: float = 120.0
    gpu_spin_sm: float = 0.9
    gpu_spin_dram: float = 0.05
    gpu_spin_for_s: float = 10.0
    gpu_busy_dram: float = 0.15

    @classmethod
    def from_config(cls, cfg: Config) -> Thresholds:
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Stall:
    """How long the server has had work pending without progress, and whether that is a stall."""

    pending: bool
    seconds: float | None
    stalled: bool
    suspicious: bool
    busy: bool  # the GPU moves memory: a slow batch, not a hang
    detail: str


def classify(window: Window, sigs: SignatureSet, th: Thresholds) -> Verdict:
    """The state of the server, and the best-matching signature with its evidence."""
    obs = window.latest
    if obs is None:
        return Verdict(state="starting", reason="no observations yet")
    ctx = Context(window, obs, th)
    stall = ctx.stall
    common = {
        "suspicious": stall.suspicious,
        "seconds_since_progress": stall.seconds,
        "progress_ratio": window.progress.ratio,
    }
    matches = [m for m in (_match(s, ctx) for s in sigs.signatures) if m is not None]
    if matches:
        sig, conf, ev = max(matches, key=lambda m: (m[0].priority, m[1]))
        state = ("dead" if ctx.gone else "hung") if sig.state == "crash" else sig.state
        return Verdict(
            state=state,
            signature=sig.id,
            title=sig.title,
            confidence=round(min(conf, 1.0), 3),
            # The GPU figures as context when no GPU rule spoke (a download stall's idle GPU).
            evidence=tuple(ev)
            + (() if any(e.source == "gpu" for e in ev) else ctx.gpu_figures())
            + ctx.capture_problems(),
            fix=sig.fix,
            commands=sig.commands,
            references=sig.references,
            fallback=sig.fallback,
            reason=sig.title,
            **common,  # type: ignore[arg-type]
        )
    state, reason = _benign_state(ctx, sigs)
    evidence: tuple[Evidence, ...] = ()
    if state == "stalled":
        evidence = (
            (Evidence("progress", "no_progress", stall.detail),)
            + ctx.gpu_figures()
            + ctx.capture_problems()
        )
    return Verdict(
        state=state,
        reason=reason,
        evidence=evidence,
        fix=STALLED_FIX if state == "stalled" else "",
        **common,  # type: ignore[arg-type]
    )


def _benign_state(ctx: Context, sigs: SignatureSet) -> tuple[str, str]:
    p, stall = ctx.window.progress, ctx.stall
    if ctx.gone:
        return "dead", "the server process is gone"
    if ctx.obs.procs is not None and ctx.obs.procs.compilers:
        return "compiling", f"compiler processes running: {', '.join(ctx.obs.procs.compilers)}"
    if stall.stalled:
        for rule in sigs.benign:
            ev = _eval(rule.rule, ctx)
            if ev is not None:
                return rule.state, f"{rule.rule.label}: {ev.detail}"
        return "stalled", stall.detail
    if p.phase == "loading":
        return "loading", "loading weights"
    if p.phase in ("compiling", "capturing"):
        return "compiling", "compiling or capturing CUDA graphs"
    if p.phase == "starting":
        return "starting", "waiting for the server to become ready"
    if stall.pending:
        if (stall.seconds or 0.0) < ctx.th.suspect_after_s:
            return "serving", f"work pending ({p.pending_why}), progressing"
        if stall.busy:
            return (
                "serving",
                f"{stall.detail}, but the GPU is moving memory: a long batch, not a hang",
            )
        return "serving", f"{stall.detail}; below the stall threshold"
    return "idle", "no work pending"


def _match(sig: Signature, ctx: Context) -> tuple[Signature, float, list[Evidence]] | None:
    if sig.when == "stalled" and not ctx.stall.stalled:
        return None
    if any(_eval(r, ctx) is not None for r in sig.unless):
        return None
    found: list[Evidence] = []
    for rule in sig.evidence:
        ev = _eval(rule, ctx)
        if ev is None and rule.required:
            return None
        if ev is not None:
            found.append(ev)
    conf = sum(e.weight for e in found)
    if conf + 1e-9 < sig.min_confidence:
        return None
    return sig, conf, found


def _eval(rule: Rule, ctx: Context) -> Evidence | None:
    """Evidence for one rule, or None when it does not hold."""
    detail = EVALUATORS[rule.kind](rule, ctx)
    if detail is None:
        return None
    source = SOURCE[rule.kind]
    return Evidence(
        source=source, kind=rule.kind, detail=f"{rule.label}: {detail}", weight=rule.weight
    )


class Context:
    """Derived, cached views of the window for one classification."""

    def __init__(self, window: Window, obs: Observation, th: Thresholds) -> None:
        self.window, self.obs, self.th = window, obs, th
        self.gone = obs.procs is not None and not obs.procs.alive
        self.has_gpu = any(g.sm is not None for g in obs.gpus)
        self.stall = self._stall()

    def _stall(self) -> Stall:
        p, now = self.window.progress, self.obs.t
        if not p.pending:
            return Stall(False, None, False, False, False, "no work pending")
        since = max(
            t for t in (p.last_progress_t, p.pending_since, self.window_start()) if t is not None
        )
        secs = max(0.0, now - since)
        busy = self._gpu_busy(now - self.th.stall_after_s)
        limit = self.th.stall_after_s if self.has_gpu else self.th.blind_stall_after_s
        detail = f"no progress for {secs:.0f} s with {p.pending_why}"
        if p.last_progress_what:
            detail += f" (last progress: {p.last_progress_what})"
        stalled = secs >= limit and not busy
        return Stall(
            True, secs, stalled, secs >= self.th.suspect_after_s and not busy, busy, detail
        )

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
        for o in reversed(list(self.window)):
            if fresh is not None and o.t < fresh:
                return ()
            if o.stacks:
                return o.stacks
        return ()

    def capture_problems(self) -> tuple[Evidence, ...]:
        errs = {(s.error, s.fix) for s in self.stacks if s.error}
        return tuple(
            Evidence("stacks", "capture", f"{e}. Fix: {f}" if f else e)
            for e, f in sorted(errs, key=str)
        )

    def gpu_figures(self) -> tuple[Evidence, ...]:
        return tuple(
            Evidence("gpu", "gpu", f"GPU {g.index}: SM {g.sm:.2f}, DRAM {g.dram:.2f} ({g.method})")
            for g in self.obs.gpus
            if g.sm is not None and g.dram is not None
        )
