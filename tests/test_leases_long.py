"""Leases past the window and the two operations that hold one by their engines' own lines:
KV-cache profiling and an RL weight transfer; a crawling download's ETA, known or not."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tests.obsbuilder import Timeline, events, gpu, procs, verdicts, window_of
from watchdog.commands.replay import reclassify
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import CanaryResult, Connection, LogEvent, Observation, ServerSample
from watchdog.core.state.leases import leases
from watchdog.core.state.window import Window

ENGINE = "(EngineCore_DP0 pid=79) INFO 12-25 04:52:03 "
# vLLM's own lines (gpu_model_runner.py, compilation/backends.py, monitor.py, gpu_worker.py).
MODEL_LOADED = (
    ENGINE + "[gpu_model_runner.py:3411] Model loading took 38.24 GiB memory and 226.51 seconds"
)
DYNAMO = ENGINE + "[backends.py:469] Dynamo bytecode transform time: 8.69 s"
COMPILED = ENGINE + "[monitor.py:34] torch.compile takes 18.40 s in total"
KV_DONE = ENGINE + "[gpu_worker.py:232] Available KV cache memory: 26.91 GiB"
# uvicorn's access log for vLLM's weight-transfer routes (logged when the response completes).
ACCESS = '(APIServer pid=1) INFO:     127.0.0.1:52814 - "POST /{route} HTTP/1.1" {status} OK'
IDLE_API = ServerSample(up=True, health_status=200, iterations=10.0, running=0.0, waiting=0.0)
AUTOTUNE = (
    "(EngineCore pid=282) 2026-05-30 07:15:45,192 - INFO - autotuner.py:615 - "
    "flashinfer.jit: [Autotuner]: Autotuning process starts ..."
)


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def _profile(sigs: SignatureSet, printing_s: int, silent_s: int, compiled: bool) -> list:
    """vLLM's KV-cache profile run after its weights loaded: a Dynamo line each minute for
    `printing_s` (the profile run compiles the model), torch.compile's total if `compiled`,
    then nothing for `silent_s`."""
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events([MODEL_LOADED], sigs))
    for i in range(printing_s // 5):
        tl.tick(logs=events([DYNAMO], sigs) if i % 12 == 11 else ())
    if compiled:
        tl.tick(logs=events([COMPILED], sigs))
    tl.ticks(silent_s // 5)
    return verdicts(tl.obs, sigs)


def test_kv_cache_profiling_that_keeps_printing_is_never_a_hang(sigs: SignatureSet) -> None:
    pairs = _profile(sigs, printing_s=1200, silent_s=0, compiled=False)
    assert not any(v.is_hang or v.state == "stalled" for _, v in pairs), {v.state for _, v in pairs}
    last = pairs[-1][1]
    # Past its bound (900 s) and past the window (600 s): its start line is out of the ring,
    # and the lease still reads its open time from it.
    assert last.state == "crawling", (last.state, last.reason)
    m = re.search(r"KV-cache memory profiling open for (\d+) s \(its bound: 900 s\)", last.reason)
    assert m is not None and int(m.group(1)) >= 1195, last.reason
    assert any(e.kind == "crawling" and "KV-cache" in e.detail for e in last.evidence)


def test_kv_cache_profiling_silent_past_its_bound_is_the_hang_naming_it(
    sigs: SignatureSet,
) -> None:
    """Compiled, then the profile's dummy forward pass never returns and logs nothing."""
    pairs = _profile(sigs, printing_s=120, silent_s=700, compiled=True)
    last_line = next(o.t for o, _ in reversed(pairs) if o.logs)
    early = [v for o, v in pairs if o.t - last_line < 590]
    assert not any(v.state == "stalled" or v.is_hang for v in early), {v.state for v in early}
    last = pairs[-1][1]
    assert last.state in ("stalled", "hung"), (last.state, last.reason)
    assert "wedged: KV-cache memory profiling showed no progress of its own" in last.reason


