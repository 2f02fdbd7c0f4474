"""The pure classifier: each shipped signature on a window built for it, timing and purity."""

from __future__ import annotations

import json

import pytest

from tests.obsbuilder import (
    ALL_REDUCE_STACK,
    DOWNLOAD_STACK,
    SERVER_PID,
    SYNC_STACK,
    Timeline,
    assert_never_hung,
    events,
    final,
    first_hang,
    frozen_bar,
    gpu,
    procs,
    sample_lines,
    sources,
    spin,
    stack,
    verdicts,
    window_of,
)
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import Observation, ServerSample, StackSample, from_dict, to_dict

CUBIN_LOG = "classify/cubin_download_v067.log"
GB300_FACTS = {"flashinfer-python": "0.6.7", "trtllm_attention": None}


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def test_architecture_signature_ids_are_all_shipped(sigs: SignatureSet) -> None:
    wanted = {
        "cubin_download_stall",
        "trtllm_attention_deadlock",
        "gpu_kernel_spin",
        "collective_hang",
        "engine_dead",
        "jit_toolchain_missing",
        "nvls_multicast_failure",
    }
    assert wanted <= set(sigs.ids)


# --- cubin_download_stall -------------------------------------------------------------------


def test_headline_cdn_socket_and_spin_is_cubin_download_stall(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    frozen_bar(tl, 40, cdn=True)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "cubin_download_stall")
    assert {"conns", "progress", "gpu"} <= sources(v)  # the GPU figures come as context
    assert any(e.detail.startswith("GPU 0: SM 0.99, DRAM 0.00") for e in v.evidence)
    assert any("edge.urm.nvidia.com" in e.detail for e in v.evidence if e.source == "conns")
    assert v.fallback == "disable_trtllm_attention" and v.fix and v.references


def test_download_stack_alone_is_cubin_download_stall(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*DOWNLOAD_STACK),))
    v = final(tl.obs, sigs)
    assert v.signature == "cubin_download_stall"
    stack_ev = [e for e in v.evidence if e.source == "stacks"]
    assert stack_ev and "download_file" in stack_ev[0].detail


def test_flashinfer_jit_lines_alone_are_cubin_download_stall(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, first_logs=events(sample_lines(CUBIN_LOG), sigs))
    v = final(tl.obs, sigs)
    assert v.signature == "cubin_download_stall"
    assert "log" in sources(v)
    assert any("flashinfer.jit: Downloading" in e.detail for e in v.evidence)


# --- trtllm_attention_deadlock and its neighbours ------------------------------------------


def _gb300(sigs: SignatureSet, cc: str = "10.3", facts: dict | None = None, cdn: bool = False):
    tl = Timeline(gpus=(spin(cc=cc),), procs=procs(), facts=dict(facts or GB300_FACTS))
    frozen_bar(tl, 40, cdn=cdn, stacks=(stack(*SYNC_STACK),))
    return final(tl.obs, sigs)


def test_gb300_spin_with_flashinfer_067_is_trtllm_attention_deadlock(sigs: SignatureSet) -> None:
    v = _gb300(sigs)
    assert (v.state, v.signature) == ("hung", "trtllm_attention_deadlock")
    assert {"gpu", "facts", "progress"} <= sources(v)
    kinds = {e.kind for e in v.evidence}
    assert {"gpu_spin", "gpu_cc", "package", "setting"} <= kinds
    assert any("10.3" in e.detail for e in v.evidence if e.kind == "gpu_cc")


@pytest.mark.parametrize(
    ("cc", "facts"),
    [
        ("10.3", {"flashinfer-python": "0.6.7.post2", "trtllm_attention": None}),
        ("10.3", {"flashinfer-python": "0.6.7", "trtllm_attention": False}),
        ("10.0", GB300_FACTS),
    ],
    ids=["fixed_flashinfer", "trtllm_disabled", "sm100"],
)
def test_without_every_trtllm_condition_it_is_gpu_kernel_spin(
    sigs: SignatureSet, cc: str, facts: dict
) -> None:
    v = _gb300(sigs, cc=cc, facts=facts)
    assert (v.state, v.signature) == ("hung", "gpu_kernel_spin")
    assert "gpu" in sources(v) and "stacks" in sources(v)


