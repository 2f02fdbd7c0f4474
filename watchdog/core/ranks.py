"""Which rank of a server is the cause of a hang and which ranks wait on it (pure).

When one rank blocks (a cubin download, a kernel that never returns), every other rank waits in
a collective, and a watchdog that only says `collective_hang` points at the wrong process
(SGLang never dumps the rank that caused a multi-rank hang: sglang #33289). This module reads
each process's stacks, GPU and sockets and names the cause and the waiting ranks. The activity
patterns are data (ranks.toml).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources

from watchdog.core.model import (
    Connection,
    Frame,
    GpuSample,
    ProcInfo,
    RankView,
    StackSample,
    ThreadStack,
)
from watchdog.core.redact import redact_text
from watchdog.core.tomlcheck import read_toml

# vLLM: `VLLM::Worker_TP3`, `VLLM::Worker_DP0_TP1_EP1` (setup_proc_title_and_log_prefix),
# `VLLM::EngineCore_DP0`; older vLLM: `VllmWorker-3`. SGLang: `sglang::scheduler_TP3`
# (scheduler.py configure_scheduler_process). Used only when the engine profile set no rank.
_TITLE_ROLE = re.compile(r"(?:^|\s|/)(?:VLLM|sglang)::([A-Za-z]+)")
_TITLE_TP = re.compile(r"_TP(\d+)")
_OLD_WORKER = re.compile(r"VllmWorker[- ](?:rank=)?(\d+)")
_ENGINE_ROLES = frozenset({"EngineCore", "scheduler"})
TITLE_CHARS = 200  # a command line can be kilobytes; the verdict keeps its start, redacted
MAX_RANK = 4096  # a bound on the exported `rank` label; no real server has more ranks per node


@dataclass(frozen=True)
class Activity:
    """One thing a rank can be doing, recognised by its frames."""

    name: str
    part: str  # "cause" or "waiting"
    frames: re.Pattern[str]
    files: re.Pattern[str] | None


_NOTHING = re.compile(r"(?!)")  # matches no frame: rules without plumbing skip none


@dataclass(frozen=True)
class RankRules:
    """The activities and the plumbing frames skipped when naming a meaningful frame (the
    default, no rules, names no activity: every rank is "other")."""

    activities: tuple[Activity, ...] = ()
    plumbing_files: re.Pattern[str] = _NOTHING
    plumbing_frames: re.Pattern[str] = _NOTHING


@dataclass(frozen=True)
class Attribution:
    """The per-process views and who is the cause."""

    views: tuple[RankView, ...] = ()
    cause_rank: int | None = None
    cause_role: str = ""
    waiting_ranks: tuple[int, ...] = ()


def load_rank_rules(text: str | None = None) -> RankRules:
    """The shipped ranks.toml (or `text` in its format), read now on every call: the knowledge
    bundle calls it once and passes the rules down."""
    if text is None:
        text = resources.files("watchdog.core").joinpath("ranks.toml").read_text(encoding="utf-8")
    data = read_toml(text, "ranks.toml", "a rank rule file")
    acts = tuple(
        Activity(
            a["name"],
            a["part"],
            re.compile(a["frames"]),
            re.compile(a["files"]) if a.get("files") else None,
        )
        for a in data["activity"]
    )
    plumb = data["plumbing"]
    return RankRules(acts, re.compile(plumb["files"]), re.compile(plumb["frames"]))


def role_and_rank(proc: ProcInfo) -> tuple[str, int | None]:
    """The profile's role and rank, else what the vLLM/SGLang process title says."""
    role, rank = proc.role, proc.rank
    if not role:
        # The last one: a title kept in argv (`... --role VLLM::Worker_TP1`) names its own role
        # after any inherited from the parent's command line.
        found = _TITLE_ROLE.findall(proc.title)
        role = found[-1] if found else ""
        if not role and _OLD_WORKER.search(proc.title):
            role = "Worker"
    if rank is None:
        found = _TITLE_TP.findall(proc.title) or _OLD_WORKER.findall(proc.title)
        rank = int(found[-1]) if found else None
    if rank is not None and not 0 <= rank < MAX_RANK:
        rank = None
    return role, rank


def ranked_procs(procs: Sequence[ProcInfo]) -> list[tuple[int, str, int]]:
    """(pid, role, rank) of the processes with a rank; TP=1: the engine core is rank 0."""
    out = [(p.pid, role, rank) for p in procs for role, rank in (role_and_rank(p),)]
    ranked = [(pid, role, rank) for pid, role, rank in out if rank is not None]
    if not ranked:
        engines = [(pid, role) for pid, role, _ in out if role in _ENGINE_ROLES]
        if len(engines) == 1:
            ranked = [(engines[0][0], engines[0][1], 0)]
    return sorted(ranked, key=lambda x: (x[2], x[0]))


def _short(fr: Frame) -> str:
    return fr.name.rsplit(".", 1)[-1]


def _matches(act: Activity, fr: Frame) -> bool:
    if not (act.frames.search(fr.name) or act.frames.search(_short(fr))):
        return False
    return act.files is None or bool(act.files.search(fr.filename))


def _meaningful(th: ThreadStack, kb: RankRules) -> Frame | None:
    """The innermost frame that is not plumbing (threading waits, socket reads)."""
    for fr in th.frames:
        if kb.plumbing_files.search(fr.filename) or kb.plumbing_frames.search(_short(fr)):
            continue
        return fr
    return th.frames[0] if th.frames else None


def _label(fr: Frame) -> str:
    base = fr.filename.rsplit("/", 1)[-1]
    return f"{fr.name} ({base}:{fr.line})" if base else fr.name


def _thread_activity(sample: StackSample, kb: RankRules) -> tuple[str, str, bool | None, str]:
    """(activity, part, unchanged, frame) of a process's most telling thread."""
    for act in kb.activities:
        for th in sorted(sample.threads, key=lambda t: not t.unchanged):
            fr = next((f for f in th.frames if _matches(act, f)), None)
            if fr is not None:
                return act.name, act.part, th.unchanged, _label(fr)
    main = next((t for t in sample.threads if t.name == "MainThread"), None)
    shown = main or next(iter(sample.threads), None)
    if shown is None:
        return "no_stacks", "", None, ""
    fr = _meaningful(shown, kb)
    return "other", "", shown.unchanged, _label(fr) if fr else ""


def blocking_frame(stacks: Sequence[StackSample], kb: RankRules) -> str:
    """ "pid 12 in download_file (cubin_loader.py:88)": a thread unchanged across two dumps in
    a frame of a known activity (a download, a GPU wait, a collective), else ""."""
    for sample in stacks:
        for act in kb.activities:
            for th in sample.threads:
                outer = len(th.frames) - th.held  # frames from here on are in both dumps
                at = next((i for i, f in enumerate(th.frames) if _matches(act, f)), None)
                if at is None or not (th.unchanged or at >= outer):
                    continue
                how = "unchanged across two dumps" if th.unchanged else "in it in both dumps"
                return f"pid {sample.pid} in {_label(th.frames[at])}, {how}"
    return ""


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
        act, part, unchanged, frame = _thread_activity(sample, kb)
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
    engines = [i for i, (v, _) in enumerate(pairs) if v.role in _ENGINE_ROLES]
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
