"""Causes read from the engine's own words and from live evidence: a build that does not match
the machine (SIGILL, no kernel image), a detokenizer that stopped answering, a KV-transfer
warning flood, and the 2026 SM103 / NCCL 2.31.2 GPU hangs. Each from a case written here in
the upstream format cited at the rule, with a near miss that must stay quiet."""

from __future__ import annotations

import pytest

from tests.obsbuilder import Timeline, final, frozen_bar, procs, spin, stack
from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def named(text: str, sigs: SignatureSet) -> list[str]:
    _, evs = read_log(text.encode(), sigs, PATTERNS)
    return [m.signature.id for m in name_signatures(evs, sigs)]


def cls(text: str, sigs: SignatureSet) -> tuple[str | None, str]:
    data = text.encode()
    _, evs = read_log(data, sigs, PATTERNS)
    v = log_classes(evs, data, sigs)
    return (v.primary.cls.id, v.primary.label) if v is not None else (None, "")


STATS = (
    "(APIServer pid=1) INFO 03-02 10:0{m}:00 [loggers.py:257] Engine 000: Avg prompt throughput: "
    "0.0 tokens/s, Avg generation throughput: 41.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs\n"
)
# vllm 0.32.0 vllm/v1/executor/multiproc_executor.py: "Worker proc %s died unexpectedly (exit
# code: %s), shutting down executor." -- exit code -4 is SIGILL.
WORKER_SIGILL = (
    "(EngineCore_DP0 pid=80) ERROR 03-02 10:05:00 [multiproc_executor.py:316] Worker proc "
    "VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor.\n"
)


def test_a_worker_killed_by_sigill_is_the_build_not_the_worker(sigs: SignatureSet) -> None:
    got = named(STATS.format(m=1) + WORKER_SIGILL, sigs)
    assert got[0] == "build_machine_mismatch" and "engine_worker_failed" in got
    other = WORKER_SIGILL.replace("exit code: -4", "exit code: -9")
    assert named(other, sigs)[0] == "engine_worker_failed"


@pytest.mark.parametrize(
    "line",
    [
        "Fatal Python error: Illegal instruction",  # cpython Modules/faulthandler.c
        "Illegal instruction (core dumped)",  # the shell's strsignal(SIGILL)
        "run.sh: line 3:  4242 Illegal instruction     (core dumped) vllm serve /models/tiny",
    ],
)
def test_sigill_lines_name_the_build(sigs: SignatureSet, line: str) -> None:
    assert named(STATS.format(m=1) + line + "\n", sigs)[0] == "build_machine_mismatch"


def test_a_helper_sigill_the_server_survives_stays_quiet(sigs: SignatureSet) -> None:
    helper = "/bin/sh: line 1:  4242 Illegal instruction     (core dumped) lscpu --json\n"
    text = STATS.format(m=1) + helper + STATS.format(m=2)
    assert "build_machine_mismatch" not in named(text, sigs)
    assert cls(text, sigs)[0] is None


def test_a_gpu_illegal_instruction_is_no_build_mismatch(sigs: SignatureSet) -> None:
    text = "RuntimeError: CUDA error: an illegal instruction was encountered\n"
    assert "build_machine_mismatch" not in named(text, sigs)


def test_no_kernel_image_is_a_crash_that_names_the_build(sigs: SignatureSet) -> None:
    text = "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    cid, label = cls(text, sigs)
    assert cid == "crashed" and "build does not match the machine" in label
    assert "TORCH_CUDA_ARCH_LIST" in label


# sglang srt/entrypoints/http_server.py health_generate, as sgl-project/sglang#40809 logged it.
HEALTH_FAIL = (
    "[2026-09-22 15:0{m}:54] Health check failed. Server couldn't get a response from "
    "detokenizer for last 20 seconds. tic start time: 14:45:24. last_heartbeat time: 14:45:24\n"
)
HEALTH_OK = '[2026-09-22 15:0{m}:54] INFO:     127.0.0.1:58934 - "GET /health HTTP/1.1" 200 OK\n'