def test_cdn_socket_turns_trtllm_deadlock_into_cubin_download_stall(sigs: SignatureSet) -> None:
    assert _gb300(sigs, cdn=True).signature == "cubin_download_stall"


# --- collective_hang, engine_dead, jit_toolchain_missing, nvls_multicast_failure -----------


def test_stacks_in_all_reduce_are_collective_hang(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*ALL_REDUCE_STACK),))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "collective_hang")
    assert any("all_reduce" in e.detail for e in v.evidence if e.source == "stacks")


@pytest.mark.parametrize(
    "log",
    [
        "logs/d_vllm5458_nccl_watchdog_timeout.log",
        "logs/d_vllm2734_ray_stall_then_nccl_watchdog.log",
    ],
)
def test_nccl_watchdog_lines_are_collective_hang(sigs: SignatureSet, log: str) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events(sample_lines(log), sigs))
    tl.ticks(2)
    v = final(tl.obs, sigs)
    assert v.signature == "collective_hang"
    assert any(e.detail.startswith("NCCL watchdog timeout: ") for e in v.evidence)
    assert "log" in sources(v)


def test_health_503_is_engine_dead(sigs: SignatureSet) -> None:
    tl = Timeline(
        gpus=(gpu(0.0, 0.0),), procs=procs(), server=ServerSample(up=True, health_status=503)
    )
    tl.ticks(3)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("dead", "engine_dead")
    assert "server" in sources(v) and any("503" in e.detail for e in v.evidence)


@pytest.mark.parametrize(
    "log",
    [
        "logs/e_vllm41647_apiserver_enginedeaderror.log",
        "logs/e_ascend5117_compose_prefix_enginedeaderror.log",
    ],
)
def test_engine_dead_error_lines_are_engine_dead(sigs: SignatureSet, log: str) -> None:
    tl = Timeline(procs=procs(), server=ServerSample(up=True, health_status=200))
    tl.tick(logs=events(sample_lines(log), sigs))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("dead", "engine_dead")
    assert any("EngineDeadError" in e.detail for e in v.evidence if e.source == "log")


@pytest.mark.parametrize(
    ("log", "sig"),
    [
        ("logs/b_kserve4657_nvcc_not_found.log", "jit_toolchain_missing"),
        ("logs/b_vllm23176_ninja_build_failed.log", "jit_toolchain_missing"),
        ("logs/preflight_runtime/jit_ninja_missing_transformerlab381.log", "jit_toolchain_missing"),
        ("logs/preflight_runtime/jit_could_not_find_nvcc_fi1919.log", "jit_toolchain_missing"),
        ("logs/c_pt177472_nvls_bind_cuda401.log", "nvls_multicast_failure"),
        ("logs/c_nccl1029_nvls_init_error_multinode.log", "nvls_multicast_failure"),
        ("logs/preflight_runtime/nvls_bind_cuda401_pt177472.log", "nvls_multicast_failure"),
        ("logs/preflight_runtime/nvls_init_error_nccl1029.log", "nvls_multicast_failure"),
    ],
)
@pytest.mark.parametrize(("alive", "state"), [(True, "hung"), (False, "dead")])
def test_crash_lines_name_their_signature(
    sigs: SignatureSet, log: str, sig: str, alive: bool, state: str
) -> None:
    tl = Timeline(procs=procs())
    tl.tick(logs=events(sample_lines(log), sigs))
    tl.tick(procs=procs(alive=alive))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == (state, sig)
    assert "log" in sources(v)
    assert v.fallback == ("none" if sig == "jit_toolchain_missing" else "disable_nvls")


