"""Rank attribution (core/judge/ranks.py): which rank is the cause and which ranks wait on it."""

from __future__ import annotations

from watchdog.core.judge.ranks import attribute, describe
from watchdog.core.knowledge.rankrules import load_rank_rules
from watchdog.core.model import (
    Connection,
    Frame,
    GpuSample,
    ProcInfo,
    RankView,
    StackSample,
    ThreadStack,
    Verdict,
    from_dict,
    to_dict,
)
from watchdog.core.state.rankroles import role_and_rank
from watchdog.outputs.summary import render_summary

RULES = load_rank_rules()  # the shipped ranks.toml, as SignatureSet.ranks holds it

DOWNLOAD = (
    Frame("recv_into", "/usr/lib/python3.12/socket.py", 720),
    Frame("download_file", "/x/flashinfer/jit/cubin_loader.py", 114),
    Frame("get_cubin", "/x/flashinfer/jit/cubin_loader.py", 200),
)
COLLECTIVE = (
    Frame("barrier", "/x/torch/distributed/distributed_c10d.py", 4000),
    Frame("all_reduce", "/x/torch/distributed/distributed_c10d.py", 2500),
)
SPIN = (Frame("synchronize", "/x/torch/cuda/__init__.py", 990),)
BUSY = (Frame("forward", "/x/vllm/model_executor/models/llama.py", 300),)


def _worker(rank: int, *, profile: bool = True) -> ProcInfo:
    title = f"VLLM::Worker_TP{rank}"
    if profile:
        return ProcInfo(100 + rank, 10, "python", title, role="worker", rank=rank)
    return ProcInfo(100 + rank, 10, "python", title)


def _stack(pid: int, frames: tuple[Frame, ...], unchanged: bool = True) -> StackSample:
    thread = ThreadStack(1, "MainThread", frames, active=True, unchanged=unchanged)
    return StackSample(pid, "t", (thread,))


def _tp(frames: dict[int, tuple[Frame, ...]], *, profile: bool = True):
    procs = [_worker(r, profile=profile) for r in frames]
    stacks = [_stack(100 + r, f) for r, f in frames.items()]
    return procs, stacks


def test_download_rank_is_the_cause_and_the_others_wait() -> None:
    frames = {0: COLLECTIVE, 1: COLLECTIVE, 2: DOWNLOAD, 3: COLLECTIVE}
    procs, stacks = _tp(frames)
    gpus = [GpuSample(i, pids=(100 + i,)) for i in range(4)]
    conns = [Connection(102, "edge.urm.nvidia.com", "1.2.3.4", 443, "ESTABLISHED", 30.0)]
    attr = attribute(procs, stacks, gpus, conns, kb=RULES)
    assert attr.cause_rank == 2 and attr.cause_role == "worker"
    assert attr.waiting_ranks == (0, 1, 3)
    cause = next(v for v in attr.views if v.part == "cause")
    assert cause.activity == "download" and cause.frame.startswith("download_file (cubin_loader")
    assert cause.gpu == 2 and cause.sockets == ("edge.urm.nvidia.com:443 ESTABLISHED",)
    assert cause.unchanged is True
    assert [v.part for v in attr.views] == ["waiting", "waiting", "cause", "waiting"]
    line = describe(attr, node="b")
    assert line.startswith("rank 2 on node b (worker) is in download_file")
    assert "3 other ranks wait for it (0-1, 3)" in line


def test_spinning_rank_is_the_cause() -> None:
    procs, stacks = _tp({0: COLLECTIVE, 1: SPIN, 2: COLLECTIVE, 3: COLLECTIVE})
    attr = attribute(procs, stacks, kb=RULES)
    assert attr.cause_rank == 1 and attr.waiting_ranks == (0, 2, 3)
    assert next(v for v in attr.views if v.rank == 1).activity == "gpu_wait"


def test_a_download_outranks_a_gpu_wait() -> None:
    procs, stacks = _tp({0: SPIN, 1: DOWNLOAD, 2: COLLECTIVE})
    assert attribute(procs, stacks, kb=RULES).cause_rank == 1


def test_the_rank_not_in_the_collective_is_the_cause_when_no_known_cause_shows() -> None:
    procs, stacks = _tp({0: COLLECTIVE, 1: COLLECTIVE, 2: BUSY, 3: COLLECTIVE})
    attr = attribute(procs, stacks, kb=RULES)
    assert attr.cause_rank == 2 and attr.waiting_ranks == (0, 1, 3)
    assert next(v for v in attr.views if v.rank == 2).frame == "forward (llama.py:300)"


