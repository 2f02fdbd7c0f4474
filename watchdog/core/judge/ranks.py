"""Which rank of a server is the cause of a hang and which ranks wait on it (pure).

When one rank blocks (a cubin download, a kernel that never returns), every other rank waits in
a collective, and a watchdog that only says `collective_hang` points at the wrong process
(SGLang never dumps the rank that caused a multi-rank hang: sglang #33289). This module reads
each process's stacks, GPU and sockets and names the cause and the waiting ranks. The activity
patterns are data (ranks.toml).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from watchdog.core.knowledge.rankrules import RankRules
from watchdog.core.model import (
    Connection,
    GpuSample,
    ProcInfo,
    RankView,
    StackSample,
)
from watchdog.core.redact import redact_text
from watchdog.core.state.rankroles import (
    ENGINE_ROLES,
    TITLE_CHARS,
    role_and_rank,
    thread_activity,
)


@dataclass(frozen=True)
class Attribution:
    """The per-process views and who is the cause."""

    views: tuple[RankView, ...] = ()
    cause_rank: int | None = None
    cause_role: str = ""
    waiting_ranks: tuple[int, ...] = ()


def _view(
    proc: ProcInfo,
    sample: StackSample | None,
    gpus: Sequence[GpuSample],
    conns: Sequence[Connection],
    kb: RankRules,
) -> tuple[RankView, str]:
    role, rank = role_and_rank(proc)
    if sample is None or sample.error or not sample.threads:
        act, part, unchanged, frame = "no_stacks", "", None, ""
    else:
        act, part, unchanged, frame = thread_activity(sample, kb)
    gpu = next((g.index for g in gpus if proc.pid in g.pids), None)
    socks = tuple(f"{c.host}:{c.port} {c.state}" for c in conns if c.pid == proc.pid)
    title = redact_text(proc.title)[:TITLE_CHARS]
    view = RankView(proc.pid, role, rank, title, frame, act, unchanged, gpu, socks)
    return view, part


def attribute(
    procs: Sequence[ProcInfo],
    stacks: Sequence[StackSample],
    gpus: Sequence[GpuSample] = (),
    conns: Sequence[Connection] = (),
    *,
    kb: RankRules,
) -> Attribution:
    """Per process its role, rank and activity; the cause and the ranks that wait on it."""
    if not stacks:
        return Attribution()
    by_pid = {s.pid: s for s in stacks}
    pairs = [_view(p, by_pid.get(p.pid), gpus, conns, kb) for p in procs if p.pid in by_pid]
    pairs = _engine_is_rank0(pairs)
    order = {a.name: i for i, a in enumerate(kb.activities)}
    causes = [v for v, part in pairs if part == "cause"]
    waiting = [v for v, part in pairs if part == "waiting"]
    if not causes and waiting:
        # Nobody is in a known cause, but some ranks wait: the ranked process that is not
        # waiting (and was dumped) is the one they wait for.
        causes = [v for v, part in pairs if not part and v.rank is not None and v.frame]
    causes.sort(key=lambda v: (order.get(v.activity, len(order)), v.rank is None, v.rank or 0))
    cause = causes[0] if causes else None
    views = tuple(
        _with_part(v, cause, waiting)
        for v, _ in sorted(pairs, key=lambda p: (p[0].rank is None, p[0].rank or 0, p[0].pid))
    )
    return Attribution(
        views=views,
        cause_rank=cause.rank if cause else None,
        cause_role=cause.role if cause else "",
        waiting_ranks=tuple(sorted(v.rank for v in waiting if v.rank is not None)),
    )


def _engine_is_rank0(pairs: list[tuple[RankView, str]]) -> list[tuple[RankView, str]]:
    """TP=1: no worker processes, the engine core (or SGLang scheduler) runs rank 0 itself."""
    if any(v.rank is not None for v, _ in pairs):
        return pairs
    engines = [i for i, (v, _) in enumerate(pairs) if v.role in ENGINE_ROLES]
    if len(engines) != 1:
        return pairs
    out = list(pairs)
    v, part = out[engines[0]]
    out[engines[0]] = (replace(v, rank=0), part)
    return out


def _with_part(v: RankView, cause: RankView | None, waiting: Sequence[RankView]) -> RankView:
    if cause is not None and v.pid == cause.pid:
        return replace(v, part="cause")
    if any(w.pid == v.pid for w in waiting):
        return replace(v, part="waiting")
    return v


def describe(attr: Attribution, node: str = "") -> str:
    """One line for operators: "rank 5 (Worker) is in download_file; ranks 0-4, 6, 7 wait"."""
    cause = next((v for v in attr.views if v.part == "cause"), None)
    if cause is None:
        return ""
    who = f"rank {cause.rank}" if cause.rank is not None else f"pid {cause.pid}"
    where = f" on node {node}" if node else ""
    role = f" ({cause.role})" if cause.role else ""
    line = f"{who}{where}{role} is in {cause.frame or cause.activity}"
    if attr.waiting_ranks:
        n = len(attr.waiting_ranks)
        line += f"; {n} other rank{'s' if n > 1 else ''} wait for it ({_spans(attr.waiting_ranks)})"
    return line


def _spans(ranks: Sequence[int]) -> str:
    """0,1,2,4 -> "0-2, 4"."""
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ", ".join(out)