def test_capture_failure_is_reported_as_evidence(sigs: SignatureSet) -> None:
    failed = StackSample(4243, "VLLM::EngineCore", error="permission denied", fix="add SYS_PTRACE")
    tl = Timeline(gpus=(gpu(0.1, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=(failed,))
    v = final(tl.obs, sigs)
    assert v.state == "stalled"
    assert any(e.source == "stacks" and "SYS_PTRACE" in e.detail for e in v.evidence)


# --- timing and purity ----------------------------------------------------------------------


def test_headline_hang_is_reported_within_25_s_of_onset(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    onset = frozen_bar(tl, 60, cdn=True)
    hit = first_hang(verdicts(tl.obs, sigs, Thresholds()))
    assert hit is not None, "the headline hang was never reported"
    obs, v = hit
    assert v.signature == "cubin_download_stall"
    assert obs.t - onset <= 25


def test_classify_is_pure(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(cc="10.3"),), procs=procs(), facts=dict(GB300_FACTS))
    frozen_bar(tl, 40, stacks=(stack(*SYNC_STACK),))
    w = window_of(tl.obs)
    first, second = classify(w, sigs, Thresholds()), classify(w, sigs, Thresholds())
    assert first == second and first.is_hang


@pytest.mark.parametrize("cdn", [True, False])
def test_round_tripped_observations_give_the_same_verdict(sigs: SignatureSet, cdn: bool) -> None:
    tl = Timeline(gpus=(spin(cc="10.3"),), procs=procs(), facts=dict(GB300_FACTS))
    frozen_bar(tl, 40, cdn=cdn, stacks=(stack(*DOWNLOAD_STACK if cdn else SYNC_STACK),))
    again = [from_dict(Observation, json.loads(json.dumps(to_dict(o)))) for o in tl.obs]
    assert again == tl.obs
    assert final(again, sigs) == final(tl.obs, sigs)
    assert final(again, sigs).is_hang


# --- not hangs ------------------------------------------------------------------------------


def test_weight_loading_that_advances_is_loading(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    for i, ev in enumerate(events(sample_lines("logs/h_vllm44985_safetensors_weight_loading.log"))):
        if ev.kind != "loading":
            break
        # 20 s per shard, the GPU idle and the bar silent in between, the server reading weights
        for j in range(20):
            tl.tick(logs=(ev,) if j == 0 else (), procs=procs(read_bytes=(i * 20 + j) << 30))
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert {v.state for _, v in pairs} == {"loading"}


def test_jit_compiling_with_compiler_children_is_compiling(sigs: SignatureSet) -> None:
    for compilers in (("nvcc",), ("ninja", "cicc"), ("ptxas",)):
        tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs(compilers=compilers))
        frozen_bar(tl, 90)
        pairs = verdicts(tl.obs, sigs)
        assert_never_hung(pairs)
        assert pairs[-1][1].state == "compiling"
        assert compilers[0] in pairs[-1][1].reason
    # the same window without the compilers is a stall: the compilers are what make it benign
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 90)
    assert final(tl.obs, sigs).state == "stalled"


def test_cuda_graph_capture_that_advances_then_goes_quiet_is_compiling(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    lines = sample_lines("logs/h_vllm27521_piecewise_cudagraph_capture_tqdm.log")
    for ev in events(lines):
        tl.tick(logs=(ev,))
        tl.ticks(4)
    tl.ticks(60)  # long silence while the last graphs are captured (getainode/ainode #112)
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert pairs[-1][1].state == "compiling"


def test_idle_after_the_last_stats_line_is_idle(sigs: SignatureSet) -> None:
    # vLLM logs one all-zero stats line and then demotes it to DEBUG: silence means nothing.
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events(sample_lines("classify/idle_stats.log")))
    tl.ticks(180)
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert pairs[-1][1].state == "idle"


def test_silence_after_a_pending_zero_stats_line_is_not_idle(sigs: SignatureSet) -> None:
    # d_vllm48752: throughput drops to 0.0 with Running: 3, then the stats line goes quiet.
    log = events(sample_lines("logs/d_vllm48752_throughput_zero_then_shm_broadcast.log"))
    stats = tuple(e for e in log if e.kind == "stats")
    tl = Timeline(gpus=(spin(),), procs=procs())
    tl.tick(logs=stats)
    tl.ticks(40)
    v = final(tl.obs, sigs)
    assert v.state != "idle" and v.signature == "gpu_kernel_spin"


def test_long_first_batch_with_high_dram_is_serving(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.99, 0.6),), procs=procs())
    frozen_bar(tl, 120)
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert pairs[-1][1].state == "serving" and not pairs[-1][1].suspicious


