"""Each rank's own last-progress time, from what the watchdog sees of that rank (pure).

The server's progress counters say when the server as a whole last moved; every rank shares
that time. When one rank blocks (a cubin download, a kernel that never returns), its peers go
on with their share of the step until they reach the next collective, so what each rank did
after the server's last progress tells the first rank to stop from the ones that stopped
because of it. Signals per rank, each only after the server's last progress:
- its GPU moving memory (DRAM above the busy threshold on the GPU whose compute processes
  include its pid; SM alone is not progress: a spinning kernel keeps SM at 99 %);
- its main thread's stack differing between two captures;
- log lines tagged with it (vLLM's `(Worker_TP3 pid=N)` prefix, SGLang's ` TP3]`) that report
  progress (bars, stats, milestones), not errors or retries;
- its NCCL collective count (RAS, ranks on this host matched by pid) rising.
Its sockets are shown per rank but are not progress: a rank in a download retry loop opens
sockets while making none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from watchdog.core.model import Observation, RankProgress, StackSample
from watchdog.core.state.rankroles import ranked_procs
from watchdog.core.state.window import Window

# LogEvent kinds that mean the process moved (model.LogEvent); "line" (errors, NCCL watchdog
# timeouts kept for signatures), "jit" (a download's `Fetching`/`attempt N failed`) and
# "stack" are not progress.
PROGRESS_KINDS = frozenset({"progress", "stats", "loading", "capture", "milestone", "compile"})
MAX_RANKS = 256  # per server; bounds the work and the exported series


class _Latest:
    """The newest progress time per pid and what showed it."""

    def __init__(self, pids: Iterable[int], floor: float) -> None:
        self.seen: dict[int, tuple[float, str]] = {pid: (floor, "server") for pid in pids}

    def bump(self, pid: int, t: float, signal: str, *, ties: bool = False) -> None:
        if pid in self.seen and (t > self.seen[pid][0] or (ties and t == self.seen[pid][0])):
            self.seen[pid] = (t, signal)


def rank_progress(window: Window, busy_dram: float) -> tuple[RankProgress, ...]:
    """Per rank of the latest observation's server: seconds since it last showed progress."""
    obs = window.latest
    if obs is None or obs.procs is None:
        return ()
    ranked = ranked_procs(obs.procs.procs)[:MAX_RANKS]
    if not ranked:
        return ()
    p = window.progress
    if not p.pending:  # idle: nothing to progress on, every rank is current (as the server)
        return tuple(RankProgress(rank, pid, role, 0.0, "idle") for pid, role, rank in ranked)
    # The same start as the server's stall (core/judge/context.py): its last progress, when work
    # became pending, a restart, or the window's first observation.
    first = next(iter(window), obs)
    starts = (p.last_progress_t, p.pending_since, p.restarted_t, first.t)
    floor = max(t for t in starts if t is not None)
    latest = _Latest((pid for pid, _, _ in ranked), floor)
    by_rank = {rank: pid for pid, _, rank in ranked}
    stacks: dict[int, tuple[Any, ...]] = {}
    counts: dict[int, int] = {}
    for o in window:
        after = o.t > floor
        _gpu(o, latest, busy_dram, after)
        _stacks(o, latest, stacks, after)
        _logs(o, latest, by_rank, o.t >= floor)  # a line that advanced the server too
        _ras(o, latest, counts, after)
    return tuple(
        RankProgress(
            rank, pid, role, round(max(0.0, obs.t - latest.seen[pid][0]), 3), latest.seen[pid][1]
        )  # fmt: skip
        for pid, role, rank in ranked
    )


def _gpu(o: Observation, latest: _Latest, busy_dram: float, after: bool) -> None:
    if not after:
        return
    for g in o.gpus:
        if g.dram is not None and g.dram > busy_dram:
            for pid in g.pids:
                latest.bump(pid, o.t, "gpu")


def _main_frames(s: StackSample) -> tuple[Any, ...] | None:
    if s.error or not s.threads:
        return None
    main = next((t for t in s.threads if t.name == "MainThread"), s.threads[0])
    return tuple((f.name, f.filename, f.line) for f in main.frames)


def _stacks(o: Observation, latest: _Latest, seen: dict[int, tuple[Any, ...]], after: bool) -> None:
    for s in o.stacks:
        frames = _main_frames(s)
        if frames is None:
            continue
        before = seen.get(s.pid)
        seen[s.pid] = frames
        if after and before is not None and before != frames:
            latest.bump(s.pid, o.t, "stack")


def _logs(o: Observation, latest: _Latest, by_rank: dict[int, int], after: bool) -> None:
    if not after:
        return
    for ev in o.logs:
        if ev.kind not in PROGRESS_KINDS:
            continue
        pid = ev.fields.get("pid")
        rank = ev.fields.get("rank")
        if isinstance(pid, int) and pid in latest.seen:
            latest.bump(pid, o.t, "log", ties=True)
        elif isinstance(rank, int) and rank in by_rank:
            latest.bump(by_rank[rank], o.t, "log", ties=True)


def _ras(o: Observation, latest: _Latest, counts: dict[int, int], after: bool) -> None:
    """The RAS source's `local` map: pid -> collectives completed (sources/nccl_ras.py)."""
    ras = o.nccl_ras
    local = ras.get("local") if isinstance(ras, dict) else None
    if not isinstance(local, dict):
        return
    for key, total in local.items():
        try:
            pid, n = int(key), int(total)
        except (TypeError, ValueError):
            continue
        before = counts.get(pid)
        counts[pid] = n
        if after and before is not None and n > before:
            latest.bump(pid, o.t, "nccl_ras")


def describe_progress(progress: Sequence[RankProgress]) -> str:
    """ "rank 2 stopped first (no progress for 19 s); ranks 0, 1, 3 last moved 17 s ago (gpu)",
    or "" when every rank shares one time (nothing per rank to tell)."""
    first = first_to_stop(progress)
    if first is None or len({rp.seconds for rp in progress}) < 2:
        return ""
    rest = [rp for rp in progress if rp.pid != first.pid]
    newest = min(rest, key=lambda rp: rp.seconds)
    ranks = ", ".join(str(rp.rank) for rp in rest[:16]) + (", ..." if len(rest) > 16 else "")
    signals = ", ".join(sorted({rp.signal for rp in rest}))
    return (f"rank {first.rank} stopped first (no progress for {first.seconds:.0f} s); "
            f"rank{'s' if len(rest) > 1 else ''} {ranks} last moved {newest.seconds:.0f} s "
            f"ago ({signals})")  # fmt: skip


def first_to_stop(progress: Iterable[RankProgress]) -> RankProgress | None:
    """The rank whose last progress is the oldest; ties go to the lowest rank."""
    return min(progress, key=lambda r: (-r.seconds, r.rank), default=None)