def test_sglangs_health_failure_line_names_no_detokenizer_cause(sigs: SignatureSet) -> None:
    """SGLang prints this line whenever a health generation gets no output, whatever holds the
    scheduler (a kernel that spins, a collective): it names no cause of its own, so it is never
    read as a detokenizer stall (a class that did named every SGLang hang that way)."""
    text = "".join(HEALTH_OK.format(m=m) + HEALTH_FAIL.format(m=m) for m in range(3))
    assert "detokenizer" not in cls(text, sigs)[1]


# vllm 0.32.0 distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py.
NIXL_WARN = (
    "(EngineCore_DP0 pid=80) WARNING 03-02 10:{s:02d}:00 [base_worker.py:3033] Releasing expired "
    "KV blocks for request cmpl-{s} which were retrieved by 0 remote worker(s) before lease "
    "expired.\n"
)


def test_a_kv_transfer_warning_flood_with_no_progress(sigs: SignatureSet) -> None:
    text = STATS.format(m=0) + "".join(NIXL_WARN.format(s=s) for s in range(10, 22))
    assert cls(text, sigs)[0] == "kv_transfer_flooding"
    moving = "".join(NIXL_WARN.format(s=s) for s in range(10, 22)) + STATS.format(m=9)
    assert cls(moving, sigs)[0] is None


# --- live: SM103 kernels and NCCL 2.31.2 (GPU evidence no log holds) -------------------------

RAGGED = ("BatchPrefillWithRaggedKVCacheKernel", "libflashinfer.so")
SYNC = ("synchronize", "/usr/lib/python3.12/site-packages/torch/cuda/streams.py")


def test_sm103_ragged_prefill_spin_names_the_attention_kernel(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(spin("10.3"),), procs=procs())
    frozen_bar(tl, 60, stacks=(stack(RAGGED, SYNC),))
    assert final(tl.obs, sigs).signature == "sm103_attention_kernel_spin"
    hopper = Timeline(gpus=(spin("9.0"),), procs=procs())
    frozen_bar(hopper, 60, stacks=(stack(RAGGED, SYNC),))
    assert final(hopper.obs, sigs).signature != "sm103_attention_kernel_spin"


def test_sm103_2cta_moe_tactic_spin(sigs: SignatureSet) -> None:
    moe = (
        "trtllm_fp4_block_scale_moe",
        "/usr/lib/python3.12/site-packages/flashinfer/fused_moe/core.py",
    )
    tl = Timeline(gpus=(spin("10.3"),), procs=procs())
    frozen_bar(tl, 60, stacks=(stack(moe, SYNC),))
    assert final(tl.obs, sigs).signature == "trtllm_gen_moe_2cta_deadlock"


def test_moe_autotune_that_never_ends_on_sm103(sigs: SignatureSet) -> None:
    tune = ("choose_one", "/usr/lib/python3.12/site-packages/flashinfer/autotuner.py")
    tl = Timeline(gpus=(spin("10.3"),), procs=procs())
    frozen_bar(tl, 60, stacks=(stack(tune),))
    assert final(tl.obs, sigs).signature == "flashinfer_moe_autotune_unbounded"


def test_nccl_2312_spin_in_a_collective_names_the_version(sigs: SignatureSet) -> None:
    ag = ("all_gather_into_tensor", "/usr/lib/python3.12/site-packages/torch/distributed/c10d.py")
    tl = Timeline(gpus=(spin("9.0"),), procs=procs(), facts={"nvidia-nccl-cu12": "2.31.2"})
    frozen_bar(tl, 60, stacks=(stack(ag),))
    assert final(tl.obs, sigs).signature == "nccl_netreg_rendezvous_spin"
    older = Timeline(gpus=(spin("9.0"),), procs=procs(), facts={"nvidia-nccl-cu12": "2.30.4"})
    frozen_bar(older, 60, stacks=(stack(ag),))
    assert final(older.obs, sigs).signature != "nccl_netreg_rendezvous_spin"


# DeepEP + NVSHMEM 3.7.2 (NVIDIA-NeMo/RL#4027) and the MNNVL workspace wait (vllm#51986) are
# named by deepep_nvshmem_timeout and flashinfer_allreduce_fusion_hang already.
def test_first_internode_deepep_dispatch_timeout(sigs: SignatureSet) -> None:
    line = "RuntimeError: DeepEP error: timeout (dispatch CPU)\n"
    assert named(line, sigs)[0] == "deepep_nvshmem_timeout"
