"""Per-rank last progress (core/state/rankprogress.py): each rank's own time, not the server's."""

from __future__ import annotations

import functools
from dataclasses import replace

from tests.obsbuilder import Timeline, window_of
from tests.shipped import PATTERNS
from watchdog.core.model import (
    Frame,
    GpuSample,
    Observation,
    ProcInfo,
    ProcSnapshot,
    ServerSample,
    StackSample,
    ThreadStack,
    Verdict,
)
from watchdog.core.state.rankprogress import first_to_stop, rank_progress
from watchdog.outputs.fleet import LAST_PROGRESS, FleetLabels, fleet_series
from watchdog.sources.logs import parse

# Lines read in the shipped engines' formats, as the daemon's log source reads them.
parse_line = functools.partial(parse.parse_line, patterns=PATTERNS)


BUSY = 0.15
TP = 4


def _procs() -> ProcSnapshot:
    tree = [ProcInfo(10, 1, "python", "VLLM::EngineCore_DP0", role="engine")]
    tree += [
        ProcInfo(100 + r, 10, "python", f"VLLM::Worker_TP{r}", role="worker", rank=r)
        for r in range(TP)
    ]
    return ProcSnapshot(10, True, tuple(tree))


def _gpus(dram: dict[int, float]) -> tuple[GpuSample, ...]:
    """One GPU per rank, driven by that rank's pid; DRAM per rank (default: a spin at 0)."""
    return tuple(
        GpuSample(r, f"GPU-{r}", "GPU", "9.0", 0.99, dram.get(r, 0.0), pids=(100 + r,))
        for r in range(TP)
    )


def _server(iterations: float) -> ServerSample:
    return ServerSample(up=True, iterations=iterations, running=8.0, waiting=0.0)


def _stack(pid: int, name: str, line: int = 1) -> StackSample:
    frames = (Frame(name, "/x/model.py", line),)
    return StackSample(pid, "t", (ThreadStack(1, "MainThread", frames),))


def _hang(tl: Timeline, after: list[dict]) -> list[Observation]:
    """Five healthy ticks (iterations rising), then one tick per entry of `after` with the
    server stuck at the last iteration count."""
    for i in range(5):
        tl.tick(server=_server(float(i)), gpus=_gpus({r: 0.6 for r in range(TP)}))
    for kw in after:
        tl.tick(server=_server(4.0), **{"gpus": _gpus({}), **kw})
    return tl.obs


def _by_rank(obs: list[Observation]) -> dict[int, tuple[float, str]]:
    return {rp.rank: (rp.seconds, rp.signal) for rp in rank_progress(window_of(obs), BUSY)}


def test_ranks_still_moving_memory_after_the_server_stopped_are_newer() -> None:
    # Rank 2 stops with the server (t=1004); ranks 0, 1, 3 keep their GPUs busy two more
    # ticks before they reach the collective, as NCCL peers finish their share of a step.
    tl = Timeline(procs=_procs())
    busy = {"gpus": _gpus({0: 0.5, 1: 0.5, 3: 0.5})}
    obs = _hang(tl, [busy, busy, {}, {}, {}])
    ranks = _by_rank(obs)
    assert ranks[2] == (5.0, "server"), ranks
    for r in (0, 1, 3):
        assert ranks[r] == (3.0, "gpu"), ranks
    assert first_to_stop(rank_progress(window_of(obs), BUSY)).rank == 2


def test_gpu_busy_before_the_stop_and_sm_alone_are_not_progress() -> None:
    tl = Timeline(procs=_procs())
    spin = {"gpus": tuple(replace(g, sm=1.0, dram=0.01) for g in _gpus({}))}
    ranks = _by_rank(_hang(tl, [spin, spin, spin]))
    assert {s for s, _ in ranks.values()} == {3.0}
    assert {sig for _, sig in ranks.values()} == {"server"}


def test_a_stack_that_moved_between_captures_is_progress_one_that_did_not_is_not() -> None:
    tl = Timeline(procs=_procs())
    first = tuple(_stack(100 + r, "all_reduce" if r else "forward") for r in range(TP))
    second = (_stack(100, "forward", line=2),) + first[1:]
    obs = _hang(tl, [{}, {"stacks": first}, {}, {"stacks": second}, {}])
    ranks = _by_rank(obs)
    assert ranks[0] == (1.0, "stack"), ranks  # moved between the captures at 1006 and 1008
    assert ranks[1] == ranks[2] == ranks[3] == (5.0, "server"), ranks