def test_idle_gpu_latched_at_100_percent_with_no_processes_is_idle(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(1.0, 0.0, procs=0),), procs=procs())
    tl.tick(logs=events(sample_lines("classify/idle_stats.log")))
    tl.ticks(120)
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert pairs[-1][1].state == "idle"


def test_latched_gpu_without_processes_is_no_gpu_spin_evidence(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(1.0, 0.0, procs=0),), procs=procs())
    frozen_bar(tl, 60)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("stalled", None)


@pytest.mark.parametrize(("blip_s", "signature"), [(6, None), (14, "gpu_kernel_spin")])
def test_gpu_blip_shorter_than_spin_for_s_is_no_spin(
    sigs: SignatureSet, blip_s: int, signature: str | None
) -> None:
    th = Thresholds()
    assert blip_s < th.gpu_spin_for_s or signature is not None
    tl = Timeline(gpus=(gpu(0.2, 0.0),), procs=procs())
    frozen_bar(tl, 40)
    tl.ticks(blip_s, gpus=(spin(),))
    v = final(tl.obs, sigs, th)
    assert v.signature == signature
    assert v.state == ("stalled" if signature is None else "hung")


def test_health_200_and_running_0_with_a_frozen_bar_is_still_pending(sigs: SignatureSet) -> None:
    # vllm #46811: /health 200 and num_requests_running 0 during a real wedge.
    quiet = ServerSample(up=True, health_status=200, iterations=40.0, running=0.0, waiting=0.0)
    tl = Timeline(gpus=(spin(),), procs=procs(), server=quiet)
    frozen_bar(tl, 40)
    v = final(tl.obs, sigs)
    assert v.seconds_since_progress is not None and v.seconds_since_progress >= 15
    assert (v.state, v.signature) == ("hung", "gpu_kernel_spin")


def test_stalled_without_a_signature_is_stalled_with_evidence(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.3, 0.01),), procs=procs())
    frozen_bar(tl, 40)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature, v.is_hang) == ("stalled", None, False)
    assert v.suspicious and v.fix
    assert {"progress", "gpu"} <= sources(v)
    assert any("Processed prompts" in e.detail for e in v.evidence if e.source == "progress")


def test_without_gpu_figures_the_blind_stall_threshold_applies(sigs: SignatureSet) -> None:
    th = Thresholds()
    tl = Timeline(gpus=(), procs=procs())
    onset = frozen_bar(tl, int(th.blind_stall_after_s) + 5)
    pairs = verdicts(tl.obs, sigs, th)
    first = next(o.t for o, v in pairs if v.state == "stalled")
    assert first - onset == th.blind_stall_after_s
    assert_never_hung(pairs)


def test_suspicious_comes_before_the_stall(sigs: SignatureSet) -> None:
    th = Thresholds()
    tl = Timeline(gpus=(gpu(0.1, 0.0),), procs=procs())
    onset = frozen_bar(tl, 30)
    pairs = verdicts(tl.obs, sigs, th)
    suspicious = next(o.t for o, v in pairs if v.suspicious)
    stalled = next(o.t for o, v in pairs if v.state == "stalled")
    assert suspicious - onset == th.suspect_after_s and stalled - onset == th.stall_after_s


# --- stale or generic stack evidence must not outrank the cause -----------------------------

SITE = "/usr/lib/python3.12/site-packages"
SHM_DEQUEUE = (
    ("Condition.wait", "/usr/lib/python3.12/threading.py"),
    ("MessageQueue.dequeue", f"{SITE}/vllm/distributed/device_communicators/shm_broadcast.py"),
)


