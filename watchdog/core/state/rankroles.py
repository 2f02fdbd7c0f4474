"""Which process is which rank, and which known activity a thread is in: read from process
titles and stacks with the rank rules (pure). core/judge/ranks.py names the cause from these."""

from __future__ import annotations

import re
from collections.abc import Sequence

from watchdog.core.knowledge.rankrules import Activity, RankRules
from watchdog.core.model import Frame, ProcInfo, StackSample, ThreadStack

# vLLM: `VLLM::Worker_TP3`, `VLLM::Worker_DP0_TP1_EP1` (setup_proc_title_and_log_prefix),
# `VLLM::EngineCore_DP0`; older vLLM: `VllmWorker-3`. SGLang: `sglang::scheduler_TP3`
# (scheduler.py configure_scheduler_process). Used only when the engine profile set no rank.
_TITLE_ROLE = re.compile(r"(?:^|\s|/)(?:VLLM|sglang)::([A-Za-z]+)")
_TITLE_TP = re.compile(r"_TP(\d+)")
_OLD_WORKER = re.compile(r"VllmWorker[- ](?:rank=)?(\d+)")
ENGINE_ROLES = frozenset({"EngineCore", "scheduler"})
TITLE_CHARS = 200  # a command line can be kilobytes; the verdict keeps its start, redacted
MAX_RANK = 4096  # a bound on the exported `rank` label; no real server has more ranks per node


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
        engines = [(pid, role) for pid, role, _ in out if role in ENGINE_ROLES]
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


def thread_activity(sample: StackSample, kb: RankRules) -> tuple[str, str, bool | None, str]:
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