def test_every_rank_waiting_names_no_cause_here() -> None:
    """The cause is on another node: this node's ranks all wait, none is blamed."""
    procs, stacks = _tp({r: COLLECTIVE for r in range(4)})
    attr = attribute(procs, stacks, kb=RULES)
    assert attr.cause_rank is None and attr.waiting_ranks == (0, 1, 2, 3)
    assert describe(attr) == ""


def test_ranks_from_vllm_and_sglang_titles_when_no_profile_set_them() -> None:
    assert role_and_rank(ProcInfo(1, 0, "p", "VLLM::Worker_TP3")) == ("Worker", 3)
    assert role_and_rank(ProcInfo(1, 0, "p", "VLLM::Worker_DP1_TP2_EP5")) == ("Worker", 2)
    assert role_and_rank(ProcInfo(1, 0, "p", "sglang::scheduler_TP7")) == ("scheduler", 7)
    assert role_and_rank(ProcInfo(1, 0, "p", "VllmWorker-4")) == ("Worker", 4)
    assert role_and_rank(ProcInfo(1, 0, "p", "VLLM::EngineCore")) == ("EngineCore", None)
    argv_title = "python -m sim --role VLLM::EngineCore --role VLLM::Worker_TP1"
    assert role_and_rank(ProcInfo(1, 0, "p", argv_title)) == ("Worker", 1)
    profiled = ProcInfo(1, 0, "p", "VLLM::Worker_TP3", role="worker", rank=9)
    assert role_and_rank(profiled) == ("worker", 9)
    procs, stacks = _tp({0: COLLECTIVE, 1: DOWNLOAD}, profile=False)
    assert attribute(procs, stacks, kb=RULES).cause_rank == 1


def test_tp1_engine_core_is_rank_0() -> None:
    engine = ProcInfo(50, 10, "python", "VLLM::EngineCore")
    api = ProcInfo(10, 1, "python", "vllm serve m")
    stacks = [_stack(50, DOWNLOAD), _stack(10, BUSY)]
    attr = attribute([api, engine], stacks, kb=RULES)
    assert attr.cause_rank == 0 and attr.cause_role == "EngineCore"


def test_plumbing_frames_are_skipped_and_failed_dumps_say_so() -> None:
    native = (
        Frame("clock_nanosleep", "libc.so.6", 0),
        Frame("wait", "/usr/lib/python3.12/threading.py", 320),
        Frame("collective_rpc", "/x/vllm/v1/executor/multiproc_executor.py", 250),
    )
    engine = ProcInfo(50, 10, "python", "VLLM::EngineCore")
    failed = StackSample(101, "VLLM::Worker_TP1", error="py-spy timed out")
    procs = [engine, _worker(0), _worker(1)]
    attr = attribute(procs, [_stack(50, native), _stack(100, COLLECTIVE), failed], kb=RULES)
    by_pid = {v.pid: v for v in attr.views}
    assert by_pid[50].frame == "collective_rpc (multiproc_executor.py:250)"
    assert by_pid[101].activity == "no_stacks"
    assert attribute(procs, [], kb=RULES).views == ()


def test_verdict_round_trips_with_ranks_and_old_verdicts_still_load() -> None:
    v = Verdict(
        state="hung",
        signature="cubin_download_stall",
        ranks=(RankView(7, "worker", 2, "VLLM::Worker_TP2", part="cause"),),
        cause_rank=2,
        waiting_ranks=(0, 1),
        priority=50,
    )
    assert from_dict(Verdict, to_dict(v)) == v
    old = {"state": "hung", "signature": "collective_hang", "confidence": 0.9}
    loaded = from_dict(Verdict, old)
    assert loaded.ranks == () and loaded.cause_rank is None and loaded.waiting_ranks == ()


def test_summary_has_a_ranks_table() -> None:
    procs, stacks = _tp({0: COLLECTIVE, 1: DOWNLOAD})
    attr = attribute(procs, stacks, kb=RULES)
    v = Verdict(
        state="hung",
        signature="cubin_download_stall",
        ranks=attr.views,
        cause_rank=attr.cause_rank,
        waiting_ranks=attr.waiting_ranks,
    )
    doc = {
        "verdict": to_dict(v),
        "evidence": [],
        "capture": {"result": "ok", "reason": "", "pids": []},
        "environment": {"gpus": [], "versions": {}},
    }
    md = render_summary(doc)
    assert "## Ranks" in md and "Cause: rank 1; waiting: ranks 0." in md
    assert "| 1 | worker | cause | download: `download_file (cubin_loader.py:114)`" in md