def _tp2(*worker: tuple[str, str]) -> tuple[StackSample, ...]:
    """TP=2: the engine waits for its workers in shm_broadcast; worker 1 is in `worker`."""
    engine = stack(*SHM_DEQUEUE, pid=SERVER_PID + 1)
    return (engine, stack(*worker, pid=SERVER_PID + 2), stack(*SHM_DEQUEUE, pid=SERVER_PID + 3))


def test_tp2_cubin_stall_is_not_taken_for_a_collective_hang(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=_tp2(*DOWNLOAD_STACK))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "cubin_download_stall")


def test_tp2_gb300_deadlock_is_not_taken_for_a_collective_hang(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(cc="10.3"),), procs=procs(), facts=dict(GB300_FACTS))
    frozen_bar(tl, 40, stacks=_tp2(*SYNC_STACK))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "trtllm_attention_deadlock")


def test_engine_waiting_in_shm_broadcast_alone_is_no_collective_hang(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*SHM_DEQUEUE),))
    v = final(tl.obs, sigs)
    assert v.signature != "collective_hang" and v.state == "stalled"


def test_a_collective_frame_that_moved_between_dumps_names_no_collective_hang(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*ALL_REDUCE_STACK, unchanged=False),))
    assert final(tl.obs, sigs).signature != "collective_hang"


def test_qualified_frame_names_from_py_spy_match_by_function(sigs: SignatureSet) -> None:
    # py-spy 0.4 on Python >= 3.11 prints `Class.method`; the rule names the function.
    # A file no `files` pattern knows, so only the function name can match.
    qualified = tuple(
        (f"Loader.{name}", "/opt/app/vendored_fetch.py") for name, _ in DOWNLOAD_STACK
    )
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*qualified),))
    v = final(tl.obs, sigs)
    assert v.signature == "cubin_download_stall"
    assert any("Loader.download_file" in e.detail for e in v.evidence if e.source == "stacks")


def test_stacks_from_before_the_server_moved_on_are_not_evidence(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    frozen_bar(tl, 30, stacks=(stack(*ALL_REDUCE_STACK),))
    assert final(tl.obs, sigs).signature == "collective_hang"
    # The batch finishes: the bar reaches 1/1 and the server goes on serving.
    done = events(["Processed prompts: 100%|##########| 1/1 [00:31<00:00, 31.0s/it]"])
    tl.tick(logs=done, gpus=(gpu(0.5, 0.4),))
    tl.ticks(5, gpus=(gpu(0.5, 0.4),))
    v = final(tl.obs, sigs)
    assert not v.is_hang and v.signature is None


def test_an_old_engine_dead_error_does_not_outlive_a_restart(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events(sample_lines("logs/e_vllm41647_apiserver_enginedeaderror.log"), sigs))
    tl.ticks(3)
    assert final(tl.obs, sigs).signature == "engine_dead"
    tl.procs = procs(SERVER_PID + 100)  # the supervisor started a new server
    tl.ticks(5)
    v = final(tl.obs, sigs)
    assert v.signature is None and v.state not in ("dead", "hung")


def test_flashinfer_disabled_warning_on_a_serving_server_is_no_crash(sigs: SignatureSet) -> None:
    warning = (
        "(EngineCore pid=1) WARNING 11-30 08:00:00 [flashinfer.py:120] FlashInfer kernels are "
        "disabled: flashinfer-cubin is not installed and nvcc (CUDA_HOME, CUDA_PATH, PATH or "
        "/usr/local/cuda) or ninja (PATH) is missing."
    )
    tl = Timeline(gpus=(gpu(0.4, 0.3),), procs=procs())
    tl.tick(logs=events([warning], sigs))
    tl.tick(logs=events(sample_lines("logs/f_vllm43295_apiserver_engine000.log"), sigs))
    tl.ticks(10)
    pairs = verdicts(tl.obs, sigs)
    assert_never_hung(pairs)
    assert pairs[0][1].signature is None