def test_kv_cache_profiling_ends_at_its_result_line(sigs: SignatureSet) -> None:
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events([MODEL_LOADED], sigs))
    tl.tick(logs=events([DYNAMO], sigs))
    assert [le.op.id for le in leases(tl.obs, sigs.ops)] == ["kv_cache_profile"]
    tl.tick(logs=events([KV_DONE], sigs))
    assert leases(tl.obs, sigs.ops) == ()


def _transfer(sigs: SignatureSet, start: bool, held_s: int, finish: bool) -> list:
    """A vLLM server, ready and idle, receives new weights: the trainer calls
    /start_weight_update, the idle canary goes unanswered while the chunk is in flight (no line
    until it completes), then /finish_weight_update and the canary answers."""
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs(), server=IDLE_API)
    tl.ticks(10)
    begin = ACCESS.format(route="start_weight_update", status=200)
    tl.tick(logs=events([begin], sigs) if start else ())
    tl.tick(canary=CanaryResult(timed_out=True, waited_s=5.0, result="timeout"))
    tl.ticks(held_s // 5)
    if finish:
        tl.tick(logs=events([ACCESS.format(route="finish_weight_update", status=200)], sigs))
        tl.tick(canary=CanaryResult(timed_out=False, waited_s=0.1, result="ok"))
    return verdicts(tl.obs, sigs)


def test_a_weight_transfer_within_its_bound_holds_the_canary_stall(sigs: SignatureSet) -> None:
    pairs = _transfer(sigs, start=True, held_s=400, finish=True)
    assert not any(v.is_hang or v.state == "stalled" for _, v in pairs), [
        (v.state, v.reason) for _, v in pairs if v.state == "stalled"
    ][:1]
    during = pairs[-3][1]
    assert during.state == "loading" and "weight transfer (RL weight update)" in during.reason
    assert "its bound: 720 s" in during.reason
    assert pairs[-1][1].state == "idle"


def test_the_same_canary_stall_without_a_transfer_is_the_stall(sigs: SignatureSet) -> None:
    pairs = _transfer(sigs, start=False, held_s=60, finish=False)
    assert pairs[-1][1].state in ("stalled", "hung")


def test_a_weight_transfer_past_its_bound_is_the_hang_naming_it(sigs: SignatureSet) -> None:
    pairs = _transfer(sigs, start=True, held_s=800, finish=False)
    begun = next(o.t for o, _ in pairs if o.logs)
    held = [v for o, v in pairs if o.t - begun < 715]
    assert not any(v.state == "stalled" or v.is_hang for v in held), {v.state for v in held}
    last = pairs[-1][1]
    assert last.state in ("stalled", "hung")
    assert "wedged: weight transfer (RL weight update) showed no progress" in last.reason


def test_a_failed_weight_transfer_releases_its_lease(sigs: SignatureSet) -> None:
    tl = Timeline(step=5.0, server=IDLE_API)
    tl.tick(logs=events([ACCESS.format(route="start_weight_update", status=200)], sigs))
    assert [le.op.id for le in leases(tl.obs, sigs.ops)] == ["weight_transfer"]
    tl.tick(logs=events([ACCESS.format(route="update_weights", status=500)], sigs))
    assert leases(tl.obs, sigs.ops) == ()


def _crawl(sigs: SignatureSet, fetch: str, ops: tuple = ()) -> tuple:  # type: ignore[type-arg]
    """A cubin fetch whose socket receives 12 KB/s for 60 s; its leases at the end."""
    tl = Timeline(step=5.0)
    tl.tick(logs=(LogEvent("line", fetch, "test", {}),))
    sock = Connection(283, "edge.urm.nvidia.com", "203.0.113.7", 443, "ESTABLISHED", 0.0, 0)
    for i in range(12):
        tl.tick(conns=(replace(sock, age_s=5.0 * i, bytes_received=60_000 * (i + 1)),))
    return leases(tl.obs, ops or sigs.ops)


FETCH = (
    "2026-05-30 07:15:45,192 - INFO - cubin_loader.py:88 - flashinfer.jit: Fetching cubin "
    "fmha.cubin from https://edge.urm.nvidia.com/artifactory/fmha.cubin"
)


def test_a_crawling_flashinfer_download_shows_its_rate_and_an_unknown_eta(
    sigs: SignatureSet,
) -> None:
    """FlashInfer logs no size and TLS hides Content-Length: no ETA is made up."""
    (lease,) = _crawl(sigs, FETCH)
    assert lease.eta_s is None and lease.bytes_per_s == pytest.approx(12_000)
    text = lease.describe(1100.0)
    assert "receiving 12000 B/s" in text and "ETA unknown" in text


def test_a_download_whose_start_line_states_its_size_has_an_eta(sigs: SignatureSet) -> None:
    table = """
schema = 1
[[op]]
id = "sized_fetch"
start = 'Fetching (?P<size>\\d+) bytes from \\S+'
end = 'Fetched '
signature = ""
bound_s = 120
quiet_s = 60
signals = ["socket_bytes"]
state = "loading"
"""
    ops = load_ops(table)
    (lease,) = _crawl(sigs, "Fetching 1200000 bytes from https://cdn.example/k.cubin", ops)
    # 12 ticks of 60 000 bytes, the first counted from the second tick: 660 000 received, the
    # rest at 12 000 B/s.
    assert lease.eta_s == pytest.approx((1_200_000 - 660_000) / 12_000)
    assert "ETA 45 s" in lease.describe(1100.0)


def bar(n: int, total: int = 300) -> str:
    """FlashInfer's autotune bar (vllm-project/vllm#58031's format)."""
    return (
        f"[AutoTuner]: Tuning flashinfer::trtllm_fp4_block_scale_moe: {n * 100 // total:3d}%|"
        f"#####     | {n}/{total} [01:46<00:11, 11.41s/profile]"
    )


def _long_autotune(sigs: SignatureSet, progress_s: int, silent_s: int) -> list:
    """A 40-minute MoE autotune at boot (vllm-project/vllm#58031 ran 40+ minutes on GB300):
    a profile finished every 10 s for `progress_s`, then nothing for `silent_s`."""
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events([AUTOTUNE], sigs))
    for i in range(progress_s // 5):
        tl.tick(logs=events([bar(i // 2 + 1)], sigs) if i % 2 == 0 else ())
    tl.ticks(silent_s // 5)
    return verdicts(tl.obs, sigs)


def test_a_40_minute_autotune_with_progress_stays_quiet_past_the_window(
    sigs: SignatureSet,
) -> None:
    pairs = _long_autotune(sigs, progress_s=2400, silent_s=0)
    assert not any(v.is_hang or v.state == "stalled" or v.suspicious for _, v in pairs)
    start = pairs[0][0].t
    at_30 = next(v for o, v in pairs if o.t - start >= 1800)
    assert at_30.state == "crawling", (at_30.state, at_30.reason)
    m = re.search(r"kernel autotuning open for (\d+) s", at_30.reason)
    assert m is not None and int(m.group(1)) >= 1800, at_30.reason


def test_the_same_autotune_is_the_hang_once_its_progress_stops(sigs: SignatureSet) -> None:
    pairs = _long_autotune(sigs, progress_s=1800, silent_s=400)
    last_bar = next(o.t for o, _ in reversed(pairs) if o.logs)
    held = [v for o, v in pairs if o.t - last_bar < 290]
    assert not any(v.state == "stalled" or v.is_hang for v in held)
    last = pairs[-1][1]
    assert last.state in ("stalled", "hung")
    assert "wedged: kernel autotuning showed no progress of its own" in last.reason
    wedged = next(e for e in last.evidence if e.kind == "wedged")
    m = re.search(r"kernel autotuning open for (\d+) s", wedged.detail)
    assert m is not None and int(m.group(1)) >= 2195, wedged.detail


def _autotune_obs(sigs: SignatureSet, n: int) -> list[Observation]:
    tl = Timeline(step=5.0, procs=procs())
    tl.tick(logs=events([AUTOTUNE], sigs))
    for i in range(n):
        tl.tick(logs=events([bar(i // 3 + 1)], sigs) if i % 3 == 0 else ())
    return tl.obs


def test_the_window_carries_what_its_ring_dropped(sigs: SignatureSet) -> None:
    """The leases of a window whose ring dropped 20 minutes are those of the whole history."""
    obs = _autotune_obs(sigs, 300)
    w = Window(span_s=600.0, ops=sigs.ops)
    for o in obs:
        w.append(o)
    assert w.latest is not None and next(iter(w)).t > obs[0].t  # the start line is gone
    whole = [(le.op.id, le.started_t, le.last_t, le.shown) for le in leases(obs, sigs.ops)]
    carried = leases(w, sigs.ops, w.carried)
    assert [(le.op.id, le.started_t, le.last_t, le.shown) for le in carried] == whole
    assert carried[0].started_t == obs[0].t
    # Without the carry (a window given no operations), the start is lost.
    plain = window_of(obs)
    assert leases(plain, sigs.ops, plain.carried)[0].started_t > obs[0].t


def test_a_restart_drops_the_old_servers_operations(sigs: SignatureSet) -> None:
    obs = _autotune_obs(sigs, 200)
    w = Window(span_s=600.0, ops=sigs.ops)
    for o in obs:
        w.append(o)
    assert "autotune" in w.carried
    w.append(Observation(t=obs[-1].t + 5.0, wall=0.0, procs=procs(pid=5000)))
    assert dict(w.carried) == {}


def test_lines_dropped_for_memory_keep_what_a_lease_reads(sigs: SignatureSet) -> None:
    """Past the window's byte budget the oldest ticks lose their lines, but not an
    operation's start, progress or end."""
    w = Window(span_s=600.0, max_chars=20_000, ops=sigs.ops)
    t = 1000.0
    w.append(Observation(t=t, wall=0.0, logs=events([AUTOTUNE], sigs)))
    for _ in range(40):
        t += 5.0
        noise = LogEvent("line", "x" * 3000, "test", {})
        w.append(Observation(t=t, wall=0.0, logs=(noise,)))
    assert w.chars <= 20_000 + 4096
    (lease,) = leases(w, sigs.ops, w.carried)
    assert lease.op.id == "autotune" and lease.started_t == 1000.0


def test_start_holds_must_be_a_flag() -> None:
    table = """
schema = 1
[[op]]
id = "x"
start = 'a'
end = 'b'
quiet_s = 5
start_holds = "yes"
"""
    with pytest.raises(ValueError, match="start_holds"):
        load_ops(table)


def test_a_bundle_replays_the_lease_the_live_window_carried(sigs: SignatureSet) -> None:
    """A bundle holds the carried lines ahead of the ring (daemon/episodes.py): `replay`
    rebuilds the same lease, open since its start 30 minutes ago, and the same verdict."""
    obs = _autotune_obs(sigs, 360)  # 30 minutes of tuning, a profile every 15 s
    w = Window(span_s=600.0, ranks=sigs.ranks, ops=sigs.ops)
    for o in obs:
        w.append(o)
    live = classify(w, sigs, Thresholds())
    ghosts = w.carried_observations()
    assert ghosts and ghosts[0].t == obs[0].t and len(ghosts) <= 2
    replayed = reclassify([*ghosts, *w], sigs, Thresholds())
    assert live.state == "crawling" and "open for 1800 s" in live.reason, live.reason
    assert (replayed.state, replayed.reason) == (live.state, live.reason)
    # Without them the replay would read the lease from the ring's oldest bar.
    assert reclassify(list(w), sigs, Thresholds()).reason != live.reason