def test_log_lines_tagged_with_the_rank_count_for_that_rank() -> None:
    # vLLM's `(Worker_TP1 pid=101)` prefix names the pid; SGLang's ` TP3]` names the rank.
    vllm = parse_line(
        "(Worker_TP1 pid=101) INFO 01-12 02:58:15 [monitor.py:34] torch.compile takes "
        "15.09 s in total"
    )
    sglang = parse_line(
        "[2025-01-12 02:58:15 TP3] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16,"
        " avail mem=10.0 GB, mem usage=2.0 GB."
    )
    assert vllm is not None and sglang is not None
    # A progress line advances the server too (core/state/window.py), so the times agree; the
    # rank it names is the one seen doing it.
    for line, rank in ((vllm, 1), (sglang, 3)):
        ranks = _by_rank(_hang(Timeline(procs=_procs()), [{}, {"logs": (line,)}, {}]))
        assert ranks[rank] == (1.0, "log"), ranks
        assert [sig for r, (_, sig) in ranks.items() if r != rank] == ["server"] * 3, ranks


def test_ras_collective_count_rising_is_progress_for_the_pid_on_this_host() -> None:
    def ras(counts: dict[int, int]) -> dict:
        return {"nccl_ras": {"up": True, "local": {str(k): v for k, v in counts.items()}}}

    tl = Timeline(procs=_procs())
    stuck = {100 + r: 1235 for r in range(TP)} | {102: 1234}
    moved = {100 + r: 1236 for r in range(TP)} | {102: 1234}
    obs = _hang(tl, [ras(stuck), ras(moved), ras(moved), {}])
    ranks = _by_rank(obs)
    assert ranks[2] == (4.0, "server"), ranks
    assert all(ranks[r] == (2.0, "nccl_ras") for r in (0, 1, 3)), ranks


def test_idle_server_ranks_are_current_and_no_ranks_no_series() -> None:
    tl = Timeline(procs=_procs())
    for _ in range(3):
        tl.tick(server=ServerSample(up=True, iterations=1.0, running=0.0, waiting=0.0))
    assert {rp.signal for rp in rank_progress(window_of(tl.obs), BUSY)} == {"idle"}
    lone = Timeline(procs=ProcSnapshot(10, True, (ProcInfo(10, 1, "python", "vllm serve"),)))
    lone.tick()
    assert rank_progress(window_of(lone.obs), BUSY) == ()


def test_export_carries_each_ranks_own_time() -> None:
    tl = Timeline(procs=_procs())
    busy = {"gpus": _gpus({0: 0.5, 1: 0.5, 3: 0.5})}
    obs = _hang(tl, [busy, busy, {}, {}, {}])
    progress = rank_progress(window_of(obs), BUSY)
    verdict = Verdict(state="stalled", seconds_since_progress=5.0, rank_progress=progress)
    series = fleet_series(obs[-1], verdict, FleetLabels("d", "node-a"))
    last = {key[3]: value for key, value in series[LAST_PROGRESS]}
    wall = obs[-1].wall
    assert last == {"0": wall - 3, "1": wall - 3, "2": wall - 5, "3": wall - 3}, last


def test_the_verdict_says_which_rank_stopped_first_only_when_ranks_differ() -> None:
    from watchdog.core.state.rankprogress import describe_progress

    tl = Timeline(procs=_procs())
    busy = {"gpus": _gpus({0: 0.5, 1: 0.5, 3: 0.5})}
    line = describe_progress(rank_progress(window_of(_hang(tl, [busy, busy, {}, {}, {}])), BUSY))
    assert (
        line == "rank 2 stopped first (no progress for 5 s); ranks 0, 1, 3 last moved 3 s ago (gpu)"
    )
    same = rank_progress(window_of(_hang(Timeline(procs=_procs()), [{}, {}])), BUSY)
    assert describe_progress(same) == ""
