"""The pure classifier: a window of observations and the signature data in, a Verdict out.

No clock, no I/O: the same window always gives the same verdict, so `replay` can re-run a
recorded incident and tests need no sleeping.
"""

from __future__ import annotations

from watchdog.core.causelive import with_cause
from watchdog.core.context import Context, Stall, Thresholds
from watchdog.core.evidence import EVALUATORS, HELD, SOURCE, UNCHANGED
from watchdog.core.genericlive import with_generic
from watchdog.core.leases import Lease
from watchdog.core.model import Evidence, Observation, Verdict
from watchdog.core.openops import open_operations, stuck_cause
from watchdog.core.rankprogress import describe_progress, rank_progress
from watchdog.core.ranks import Attribution, attribute, describe
from watchdog.core.redact import redact_argv
from watchdog.core.signatures import Rule, Signature, SignatureSet
from watchdog.core.sigtext import fill
from watchdog.core.window import Window

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


def classify(window: Window, sigs: SignatureSet, th: Thresholds) -> Verdict:
    """The state of the server, and the best-matching signature with its evidence, with the
    root cause its log names (core/causelive.py)."""
    return with_cause(_classify(window, sigs, th), window)


def _classify(window: Window, sigs: SignatureSet, th: Thresholds) -> Verdict:
    obs = window.latest
    if obs is None:
        return Verdict(state="starting", reason="no observations yet")
    ctx = Context(window, obs, th, sigs.ops)
    stall = ctx.stall
    ranks = _ranks(ctx, sigs)
    progress = rank_progress(window, th.gpu_busy_dram)
    common = {
        "suspicious": stall.suspicious,
        "seconds_since_progress": stall.seconds,
        "progress_ratio": window.progress.ratio,
        "ranks": ranks.views,
        "cause_rank": ranks.cause_rank,
        "cause_role": ranks.cause_role,
        "waiting_ranks": ranks.waiting_ranks,
        "rank_progress": progress,
        "engine": _engine_label(window, obs),
        "witnesses": stall.witnesses,
    }
    per_rank = describe_progress(progress)
    ranks_ev = _rank_evidence(ranks) + (
        (Evidence("ranks", "rank_progress", per_rank),) if per_rank else ()
    )
    matches = [m for m in (_match(s, ctx) for s in sigs.signatures) if m is not None]
    if matches:
        sig, conf, ev = max(matches, key=lambda m: (m[0].priority, m[1]))
        state = ("dead" if ctx.gone else "hung") if sig.state == "crash" else sig.state
        if sig.state in DEATHS:
            # A hang that ends in a crash keeps its cause: the death is its consequence.
            cause = _cause_of_death(ctx, sigs)
            if cause is not None:
                ev = cause[2] + _consequence(sig, ev, _engine(obs))
                sig, conf = cause[0], cause[1]
        text = sig.text_for(_engine(obs))
        title = fill(text.title, window.progress.facts)
        return Verdict(
            state=state,
            signature=sig.id,
            title=title,
            confidence=round(min(conf, 1.0), 3),
            # The GPU figures as context when no GPU rule spoke (a download stall's idle GPU).
            evidence=tuple(ev)
            + ranks_ev
            + _ras_evidence(ctx)
            + (() if any(e.source == "gpu" for e in ev) else ctx.gpu_figures())
            + ctx.capture_problems(),
            priority=sig.priority,
            fix=text.fix,
            commands=text.commands,
            references=sig.references,
            fallback=sig.fallback,
            reason=title + _unknown_engine(obs),
            **common,  # type: ignore[arg-type]
        )
    stopped = None if ctx.gone else _stopped(window)
    if stopped is not None:
        return Verdict(
            state="stalled",
            reason=stopped,
            evidence=(Evidence("procs", "stopped", stopped),),
            fix=STOPPED_FIX,
            **common,  # type: ignore[arg-type]
        )
    state, reason = _benign_state(ctx, sigs)
    suspects = [] if ctx.gone else ctx.suspects
    suspect = max(suspects, key=lambda m: m[0].priority) if suspects else None
    if suspect is not None and state == "serving" and ctx.stall.due:
        # Cause evidence without proof (a download stack and no socket or log line): the soft
        # stage now, not after the blind limit; the cause is named once something proves it.
        sig, ev = suspect
        state = "stalled"
        reason = (
            f"{ctx.stall.detail}; suspected: {sig.title} ({sig.id}), not proven yet: "
            + "; ".join(e.detail for e in ev if e.kind != "no_progress")
        )
    if state == "stalled":
        named = _open_operation(ctx, sigs) or _wedged(ctx)
        if named is not None:
            return Verdict(**named, **common)  # type: ignore[arg-type]
    evidence: tuple[Evidence, ...] = ()
    if state == "stalled":
        evidence = (
            (Evidence("progress", "no_progress", stall.detail),)
            + ranks_ev
            + _ras_evidence(ctx)
            + ctx.gpu_figures()
            + ctx.capture_problems()
            + (tuple(e for e in suspect[1] if e.kind != "no_progress") if suspect else ())
        )
    if state == "stalled":
        reason += _unknown_engine(obs)
    verdict = Verdict(
        state=state,
        reason=reason,
        evidence=evidence,
        fix=STALLED_FIX if state == "stalled" else "",
        **common,  # type: ignore[arg-type]
    )
    # No signature named a cause: the class the live log shows, if any (core/genericlive.py).
    return with_generic(verdict, window, sigs, th.load_deadline_s)


def _stopped(window: Window) -> str | None:
    """Which of the server's processes is stopped (state T) in the last two observations."""
    obs = window.last(2)
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


def _engine(obs: Observation) -> str:
    return obs.procs.engine if obs.procs is not None else ""


