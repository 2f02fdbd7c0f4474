"""Evidence beats bookkeeping: every witness of pending work counts, each for its own lifetime,
and a stall whose cause is proven is named at stall_after_s whatever the GPU source says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.obsbuilder import (
    ALL_REDUCE_STACK,
    DOWNLOAD_STACK,
    Timeline,
    assert_never_hung,
    cdn_socket,
    events,
    first_hang,
    frozen_bar,
    gpu,
    procs,
    sample_lines,
    stack,
    verdicts,
)
from tests.shipped import PATTERNS
from watchdog.core.judge.classify import Thresholds
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import LogEvent, ServerSample
from watchdog.core.state.witnesses import Witnesses, line_clock
from watchdog.sources.logs.parse import parse_line

CUBIN_LOG = "classify/cubin_download_v067.log"
# The three ways a host gives no GPU figures: no source (`--gpu-source none`), a source that is
# down (NVML blocked behind a GPU in trouble: the sample carries no figures), and a GPU whose
# figures are there (the proof must not need them, and must not be slowed by them either).
GPU_CASES = {
    "none": (),
    "down": (),
    "figures": (gpu(0.0, 0.0),),
}


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def _first_hang_after(tl: Timeline, onset: float, sigs: SignatureSet) -> tuple[float, str]:
    hit = first_hang(verdicts(tl.obs, sigs, Thresholds()))
    assert hit is not None, "never named"
    return hit[0].t - onset, str(hit[1].signature)


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_cubin_stall_proven_by_stack_and_socket_is_named_at_stall_after_s(
    sigs: SignatureSet, case: str
) -> None:
    tl = Timeline(gpus=GPU_CASES[case], procs=procs())
    onset = frozen_bar(tl, 40, cdn=True, stacks=(stack(*DOWNLOAD_STACK),))
    took, sig = _first_hang_after(tl, onset, sigs)
    assert sig == "cubin_download_stall"
    assert took <= 20, f"named {took:.0f} s after onset with GPU source {case}"
    v = verdicts(tl.obs, sigs)[-1][1]
    assert any(e.kind == "proof" for e in v.evidence) or case == "figures"


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_cubin_stall_proven_by_flashinfer_failures_is_named_at_stall_after_s(
    sigs: SignatureSet, case: str
) -> None:
    tl = Timeline(gpus=GPU_CASES[case], procs=procs())
    onset = frozen_bar(tl, 40, first_logs=events(sample_lines(CUBIN_LOG), sigs))
    took, sig = _first_hang_after(tl, onset, sigs)
    assert (sig, took <= 20) == ("cubin_download_stall", True), took


def test_a_download_stack_alone_without_gpu_figures_waits_for_the_blind_limit(
    sigs: SignatureSet,
) -> None:
    # One witness of the cause, no second one: not a proof. The soft stage comes at
    # stall_after_s naming the suspect; the cause itself only at the blind limit.
    th = Thresholds()
    tl = Timeline(gpus=(), procs=procs())
    onset = frozen_bar(tl, int(th.blind_stall_after_s) + 5, stacks=(stack(*DOWNLOAD_STACK),))
    pairs = verdicts(tl.obs, sigs, th)
    hit = first_hang(pairs)
    assert hit is not None and hit[0].t - onset >= th.blind_stall_after_s
    early = [(o.t - onset, v) for o, v in pairs if o.t - onset < th.blind_stall_after_s]
    assert not any(v.is_hang or v.state == "hung" for _, v in early)
    soft = [(t, v) for t, v in early if v.state == "stalled"]
    assert soft and soft[0][0] == th.stall_after_s, [t for t, _ in soft][:3]
    assert "suspected: " in soft[0][1].reason and "cubin_download_stall" in soft[0][1].reason
    assert any("download_file" in e.detail for e in soft[0][1].evidence)


def test_a_moving_download_stack_is_no_proof(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(), procs=procs())
    frozen_bar(tl, 60, cdn=True, stacks=(stack(*DOWNLOAD_STACK, unchanged=False),))
    assert_never_hung(verdicts(tl.obs, sigs))


def test_collective_frames_on_the_waiting_ranks_name_the_hang_without_gpu(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(), procs=procs())
    onset = frozen_bar(tl, 40, stacks=(stack(*ALL_REDUCE_STACK),))
    took, sig = _first_hang_after(tl, onset, sigs)
    assert (sig, took <= 20) == ("collective_hang", True), took


# --- pending work from every witness --------------------------------------------------------

SGLANG_READY = "[2026-05-01 10:00:31] The server is fired up and ready to roll!"
SGLANG_HEALTH_FAILED = (
    "[2026-05-01 10:01:02] Health check failed. Server couldn't get a response from "
    "detokenizer for last 20 seconds. tic start time: 10:00:42. last_heartbeat time: 10:00:41"
)


def _sglang(status: int | None, meaning: str | None) -> ServerSample:
    """SGLang after warm-up: gauges at 0 (written after a batch), counters at rest."""
    return ServerSample(
        up=True, health_status=status, health_meaning=meaning, prompt_tokens=7.0,
        generation_tokens=1.0, running=0.0, waiting=0.0,
    )  # fmt: skip


def _ev(line: str) -> tuple[LogEvent, ...]:
    ev = parse_line(line, "test", load_signatures().log_keep_pattern(), PATTERNS)
    assert ev is not None, line
    return (ev,)


def test_sglang_health_without_answer_after_the_ready_line_is_pending(sigs: SignatureSet) -> None:
    # The first large batch after warm-up hangs: no 200 ever seen, gauges at 0.
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.ticks(3, server=_sglang(503, "not_generating"))  # warm-up: ServerStatus.Starting
    tl.tick(logs=_ev(SGLANG_READY), server=_sglang(503, "not_generating"))
    onset = tl.now
    tl.ticks(30, server=_sglang(None, "not_generating"))
    pairs = verdicts(tl.obs, sigs)
    assert all(v.state != "stalled" for o, v in pairs if o.t < onset)
    stalled = next(o.t for o, v in pairs if v.state == "stalled")
    assert stalled - onset <= Thresholds().stall_after_s + 1
    assert "/health" in pairs[-1][1].reason


def test_sglang_warm_up_503_without_the_ready_line_is_not_pending(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.ticks(40, server=_sglang(503, "not_generating"))
    assert_never_hung(verdicts(tl.obs, sigs))
    assert verdicts(tl.obs, sigs)[-1][1].state != "stalled"


def test_sglang_health_check_failed_line_is_a_witness(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    tl.tick(logs=_ev(SGLANG_HEALTH_FAILED))
    tl.ticks(20)
    v = verdicts(tl.obs, sigs)[-1][1]
    assert v.state == "stalled"
    assert any("not generating" in w for w in v.witnesses)


def test_a_cdn_socket_while_serving_is_a_witness_and_the_verdict_lists_them(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    onset = tl.now
    for i in range(30):
        tl.tick(
            conns=(cdn_socket(float(i)),),
            stacks=(stack(*DOWNLOAD_STACK),) if i >= 9 else (),
            server=_sglang(None, "not_generating"),
        )
    took, sig = _first_hang_after(tl, onset, sigs)
    assert (sig, took <= 20) == ("cubin_download_stall", True), took
    v = verdicts(tl.obs, sigs)[-1][1]
    joined = " | ".join(v.witnesses)
    assert "kernel CDN" in joined and "/health" in joined and "blocked" in joined


def test_a_cdn_socket_while_loading_is_no_witness(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=_ev("[2026-05-01 10:00:00] Load weight begin. avail mem=78.12 GB"))
    for i in range(30):
        tl.tick(conns=(cdn_socket(float(i)),))
    assert_never_hung(verdicts(tl.obs, sigs))


# --- a witness expires ----------------------------------------------------------------------


def _stats(sec: int, running: int, tps: float) -> tuple[LogEvent, ...]:
    h, m, s = 15 + sec // 3600, (sec // 60) % 60, sec % 60
    return _ev(
        f"(APIServer pid=605) INFO 07-15 {h:02d}:{m:02d}:{s:02d} [loggers.py:273] Engine 000: "
        f"Avg prompt throughput: {tps * 10:.1f} tokens/s, Avg generation throughput: {tps:.1f} "
        f"tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, "
        "Prefix cache hit rate: 0.0%"
    )


def _drained_server(interval: int, sigs: SignatureSet, metrics: bool = True) -> list:
    """A load for 2.5 intervals, drained between two lines, then idle for 3 intervals: the last
    line vLLM printed still says `Running: 8 reqs` until the next one (VLLM_LOG_STATS_INTERVAL)."""
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tokens, load_s = 0.0, int(interval * 2.5)
    for sec in range(load_s + 3 * interval):
        busy = sec < load_s
        tokens += 80.0 if busy else 0.0
        sample = ServerSample(
            up=True, health_status=200, iterations=tokens / 8, prompt_tokens=tokens,
            generation_tokens=tokens / 10, running=8.0 if busy else 0.0, waiting=0.0,
        )  # fmt: skip
        line = ()
        if sec and sec % interval == 0:
            # vLLM: INFO while this or the last interval had throughput, then demoted to DEBUG.
            had = sec - interval < load_s
            line = _stats(sec, 8 if busy else 0, 8.0 if busy or had else 0.0) if had else ()
        tl.tick(logs=line, server=sample if metrics else None)
    return verdicts(tl.obs, sigs)


@pytest.mark.parametrize("interval", [10, 60, 150])
def test_a_drained_server_whose_last_stats_line_shows_running_is_no_alarm(
    sigs: SignatureSet, interval: int
) -> None:
    pairs = _drained_server(interval, sigs)
    assert all(v.state != "stalled" for _, v in pairs), [
        (o.t, v.reason) for o, v in pairs if v.state == "stalled"
    ][:2]
    assert_never_hung(pairs)
    assert pairs[-1][1].state == "idle"


def test_a_zero_throughput_stats_line_holds_even_with_metrics_at_zero(sigs: SignatureSet) -> None:
    # vllm #46811: running read 0 during a real wedge; the line after the onset (0.0 tokens/s,
    # Running: 3) is demoted afterwards, so its claim holds until progress.
    quiet = ServerSample(up=True, health_status=200, iterations=40.0, running=0.0, waiting=0.0)
    tl = Timeline(gpus=(gpu(0.99, 0.0),), procs=procs(), server=quiet)
    tl.tick(logs=_stats(0, 3, 20.0))
    tl.ticks(9)
    tl.tick(logs=_stats(10, 3, 0.0))
    tl.ticks(40)
    v = verdicts(tl.obs, sigs)[-1][1]
    assert v.is_hang and v.signature == "gpu_kernel_spin"


def test_a_stats_claim_lasts_until_the_next_line_is_due() -> None:
    w = Witnesses()
    for sec in (0, 60, 120):
        (ev,) = _stats(sec, 8, 5.0)
        w.on_stats(ev, 1000.0 + sec, pending=True, moving=True)
    assert w.interval_s == 60.0
    assert w.stats_says(1120.0 + 60)  # the next line is due at +60: still holds
    assert not w.stats_says(1120.0 + 93)  # 1.5 intervals and the slack gone: expired


def test_how_long_a_claim_holds_is_the_thresholds() -> None:
    """stats_due_factor, stats_due_slack_s and not_generating_hold_s come from Thresholds."""
    th = Thresholds(stats_due_factor=3.0, stats_due_slack_s=0.0, not_generating_hold_s=5.0)
    w = Witnesses(th=th)
    for sec in (0, 60, 120):
        (ev,) = _stats(sec, 8, 5.0)
        w.on_stats(ev, 1000.0 + sec, pending=True, moving=True)
    assert w.stats_says(1120.0 + 93)  # 3 intervals: still holds where 1.5 had expired
    assert not w.stats_says(1120.0 + 181)
    w.on_not_generating(2000.0)
    assert any("not generating" in a for a in w.active(2004.0))
    assert not any("not generating" in a for a in w.active(2006.0))
    default = Witnesses()
    default.on_not_generating(2000.0)
    assert any("not generating" in a for a in default.active(2006.0))  # 30 s by default


def test_the_interval_is_learnt_from_the_lines_own_timestamps() -> None:
    # Read in one tick (a burst, or a replay): the timestamps still say 150 s apart.
    w = Witnesses()
    for sec in (0, 150):
        (ev,) = _stats(sec, 8, 5.0)
        w.on_stats(ev, 5.0, pending=True, moving=True)
    assert w.interval_s == 150.0
    assert line_clock("[2026-05-01 23:59:59] x") == 86399.0
    assert line_clock("no time here") is None


# --- a hang that ends in a crash keeps its cause --------------------------------------------

GAVE_UP = (
    "2026-05-01 10:02:11,301 - ERROR - cubin_loader.py:180 - flashinfer.jit: Max retries "
    "reached. Download failed."
)
SCHEDULER_RAISED = (
    "[2026-05-01 10:02:11] Scheduler hit an exception: Traceback (most recent call last):"
)
SIGQUIT = (
    "[2026-05-01 10:02:11] SIGQUIT received. signum=None, frame=None. It usually means one "
    "child failed."
)


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_a_download_that_ends_in_a_crash_keeps_its_cause(sigs: SignatureSet, case: str) -> None:
    tl = Timeline(gpus=GPU_CASES[case], procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    for i in range(75):  # four tries of 10 s with 5/10/20 s between them
        tl.tick(
            conns=(cdn_socket(float(i % 15)),),
            stacks=(stack(*DOWNLOAD_STACK),) if i >= 9 else (),
            server=_sglang(None, "not_generating"),
        )
    tl.tick(logs=events([GAVE_UP, SCHEDULER_RAISED, SIGQUIT], sigs))
    tl.ticks(3, procs=procs(alive=False))
    pairs = verdicts(tl.obs, sigs)
    named = [v.signature for _, v in pairs if v.is_hang]
    assert named and set(named) == {"cubin_download_stall"}, sorted(set(named))
    v = pairs[-1][1]
    assert (v.state, v.signature, v.fallback) == ("dead", "cubin_download_stall", v.fallback)
    assert v.fallback == "disable_trtllm_attention"
    death = [e.detail for e in v.evidence if e.kind == "consequence"]
    assert death and "sglang_scheduler_crashed" in death[0], v.evidence


def test_replay_of_the_recorded_timeline_keeps_the_cause_too(
    sigs: SignatureSet, tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    from tests.simfixtures import sim_env
    from watchdog.core.state.timeline import write_timeline

    tl = Timeline(gpus=(), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    for i in range(30):
        tl.tick(conns=(cdn_socket(float(i)),), stacks=(stack(*DOWNLOAD_STACK),) if i >= 9 else ())
    tl.tick(logs=events([GAVE_UP, SCHEDULER_RAISED, SIGQUIT], sigs))
    tl.ticks(3, procs=procs(alive=False))
    path = tmp_path / "timeline.jsonl"
    write_timeline(path, tl.obs)
    done = subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path), "--json"],
        capture_output=True, text=True, timeout=120, env=sim_env(), check=False,
    )  # fmt: skip
    v = json.loads(done.stdout)["verdict"]
    assert (v["state"], v["signature"]) == ("dead", "cubin_download_stall"), v
    assert any(e["kind"] == "consequence" for e in v["evidence"])


def test_a_crash_without_a_proven_cause_stays_the_crash(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    tl.ticks(5, stacks=(stack(*DOWNLOAD_STACK),))  # one witness of a download: no proof
    tl.tick(logs=events([SCHEDULER_RAISED, SIGQUIT], sigs))
    tl.ticks(2, procs=procs(alive=False))
    v = verdicts(tl.obs, sigs)[-1][1]
    assert v.signature == "sglang_scheduler_crashed"


def test_a_spinning_gpu_while_serving_is_a_witness_whatever_the_gauges(
    sigs: SignatureSet,
) -> None:
    # TensorRT-LLM's first batch after warm-up spins in a kernel: its gauges (written after an
    # iteration) read 0, /health answers 200, no iteration line comes.
    idle = ServerSample(up=True, health_status=200, iterations=3.0, running=0.0, waiting=0.0)
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs(), server=idle)
    tl.tick(logs=_ev(SGLANG_READY))
    tl.ticks(5)
    onset = tl.now
    tl.ticks(30, gpus=(gpu(0.99, 0.0),))
    took, sig = _first_hang_after(tl, onset, sigs)
    assert (sig, took <= Thresholds().stall_after_s + 1) == ("gpu_kernel_spin", True), took
    v = verdicts(tl.obs, sigs)[-1][1]
    assert any("GPU busy without memory traffic" in w for w in v.witnesses)


# --- FlashInfer's retries: the thread moves inside download_file, the socket comes and goes ---

RETRY_FIRST = (  # dump 1: attempt 1 waits on the socket
    ("readinto", "/usr/lib/python3.12/socket.py"),
    ("_fetch", "/usr/lib/python3.12/site-packages/flashinfer/jit/cubin_loader.py"),
    *DOWNLOAD_STACK,
)
RETRY_SECOND = (  # dump 2, 5 s later: the back-off sleep before attempt 2
    ("sleep", "<built-in>"),
    *DOWNLOAD_STACK,
)


def test_mark_unchanged_counts_the_outer_frames_both_dumps_share() -> None:
    from watchdog.core.model import Frame, ThreadStack
    from watchdog.sources.stacks.parse import mark_unchanged

    def thread(frames: tuple[tuple[str, str], ...], line: int) -> ThreadStack:
        fr = tuple(Frame(n, f, line + i) for i, (n, f) in enumerate(frames))
        return ThreadStack(7, "MainThread", fr)

    (marked,) = mark_unchanged((thread(RETRY_FIRST, 10),), (thread(RETRY_SECOND, 40),))
    assert not marked.unchanged
    assert marked.held == len(DOWNLOAD_STACK)  # download_file and its callers, lines aside


def test_a_download_that_retries_is_still_proven_by_stack_and_socket(sigs: SignatureSet) -> None:
    from dataclasses import replace

    held = stack(*RETRY_FIRST, unchanged=False)
    held = replace(held, threads=(replace(held.threads[0], held=len(DOWNLOAD_STACK)),))
    tl = Timeline(gpus=(), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    onset = tl.now
    for i in range(30):
        attempt = i % 15 < 10  # 10 s attempts with the socket open, then the back-off sleep
        tl.tick(
            conns=(cdn_socket(float(i % 15)),) if attempt else (),
            stacks=(held,) if i >= 13 else (),
            server=_sglang(None, "not_generating"),
        )
    pairs = verdicts(tl.obs, sigs)
    hit = first_hang(pairs)
    assert hit is not None and hit[1].signature == "cubin_download_stall"
    assert hit[0].t - onset <= 20, hit[0].t - onset
    after = [v.signature for o, v in pairs if o.t >= hit[0].t]
    assert set(after) == {"cubin_download_stall"}, after  # no flapping between attempts


def test_replay_uses_the_recorded_witness_thresholds(sigs: SignatureSet) -> None:
    """A bundle records every Thresholds field; `replay` reads the new ones back, and the
    window it rebuilds holds a "not generating" line only as long as the daemon did."""
    from watchdog.commands.replay import _thresholds, reclassify

    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=_ev(SGLANG_READY))
    tl.tick(logs=_ev(SGLANG_HEALTH_FAILED))
    tl.ticks(20)
    assert reclassify(tl.obs, sigs, Thresholds()).state == "stalled"
    short = _thresholds({"not_generating_hold_s": 5, "stats_due_factor": 3, "restart_echo_s": 20})
    assert (short.not_generating_hold_s, short.stats_due_factor, short.restart_echo_s) == (5, 3, 20)
    assert reclassify(tl.obs, sigs, short).state != "stalled"
