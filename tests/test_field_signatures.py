"""The signatures and benign rules added from real incidents: each one named by its evidence,
and a near miss that must not name it (the same words in a healthy log, a recovered retry, a
warning the server serves through). Real lines come from tests/data/corpus/; where a test needs
a line no thread holds, it is built from the upstream format string, cited at the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.obsbuilder import (
    SERVER_PID,
    Timeline,
    events,
    final,
    frozen_bar,
    gpu,
    procs,
    spin,
    stack,
)
from tests.shipped import PATTERNS
from watchdog.core.judge.classify import Thresholds
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import ServerSample, Verdict
from watchdog.sources.gpu.file import GpuFileSource
from watchdog.sources.logs.source import FileFollower, LogSource

CORPUS = Path(__file__).parent / "data" / "corpus"


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def lines(name: str) -> list[str]:
    return (CORPUS / name).read_text(encoding="utf-8").splitlines()


def named(log: list[str], sigs: SignatureSet) -> list[str]:
    from watchdog.commands.replaylog import read_log

    _, evs = read_log(("\n".join(log) + "\n").encode(), sigs, PATTERNS)
    return [m.signature.id for m in name_signatures(evs, sigs)]


# sglang python/sglang/srt/utils/watchdog.py (0.5.23): f"{self.debug_name} watchdog timeout
# ({self.watchdog_timeout=}, {self.soft=})"; the soft watchdog only dumps, the batch may finish.
PREFIX = "[2026-01-01 10:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, "
SOFT = PREFIX + "self.soft=True)"
HARD = PREFIX + "self.soft=False)"


def test_sglang_hard_watchdog_names_and_soft_one_does_not(sigs: SignatureSet) -> None:
    assert named([HARD], sigs) == ["sglang_scheduler_watchdog_timeout"]
    assert named([SOFT], sigs) == []


# tensorrt_llm/_torch/pyexecutor/hang_detector.py@06c5e532 HangDetector._detect_hang logs
# f"Hang detected after {self.timeout} seconds."; py_executor.py's on_detected names the rank,
# graceful (PR #15222) or hard-killing (py_executor.py@00043967). Python logger prefix from
# tensorrt_llm/logger.py: "[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [MPI_Rank N] [E] ".
TRT = "[12/01/2026-10:00:00] [TRT-LLM] [MPI_Rank 3] [E] "


@pytest.mark.parametrize(
    "line",
    [
        "Hang detected after 300 seconds.",
        "Hang detected on rank 3 in PyExecutor.",
        "Hang detected on rank 3 in PyExecutor; hard-killing and propagating to peer ranks.",
    ],
)
def test_trtllm_hang_detector_names_its_own_signature(sigs: SignatureSet, line: str) -> None:
    assert named([TRT + line], sigs) == ["trtllm_hang_detector_fired"]


def test_trtllm_hang_detector_near_misses(sigs: SignatureSet) -> None:
    # the knob in an argument dump, the words in another component's message, a healthy iter
    quiet = [
        "[12/01/2026-10:00:00] [TRT-LLM] [I] PyTorchConfig(hang_detection_timeout=300, ...)",
        TRT + "Hang detected on rank 3 in the proxy.",
        "[12/01/2026-10:00:01] [TRT-LLM] [I] iter = 12, global_rank = 0, rank = 0, "
        "currank_total_requests = 0/0, host_step_time = 20.1ms, prev_device_step_time = 19.8ms, "
        "timestamp = 2026-12-01 10:00:01, num_scheduled_requests: 4, states = "
        "{'num_ctx_requests': 0, 'num_ctx_tokens': 0, 'num_generation_tokens': 4}",
    ]
    assert named(quiet, sigs) == []


def test_gloo_timeout_vllm_ignores_is_no_network_error(sigs: SignatureSet) -> None:
    ignored = lines("n17_vllm16514_gloo_error_ignored_then_fatal.log")[0]
    assert "Error ignored in is_in_the_same_node" in ignored
    assert named([ignored], sigs) == []
    assert named(lines("n18_vllm5084_gloo_recv_timeout.log"), sigs) == ["collective_network_error"]


def test_ib_selection_lines_are_no_network_error(sigs: SignatureSet) -> None:
    assert named(lines("n61_vllm8978_nccl_no_ib_socket.log"), sigs) == []
    assert named(lines("n60_nccl857_libibverbs_warn.log"), sigs) == []


def test_allreduce_workspace_warnings_vllm_retries_are_no_hang_alone(sigs: SignatureSet) -> None:
    assert named(lines("n29_vllm51986_fi_allreduce_workspace_warnings.log"), sigs) == []


def test_allreduce_workspace_warnings_during_a_stall_name_the_fusion_hang(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    warn = events(lines("n29_vllm51986_fi_allreduce_workspace_warnings.log"), sigs)
    frozen_bar(tl, 40, first_logs=warn)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "flashinfer_allreduce_fusion_hang")


def test_jit_build_lock_needs_both_frames(sigs: SignatureSet) -> None:
    dump = lines("n26_fi993_pyspy_filelock_load_cuda_ops.log")
    assert named(dump, sigs) == ["jit_compile_stuck"]
    building = [x for x in dump if "filelock" not in x]  # the same dump without the lock wait
    assert named(building, sigs) == []


def test_mismatched_collectives_name_rank_divergence_and_a_timeout_does_not(
    sigs: SignatureSet,
) -> None:
    diverged = lines("n69_lightning19106_detected_mismatch_collectives.log")
    assert named(diverged, sigs) == ["rank_divergence"]
    timeout = lines("n50_vllm42354_watchdog_allgather_timeout.log")
    assert named(timeout, sigs) == ["collective_hang"]


def test_grammar_compile_exception_in_one_traceback_is_no_freeze(sigs: SignatureSet) -> None:
    assert named(lines("n70_vllm47312_xgrammar_compile_exception.log"), sigs) == []


XGRAMMAR = (
    ("compile_json_schema", "/usr/local/lib/python3.12/dist-packages/xgrammar/compiler.py"),
    (
        "compile_grammar",
        "/usr/local/lib/python3.12/dist-packages/vllm/v1/structured_output/backend_xgrammar.py",
    ),
)


def test_grammar_compile_unchanged_across_two_dumps_during_a_stall_is_a_freeze(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 30, stacks=(stack(*XGRAMMAR, unchanged=True),))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "structured_output_or_tokenizer_freeze")


WINDOW_REGISTER = (
    ("recvmsg", "libc.so.6"),
    ("ncclCommWindowRegister", "libnccl.so.2"),
    (
        "register_mem_pool",
        "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py",
    ),
)


def test_scheduler_in_window_registration_is_the_window_register_deadlock(
    sigs: SignatureSet,
) -> None:
    # sglang #36943: every TP scheduler in ncclCommWindowRegister's recvmsg, GPUs idle.
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 30, stacks=(stack(*WINDOW_REGISTER),))
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "nccl_window_register_deadlock")
    assert v.fallback == "disable_nvls"


def test_a_stack_in_communicator_init_is_not_window_registration(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 30, stacks=(stack(("ncclCommInitRank", "libnccl.so.2")),))
    v = final(tl.obs, sigs)
    assert v.signature != "nccl_window_register_deadlock"


GRAPH_REPLAY = (
    ("cudaGraphLaunch", "libcudart.so.12"),
    ("replay", "/usr/lib/python3.12/site-packages/torch/cuda/graphs.py"),
)


def test_spin_under_graph_replay_is_named_and_a_bare_spin_stays_generic(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(spin(),), procs=procs())
    frozen_bar(tl, 40, stacks=(stack(*GRAPH_REPLAY),))
    assert final(tl.obs, sigs).signature == "cuda_graph_kernel_spin"
    bare = Timeline(gpus=(spin(),), procs=procs())
    frozen_bar(bare, 40)
    assert final(bare.obs, sigs).signature == "gpu_kernel_spin"


def test_a_graph_replay_dump_in_a_stalled_log_is_not_the_spin_without_gpu_evidence(
    sigs: SignatureSet,
) -> None:
    """cuda_graph_kernel_spin requires GPU-spin evidence, which no log holds: a py-spy dump in
    replay plus a stalled stats line names nothing from the log alone (it did, because a
    required GPU rule was skipped in log mode), while the live watchdog names it (above)."""
    # py-spy `dump` text: `Thread N (active): "name"` then `    name (file:line)` frames;
    # the stats line is the real stalled one from vllm #21148.
    dump = [
        'Thread 2101 (active): "MainThread"',
        "    replay (torch/cuda/graphs.py:88)",
        "    execute_model (vllm/v1/worker/gpu_model_runner.py:1510)",
    ]
    stalled = lines("n90_vllm21148_guided_json_running1_zero.log")
    assert named(dump + stalled, sigs) == []


# vllm/v1/metrics/loggers.py LoggingStatLogger.log: "Engine %03d: Avg prompt throughput: %.1f
# tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, ..."
def _stats(running: int, waiting: int, gen: float) -> str:
    return (
        "(APIServer pid=851) INFO 04-28 22:54:32 [loggers.py:257] Engine 000: Avg prompt "
        f"throughput: 0.0 tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: "
        f"{running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: 0.0%, "
        "Prefix cache hit rate: 0.0%"
    )


def test_nothing_running_with_requests_waiting_is_the_admission_deadlock(
    sigs: SignatureSet,
) -> None:
    assert named([_stats(0, 5, 0.0)], sigs) == ["scheduler_admission_deadlock"]
    # The same line in the middle of a log the server then serves through: no hang.
    assert named([_stats(0, 5, 0.0), _stats(3, 2, 41.0)], sigs) == []
    # Idle (nothing waiting) is no deadlock (vllm #16361).
    assert named(lines("n48_vllm16361_idle_stats.log"), sigs) == []


def test_real_v0_log_with_pending_and_none_running_is_the_admission_deadlock(
    sigs: SignatureSet,
) -> None:
    """vllm PR #8378: requests stack up in Pending with nothing running; cut before the stall
    (Pending 12 while prompts still flow at 70.6 tok/s) it names nothing."""
    stalled = lines("n86_vllm8378_v0_pending_none_running.log")
    assert named(stalled, sigs) == ["scheduler_admission_deadlock"]
    assert named(lines("n87_vllm8378_v0_pending_while_prefilling.log"), sigs) == []
    # A request running with zero throughput (vllm #17972) stalls inside a step: not admission.
    assert named(lines("n88_vllm17972_running1_zero_throughput_health200.log"), sigs) == []


def test_llguidance_toktrie_panic_is_the_structured_output_freeze(sigs: SignatureSet) -> None:
    """vllm #21204: the guidance backend's Rust token trie panics and the request hangs; a Rust
    panic from another crate (huggingface/tokenizers #444) or the tokenizers fork warning a run
    serves through (vllm #15056) names nothing."""
    panic = lines("n89_vllm21204_llguidance_toktrie_panic.log")
    assert named(panic, sigs) == ["structured_output_or_tokenizer_freeze"]
    assert named(lines("n103_tokenizers444_rust_panic_not_toktrie.log"), sigs) == []
    assert named(lines("n91_vllm15056_tokenizers_fork_warning.log"), sigs) == []


def test_live_watchdog_names_the_llguidance_panic_during_a_stall(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    panic = events(lines("n89_vllm21204_llguidance_toktrie_panic.log"), sigs)
    frozen_bar(tl, 40, first_logs=panic)
    v = final(tl.obs, sigs)
    assert (v.state, v.signature) == ("hung", "structured_output_or_tokenizer_freeze")
    assert any("toktrie" in e.detail for e in v.evidence)


@pytest.mark.parametrize(
    "name",
    ["n93_trt3914_iter_log_before_after.log", "s_i_sgl1612_prefill_batch_time_only_prefix.log"],
)
def test_a_line_that_reports_a_step_is_no_log_stall(name: str, sigs: SignatureSet) -> None:
    """TensorRT-LLM's `iter = N ... num_scheduled_requests: 10` and SGLang's old `Prefill batch`
    line carry requests but no throughput figure: each says a step ran, so it is progress, not
    `pending with zero throughput` (which would feed no_progress rules from a healthy log)."""
    from watchdog.commands.replaylog import read_log
    from watchdog.core.judge.logverdict import log_stall

    _, evs = read_log((CORPUS / name).read_bytes(), sigs, PATTERNS)
    assert [e for e in evs if e.kind == "stats"], name
    assert log_stall(evs) is None
    # A vLLM stats line with zero throughput and a request running still is one (vllm #21148).
    _, stalled = read_log(
        (CORPUS / "n90_vllm21148_guided_json_running1_zero.log").read_bytes(), sigs, PATTERNS
    )
    assert log_stall(stalled) is not None


def test_benign_capture_stack_keeps_a_stalled_looking_server_compiling(
    sigs: SignatureSet,
) -> None:
    capture = (
        ("capture_model", "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py"),
    )
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 40, stacks=(stack(*capture),))
    v = final(tl.obs, sigs)
    assert v.state == "compiling" and not v.is_hang


def test_live_log_source_turns_a_dump_in_the_log_into_stack_evidence(
    tmp_path: Path, sigs: SignatureSet
) -> None:
    """A real py-spy dump (sglang #29073) written to a followed log file reaches the stack
    rules through the live log source, with no py-spy run of the watchdog's own."""
    log = tmp_path / "server.log"
    log.write_text("", encoding="utf-8")
    src = LogSource(
        [FileFollower(log, from_start=True)],
        keep=sigs.log_keep_pattern(),
        ops=sigs.ops,
        patterns=PATTERNS,
    )
    tl = Timeline(gpus=(gpu(0.0, 0.0),), server=ServerSample(up=True, health_status=200))
    onset = frozen_bar(tl, 1)
    assert onset
    dump = (CORPUS / "n28_sgl29073_pyspy_allreduce_fusion_rendezvous.log").read_text("utf-8")
    with log.open("a", encoding="utf-8") as fh:
        fh.write(dump)
    for _ in range(40):
        tl.tick(logs=src.poll())
    src.close()
    assert any(e.kind == "stack" for o in tl.obs for e in o.logs)
    v = final(tl.obs, sigs, Thresholds())
    assert (v.state, v.signature) == ("hung", "flashinfer_allreduce_fusion_hang")
    assert any("from the log" in e.detail for e in v.evidence)


def _live(tmp_path: Path, sigs: SignatureSet, name: str, gpu_line: str) -> Verdict:
    """The live path on a real excerpt: the file followed as the server's log (its dump is
    in-log stack evidence) and a `file:` GPU source (sources/gpu/file.py) fed `gpu_line`."""
    log, gpus = tmp_path / "server.log", tmp_path / "gpu.jsonl"
    log.write_text("", encoding="utf-8")
    src = LogSource(
        [FileFollower(log, from_start=True)],
        keep=sigs.log_keep_pattern(),
        ops=sigs.ops,
        patterns=PATTERNS,
    )
    gsrc = GpuFileSource(gpus)
    tl = Timeline(procs=procs(), server=ServerSample(up=True, health_status=200))
    with gpus.open("a", encoding="utf-8") as fh:
        fh.write(gpu_line + "\n")
    frozen_bar(tl, 1)
    with log.open("a", encoding="utf-8") as fh:
        fh.write((CORPUS / name).read_text("utf-8"))
    for _ in range(40):
        with gpus.open("a", encoding="utf-8") as fh:
            fh.write(gpu_line + "\n")
        tl.tick(logs=src.poll(), gpus=gsrc.poll())
    src.close()
    gsrc.close()
    assert all(o.gpus for o in tl.obs[1:]), "the file: GPU source gave no samples"
    return final(tl.obs, sigs, Thresholds())


# A `file:` GPU line (README, GPU sample file): SM busy without memory traffic, idle, or busy
# with memory traffic; the server's pid so the GPU is its own.
SPIN = f'{{"gpu": 0, "sm": 0.99, "dram": 0.0, "pids": [{SERVER_PID}]}}'
IDLE = f'{{"gpu": 0, "sm": 0.0, "dram": 0.0, "pids": [{SERVER_PID}]}}'
MEMBUSY = f'{{"gpu": 0, "sm": 0.95, "dram": 0.6, "pids": [{SERVER_PID}]}}'

WINDOW_DUMP = "n104_sgl11208_pyspy_forward_thread_ncclcommwindowregister.log"


def test_real_window_registration_dump_names_the_deadlock_and_a_served_past_one_does_not(
    sigs: SignatureSet,
) -> None:
    """sglang #11208: the forward thread idle in ncclCommWindowRegister. The same dump
    followed by batches the server runs (real SGLang lines, sglang PR #22166) is no hang."""
    dump = lines(WINDOW_DUMP)
    assert named(dump, sigs) == ["nccl_window_register_deadlock"]
    served = lines("s_i_sgl22166_prefill_decode_comma_format.log")
    assert named(dump + served, sigs) == []
    # Batches before the dump say nothing about it: the dump still names the deadlock.
    assert named(served + dump, sigs) == ["nccl_window_register_deadlock"]


def test_live_watchdog_names_the_window_registration_deadlock_from_the_real_dump(
    tmp_path: Path, sigs: SignatureSet
) -> None:
    v = _live(tmp_path, sigs, WINDOW_DUMP, IDLE)
    assert (v.state, v.signature) == ("hung", "nccl_window_register_deadlock")
    assert any("ncclCommWindowRegister" in e.detail for e in v.evidence)


GRAPH_STALL = "n105_nccl2389_graph_replay_stall_pyspy.log"
# nccl #2389's `nvidia-smi` during the hang: "| 0  NVIDIA H100 80GB HBM3   On | 119W / 700W |
# 1897MiB / 81559MiB | 100%  Default |" (busy at a sixth of the power limit, no DRAM figure).
H100_SPIN = (
    '{"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "sm": 1.0, "dram": null, "power_w": 119, '
    f'"power_limit_w": 700, "pids": [{SERVER_PID}]}}'
)


def test_real_graph_replay_dump_names_nothing_from_the_log_alone(sigs: SignatureSet) -> None:
    """nccl #2389: the main thread in torch's CUDAGraph.replay while every kernel spins; the
    spin (SMs busy, no memory traffic) is GPU evidence no log holds."""
    assert named(lines(GRAPH_STALL), sigs) == []


@pytest.mark.parametrize("gpu_line", [H100_SPIN, SPIN], ids=["thread-figures", "no-dram"])
def test_live_real_graph_replay_dump_with_a_spinning_gpu_is_the_graph_replay_spin(
    tmp_path: Path, sigs: SignatureSet, gpu_line: str
) -> None:
    v = _live(tmp_path, sigs, GRAPH_STALL, gpu_line)
    assert (v.state, v.signature) == ("hung", "cuda_graph_kernel_spin")
    details = " ".join(e.detail for e in v.evidence)
    assert "replay (torch/cuda/graphs.py:139)" in details and "GPU 0" in details


@pytest.mark.parametrize("gpu_line", [IDLE, MEMBUSY], ids=["idle", "membusy"])
def test_live_real_graph_replay_dump_without_a_spin_is_not_the_graph_replay_spin(
    tmp_path: Path, sigs: SignatureSet, gpu_line: str
) -> None:
    v = _live(tmp_path, sigs, GRAPH_STALL, gpu_line)
    assert v.signature not in ("cuda_graph_kernel_spin", "gpu_kernel_spin")


@pytest.mark.parametrize("gpu_line", [SPIN, IDLE, MEMBUSY], ids=["spin", "idle", "membusy"])
def test_live_real_eager_launch_dump_is_never_the_graph_replay_spin(
    tmp_path: Path, sigs: SignatureSet, gpu_line: str
) -> None:
    """vllm #43885's native dump: MainThread in cuLaunchKernel (libcuda) under FlashInfer's
    top_k_mask_logits, an eager launch with no replay frame. With a spin it is the generic
    gpu_kernel_spin; it named cuda_graph_kernel_spin while any libcuda frame matched."""
    v = _live(tmp_path, sigs, "n83_vllm43885_pyspy_native_culaunchkernel_sampling.log", gpu_line)
    assert v.signature != "cuda_graph_kernel_spin"
    if gpu_line == SPIN:
        assert (v.state, v.signature) == ("hung", "gpu_kernel_spin")
    else:
        assert v.signature != "gpu_kernel_spin"


# -- known-bad versions from the same threads, checked by preflight ------------------------


def test_nccl_2289_warns_on_any_gpu_and_the_fix_passes(sigs: SignatureSet) -> None:
    from tests.fakes import inventory
    from watchdog.preflight.checks_versions import check_known_bad

    inv = inventory("12.1")  # GB10 (DGX Spark), as in vllm #52504
    bad = {"nvidia-nccl-cu13": "2.28.9"}
    (result,) = check_known_bad(sigs.known_bad, bad, inv, None)
    assert result.status == "WARN" and "52504" in " ".join(result.details["references"])
    assert any("2.30.4" in f for f in result.fixes)
    (ok,) = check_known_bad(sigs.known_bad, {"nvidia-nccl-cu13": "2.30.4"}, inv, None)
    assert ok.status == "PASS"


def test_preflight_reads_the_packages_known_bad_entries_name(tmp_path: Path) -> None:
    """The real interpreter, with a distribution only a known-bad entry names on its path."""
    import os
    import sys

    from tests.fakes import write_dist
    from watchdog.preflight.runner import PreflightOptions, read_versions

    write_dist(tmp_path / "site", "nvidia-nccl-cu12", "2.21.5")
    opts = PreflightOptions(environ={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    got, err = read_versions(opts, sys.executable, ["nvidia-nccl-cu12"])
    assert err is None and got is not None
    assert got["nvidia-nccl-cu12"] == "2.21.5"


# -- ranks that diverged (core/judge/divergence.py) ---------------------------------------------


def test_divergence_names_the_rank_behind() -> None:
    from watchdog.core.judge.divergence import divergence

    found = divergence(lines("n73_vllm23448_ranks_at_different_seqnum.log"))
    assert found is not None and "rank 3 is behind" in found
    other = divergence(lines("n74_nccl1409_ranks_in_different_collectives.log"))
    assert other is not None and "different collectives at the same step" in other
    assert divergence(lines("n75_llamafactory7396_all_ranks_same_collective.log")) is None
    assert divergence(lines("n50_vllm42354_watchdog_allgather_timeout.log")) is None  # one rank


def test_live_watchdog_names_divergence_from_the_window(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(
        tl, 20, first_logs=events(lines("n73_vllm23448_ranks_at_different_seqnum.log"), sigs)
    )
    v = final(tl.obs, sigs)
    assert v.signature == "rank_divergence"
    assert any("rank 3 is behind" in e.detail for e in v.evidence)
    same = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(same, 20, first_logs=events(lines("n78_pt118369_all_ranks_broadcast_880.log"), sigs))
    assert final(same.obs, sigs).signature == "collective_hang"


# vllm/config/vllm.py VllmConfig.__str__ (the engine's config line) prints the speculative
# config's repr, `speculative_config=SpeculativeConfig(method='mtp', ...)`, or None when off.
def _engine_config(spec: str) -> str:
    return (
        "(EngineCore_DP0 pid=310) INFO 05-15 09:00:00 [core.py:93] Initializing a V1 LLM engine "
        f"(v0.20.1) with config: model='deepseek-ai/DeepSeek-V3.2', speculative_config={spec}, "
        "tokenizer='deepseek-ai/DeepSeek-V3.2', tensor_parallel_size=8"
    )


MTP = "SpeculativeConfig(method='mtp', model='deepseek-ai/DeepSeek-V3.2', num_spec_tokens=1)"


def test_running_requests_with_no_tokens_under_spec_decoding_are_unschedulable(
    sigs: SignatureSet,
) -> None:
    """vllm PR #42722: with MTP a request stays RUNNING and is never scheduled again."""
    stalled = [_stats(2, 0, 0.0)] * 3
    assert named([_engine_config(MTP), *stalled], sigs) == ["spec_decode_request_unschedulable"]
    # Without speculative decoding the same stall has no cause the log can name.
    assert named([_engine_config("None"), *stalled], sigs) == []
    # Speculative decoding that produces tokens is no stall.
    assert named([_engine_config(MTP), _stats(2, 0, 0.0), _stats(2, 0, 57.3)], sigs) == []
    # Nothing running with requests waiting is the admission deadlock, not this.
    assert named([_engine_config(MTP), _stats(0, 4, 0.0)], sigs) == ["scheduler_admission_deadlock"]


def test_live_spec_decoding_stall_is_named_from_the_command_line(sigs: SignatureSet) -> None:
    """Live, the startup line has long left the window: the server's command line says it."""
    for spec, expect in ((True, "spec_decode_request_unschedulable"), (False, None)):
        tl = Timeline(gpus=(gpu(0.0, 0.0),), facts={"speculative_decoding": spec})
        frozen_bar(tl, 40, first_logs=events([_stats(2, 0, 0.0)], sigs))
        v = final(tl.obs, sigs)
        assert v.signature == expect, (spec, v.state, v.signature)


# --- the same causes in the words of other releases and launchers ---------------------------


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        # vllm/v1/executor/multiproc_executor.py as 0.8.x spelled it, and v1/engine/core_client.py.
        (
            [
                "CRITICAL 03-02 10:00:00 [multiproc_executor.py:49] MulitprocExecutor got fatal "
                "signal from worker processes, shutting down. See stack trace above for root cause "
                "issue."
            ],
            "engine_worker_failed",
        ),
        (
            [
                "CRITICAL 03-02 10:00:00 [core_client.py:359] Got fatal signal from worker "
                "processes, shutting down. See stack trace above for root cause issue."
            ],
            "engine_worker_failed",
        ),
        # vLLM 0.8 V1 core.py, and the frames of a worker's logged exception without its header.
        (
            ["ERROR 03-02 10:00:00 [core.py:387] EngineCore hit an exception: Traceback (most"],
            "engine_dead",
        ),
        (
            [
                "(VllmWorker rank=3 pid=9) ERROR 03-02 10:00:00 [multiproc_executor.py:470]   "
                'File "/srv/vllm/v1/worker/gpu_model_runner.py", line 2100, in execute_model',
                "(VllmWorker rank=3 pid=9) ERROR 03-02 10:00:00 [multiproc_executor.py:470]     "
                "return self.model(x)",
            ],
            "engine_worker_failed",
        ),
        (
            [
                "(Worker_TP1 pid=5) ERROR 03-02 10:00:00 [multiproc_executor.py:766] WorkerProc "
                "failed to start."
            ],
            "engine_worker_failed",
        ),
        # torch/csrc/distributed/c10d/socket.cpp throwTimeoutError, logged by C10D_ERROR as is.
        (
            [
                "[E302 10:00:00.123456789 socket.cpp:1023] [c10d] The client socket has timed out "
                "after 900s while trying to connect to (10.0.0.7, 29500)."
            ],
            "collective_network_error",
        ),
        # torch ProcessGroupGloo, with the message cut where a terminal or a paste cut it.
        (["RuntimeError: Gloo connectFullMesh fail"], "collective_network_error"),
        # sglang srt/mem_cache/radix_cache.py available_and_evictable_str, then the watchdog.
        (
            [
                "[2026-03-02 10:00:00 TP0] Available tokens: 250040 (available_size=40 + "
                "evictable_size=250000, unused_evictable_size=0, protected_size=0)",
                "[2026-03-02 10:05:00 TP0] Watchdog timeout (self.watchdog_timeout=300)",
            ],
            "sglang_hicache_eviction_deadlock",
        ),
    ],
)
def test_a_cause_in_another_releases_words_names_it(
    log: list[str], cause: str, sigs: SignatureSet
) -> None:
    assert named(log, sigs)[:1] == [cause]


def test_a_pool_with_room_left_is_no_eviction_deadlock(sigs: SignatureSet) -> None:
    log = [
        "[2026-03-02 10:00:00 TP0] Available tokens: 300000 (available_size=50000 + "
        "evictable_size=250000, unused_evictable_size=0, protected_size=0)",
        "[2026-03-02 10:05:00 TP0] Watchdog timeout (self.watchdog_timeout=300)",
    ]
    assert named(log, sigs)[:1] == ["sglang_scheduler_watchdog_timeout"]
    # c10d's server side says it will retry: that is no failure.
    retry = "[W302 10:00:00.1 socket.cpp:1] [c10d] The server socket has timed out, will retry."
    assert "collective_network_error" not in named([retry], sigs)