def _engine_label(window: Window, obs: Observation) -> str:
    """ "sglang 0.5.23": the engine in force and the version the facts source read for it."""
    name = _engine(obs) or str(window.progress.facts.get("engine") or "")
    if not name or name == "unknown":
        return ""
    facts = window.progress.facts
    version = facts.get("engine_version") if facts.get("engine") == name else None
    return f"{name} {version}" if isinstance(version, str) and version else name


def _unknown_engine(obs: Observation) -> str:
    """What a verdict could not use when no engine profile matched the server."""
    if _engine(obs) != "unknown":
        return ""
    return (
        " (engine not recognised: watched with the generic signals only; missing the engine's "
        "progress counters in /metrics, its stats lines in the log and its process roles; "
        "give --engine or add a profile with --engines FILE)"
    )


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


def _benign_state(ctx: Context, sigs: SignatureSet) -> tuple[str, str]:
    p, stall = ctx.window.progress, ctx.stall
    if ctx.gone and ctx.obs.procs is not None and ctx.obs.procs.target_pid is None:
        return "dead", "no server process found: nothing matches the target (yet)"
    if ctx.gone:
        return "dead", "the server process is gone"
    lease = stall.lease or _progressing(ctx)
    if lease is not None:
        # A known long operation showing progress of its own: reported, never a hang.
        now = ctx.obs.t
        if lease.crawling(now):
            return "crawling", f"crawling: {lease.describe(now)}"
        return lease.op.state, lease.describe(now)
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


def _progressing(ctx: Context) -> Lease | None:
    """A leased operation past its bound and still progressing (crawling), looked for only
    while no stall is measured and something is open (a phase before ready, a CDN socket)."""
    if ctx.stall.stalled or (ctx.window.progress.phase == "ready" and not ctx.obs.conns):
        return None
    now = ctx.obs.t
    return next((le for le in ctx.leases if le.crawling(now)), None)


def _wedged(ctx: Context) -> dict[str, object] | None:
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
        (
            Evidence("log", "wedged", f"{line}; {lapsed.describe(ctx.obs.t)}", 0.3),
            Evidence("progress", "no_progress", ctx.stall.detail, 0.2),
        )
        + ctx.gpu_figures()
        + ctx.capture_problems()
    )
    return {"state": "stalled", "reason": line, "evidence": evidence, "fix": STALLED_FIX}


def _open_operation(ctx: Context, sigs: SignatureSet) -> dict[str, object] | None:
    """A stall that lasts inside an operation the log started and never finished (a cubin
    fetch, a communicator init, a JIT build) is named by the signature that operation points
    to, the same evidence `replay --stuck` uses (core/openops.py)."""
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
    evidence = (
        (
            Evidence(
                "log", "open_operation", f"open operation: {cause.describe()}: {cause.line!r}", 0.3
            ),
            Evidence("progress", "no_progress", ctx.stall.detail, 0.2),
        )
        + ctx.gpu_figures()
        + ctx.capture_problems()
    )
    return {
        "state": "hung",
        "signature": sig.id,
        "title": sig.title,
        "confidence": 0.5,
        "evidence": evidence,
        "fix": sig.fix,
        "commands": sig.commands,
        "references": sig.references,
        "fallback": sig.fallback,
        "reason": f"stalled inside an unfinished {cause.op.what}",
        "priority": sig.priority,
    }


DEATHS = frozenset({"crash", "dead"})  # signature states that name a death, not its cause


def _cause_of_death(
    ctx: Context, sigs: SignatureSet
) -> tuple[Signature, float, list[Evidence]] | None:
    """The proven cause of a stall the server died in (FlashInfer gave up after its retries and
    the scheduler raised; a collective timed out and the worker aborted), or None."""
    found = [
        m
        for s in sigs.signatures
        if s.state not in DEATHS
        for m in (_match(s, ctx, dying=True),)
        if m is not None
    ]
    return max(found, key=lambda m: (m[0].priority, m[1])) if found else None


def _consequence(sig: Signature, ev: list[Evidence], engine: str) -> list[Evidence]:
    """The death, as consequence lines under the cause."""
    title = sig.text_for(engine).title
    lines = [e for e in ev if e.kind != "proof"][:2] or [Evidence("procs", "", "")]
    return [
        Evidence(e.source, "consequence", f"then {title} ({sig.id}): {e.detail}".rstrip(": "))
        for e in lines
    ]


def _match(
    sig: Signature, ctx: Context, dying: bool = False
) -> tuple[Signature, float, list[Evidence]] | None:
    """`dying`: the server died; only a cause proven by evidence from before counts."""
    st = ctx.stall
    if sig.when == "stalled" and not (st.stalled or st.provable or dying):
        return None
    if any(_eval(r, ctx) is not None for r in sig.unless):
        return None
    pairs: list[tuple[Rule, Evidence]] = []
    for rule in sig.evidence:
        ev = _eval(rule, ctx)
        if ev is None and rule.required:
            return None
        if ev is not None:
            pairs.append((rule, ev))
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
            if not dying:
                ctx.suspects.append((sig, found))
            return None
        found.append(Evidence("progress", "proof", f"cause proven by {proof}"))
    return sig, conf, found


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


def _eval(rule: Rule, ctx: Context) -> Evidence | None:
    """Evidence for one rule, or None when it does not hold."""
    detail = EVALUATORS[rule.kind](rule, ctx)
    if detail is None:
        return None
    source = SOURCE[rule.kind]
    return Evidence(
        source=source, kind=rule.kind, detail=f"{rule.label}: {detail}", weight=rule.weight
    )


__all__ = ["Context", "Stall", "Thresholds", "classify"]
