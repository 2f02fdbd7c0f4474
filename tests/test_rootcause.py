# ruff: noqa: E501  (log lines are quoted whole, as the engines print them)
"""Root causes under the verdict (core/judge/rootcause.py), replay and live alike: each reading from
cases written in the engines' real formats (cited), and near misses that must stay quiet."""

from __future__ import annotations

import pytest

from tests.logreadings import live_verdict, replay_read
from watchdog.core.judge.rootcause import Cause


def replay(text: str) -> tuple[tuple[str, ...], str | None, Cause | None]:
    """(signatures named, generic class, root cause) as `replay` reads the log."""
    r = replay_read(text)
    return r.names, r.cls, r.cause


def live(text: str) -> str:
    """The live verdict's state, reason and fix after the lines (a log-only watch)."""
    v = live_verdict(text)
    return f"{v.state}|{v.reason}|{v.fix}"


# 1. The engine's request loop died --------------------------------------------------------

# TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py _event_loop_wrapper: logger.error(
# f"Error in event loop: {e}") then the traceback; the CUDA check's text is cudaUtils.h's.
TRT_LOOP = """\
[01/22/2026-08:52:40] [TRT-LLM] [I] iter = 120, global_rank = 0, rank = 0, currank_total_requests = 0/4, host_step_time = 21.5ms
[01/22/2026-08:52:42] [TRT-LLM] [E] Error in event loop: [TensorRT-LLM][ERROR] CUDA runtime error in cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToHost, stream): an illegal memory access was encountered (/src/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:87)
1       0x7f3c5a2b1c6d void tensorrt_llm::common::check<cudaError>(cudaError, char const*, char const*, int) + 141
2       0x7f3c5a4f0e12 tensorrt_llm::runtime::BufferManager::copy(void const*, tensorrt_llm::runtime::IBuffer&, tensorrt_llm::runtime::MemoryType) const + 98
[01/22/2026-08:52:42] [TRT-LLM] [E] Traceback (most recent call last):
RuntimeError: [TensorRT-LLM][ERROR] CUDA runtime error in cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToHost, stream): an illegal memory access was encountered (/src/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:87)
"""

# vLLM V1: the engine core's OOM (vllm/v1/engine/core.py logs `EngineCore encountered a fatal
# error.` with the traceback), then the API server's vllm/v1/engine/async_llm.py output_handler.
VLLM_OOM = """\
(EngineCore_DP0 pid=211) ERROR 01-04 04:31:09 [core.py:844] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=211) ERROR 01-04 04:31:09 [core.py:844] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
(APIServer pid=42) ERROR 01-04 04:31:09 [async_llm.py:525] AsyncLLM output_handler failed.
(APIServer pid=42) ERROR 01-04 04:31:09 [async_llm.py:525] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_trtllm_event_loop_death_names_the_cuda_error_and_call() -> None:
    names, cls, cause = replay(TRT_LOOP)
    assert names[:1] == ("engine_dead",)  # the executor loop died: engine death, whatever killed it
    assert cause is not None and cause.kind == "cuda"
    assert "executor loop" in cause.summary
    assert "cudaErrorIllegalAddress" in cause.summary and "cudaMemcpyAsync" in cause.summary
    assert "Error in event loop" in cause.line
    assert "root cause: TensorRT-LLM's executor loop" in live(TRT_LOOP)


def test_vllm_engine_core_oom_then_output_handler_is_engine_death_with_the_oom() -> None:
    names, _, cause = replay(VLLM_OOM)
    assert names[0] == "engine_dead"
    assert cause is not None and cause.kind == "cuda"
    assert "engine core" in cause.summary and "CUDA out of memory" in cause.summary
    assert "root cause: vLLM's engine core loop died: CUDA out of memory" in live(VLLM_OOM)


def test_a_dead_loop_without_its_exception_says_the_cause_is_unknown() -> None:
    names, _, cause = replay(
        "(APIServer pid=42) ERROR 01-04 04:31:09 [async_llm.py:525] AsyncLLM output_handler failed.\n"
    )
    assert names == ("engine_dead",) and cause is not None and cause.kind == "engine_loop"
    assert "cause unknown" in cause.summary
    log = "[01/22/2026-08:52:42] [TRT-LLM] [E] Error in event loop: list index out of range\n"
    names, _, cause = replay(log)
    assert names == ("engine_dead",) and cause is not None and cause.kind == "engine_loop"
    assert cause.summary.endswith("died: list index out of range")


# 2. Fatal CUDA errors in every engine's format ----------------------------------------------


@pytest.mark.parametrize(
    ("line", "name", "call"),
    [
        # PyTorch aten/src/ATen/cuda/CUDABlas.cpp TORCH_CUDABLAS_CHECK
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`",
            "CUBLAS_STATUS_EXECUTION_FAILED",
            "cublasGemmEx",
        ),
        # TensorRT-LLM cudaUtils.h check() on a cuBLAS status
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in cublasLtMatmul(getCublasLtHandle(), mOperationDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, C, Cdesc, algo, workspace, workspaceSize, stream): CUBLAS_STATUS_EXECUTION_FAILED (/src/tensorrt_llm/cpp/tensorrt_llm/common/cublasMMWrapper.cpp:225)",
            "CUBLAS_STATUS_EXECUTION_FAILED",
            "cublasLtMatmul",
        ),
        # PyTorch c10/cuda/CUDAException.cpp, without the CUDA_LAUNCH_BLOCKING advice
        (
            "torch.AcceleratorError: CUDA error: unspecified launch failure",
            "cudaErrorLaunchFailure",
            None,
        ),
        # the kernel driver (dmesg), NVIDIA's Xid catalogue
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=2291, name=python3, GPU has fallen off the bus.",
            "Xid 79",
            None,
        ),
    ],
)
def test_cuda_errors_name_the_error_and_the_call(line: str, name: str, call: str | None) -> None:
    _, _, cause = replay(line + "\n")
    assert cause is not None and cause.kind == "cuda" and name in cause.summary
    if call:
        assert f"by {call}" in cause.summary
    else:
        assert "returned by" not in cause.summary


def test_a_teardown_error_is_not_the_cause() -> None:
    log = (
        "RuntimeError: CUDA error: misaligned address\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Exception ignored in: <function CUDAGraphRunner.__del__ at 0x7f>\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    _, cls, cause = replay(log)
    assert cls == "crashed" and cause is not None
    assert "cudaErrorMisalignedAddress" in cause.summary and "IllegalAddress" not in cause.summary
    assert "CUDA_LAUNCH_BLOCKING=1 names it" in cause.summary


def test_xid_45_alone_is_a_consequence_not_the_cause() -> None:
    _, cls, cause = replay("NVRM: Xid (PCI:0000:3b:00): 45, pid=2291, Ch 00000010\n")
    assert cls == "crashed" and cause is None


def test_a_handled_cuda_oom_the_engine_recovers_from_stays_quiet() -> None:
    log = (
        "ERROR 05-01 10:00:00 [scheduler.py:12] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
        "INFO 05-01 10:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 88.1 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 31.0%, Prefix cache hit rate: 0.0%\n"
    )
    assert replay(log) == ((), None, None)


# 3. A broken JIT toolchain -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "what", "pkg"),
    [
        # gcc, and clang, on a missing CUDA header
        (
            "/root/.cache/flashinfer/jit/batch_decode.cu:17:10: fatal error: cuda_runtime.h: No such file or directory",
            "header cuda_runtime.h",
            "cuda-cudart-dev",
        ),
        (
            "csrc/ops.cu:3:10: fatal error: 'cublasLt.h' file not found",
            "header cublasLt.h",
            "libcublas-dev",
        ),
        # GNU ld
        ("/usr/bin/ld: cannot find -lcuda: No such file or directory", "libcuda", "stubs"),
        # the shell, on a CUDA binary utility
        ("sh: 1: ptxas: not found", "tool ptxas", "cuda-nvcc"),
        (
            "FileNotFoundError: [Errno 2] No such file or directory: '/usr/local/cuda/bin/cuobjdump'",
            "tool cuobjdump",
            "cuda-cuobjdump",
        ),
    ],
)
def test_a_broken_jit_toolchain_names_what_is_missing_and_its_package(
    line: str, what: str, pkg: str
) -> None:
    log = line + "\nninja: build stopped: subcommand failed.\n"
    names, _, cause = replay(log)
    assert names and names[0] == "jit_toolchain_missing"
    assert cause is not None and cause.kind == "toolchain"
    assert what in cause.summary and pkg in cause.summary


def test_ninja_stopped_alone_is_the_toolchain_with_the_cause_unknown() -> None:
    names, _, cause = replay("ninja: build stopped: subcommand failed.\n")
    assert names == ("jit_toolchain_missing",) and cause is None


def test_a_compiler_warning_stays_quiet() -> None:
    log = (
        '/root/.cache/flashinfer/jit/norm.cu(42): warning #177-D: variable "x" was declared but never referenced\n'
        "/usr/include/c++/11/bits/stl_vector.h:1120: warning: ignoring return value [-Wunused-result]\n"
    )
    assert replay(log) == ((), None, None)


# 4. Communicator set-up --------------------------------------------------------------------

# torch c10d NCCLComm::create (NCCLUtils.hpp) during init, then SGLang's scheduler crash.
NCCL_INIT = """\
[2026-03-01 10:00:01 TP0] Init torch distributed begin.
[2026-03-01 10:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5
ncclInternalError: Internal check failed.
[2026-03-01 10:00:09] Received sigquit from a child process. It usually means the child failed.
"""


def test_nccl_init_error_is_collective_setup_not_the_scheduler_crash() -> None:
    names, _, cause = replay(NCCL_INIT)
    assert names[0] == "collective_setup_failed"
    assert "sglang_scheduler_crashed" in names
    assert cause is not None and cause.kind == "collective_setup" and cause.stage == "init"
    assert "internal error" in cause.summary
    # Live names the scheduler's death (its signature ranking is classify's), with the same cause.
    said = live(NCCL_INIT)
    assert "scheduler loop died: NCCL internal error" in said and "(stage: init)" in said


@pytest.mark.parametrize(
    ("line", "stage"),
    [
        # torch/csrc/distributed/c10d/TCPStore.cpp: a rendezvous that never completes
        (
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "bootstrap",
        ),
        # NVSHMEM's error macro on its bootstrap socket
        (
            "/opt/nvshmem/src/host/init/init.cu:412: non-zero status: 7 bootstrap_init failed: Connection timed out",
            "bootstrap",
        ),
    ],
)
def test_a_bootstrap_or_rendezvous_timeout_names_the_stage(line: str, stage: str) -> None:
    names, _, cause = replay(line + "\n")
    assert names[0] == "collective_setup_failed"
    assert cause is not None and cause.stage == stage


def test_an_nccl_warning_during_a_successful_init_stays_quiet() -> None:
    log = (
        "node1:2291:2291 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0\n"
        "node1:2291:2301 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_open_device failed\n"
        "node1:2291:2301 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
        "node1:2291:2301 [0] NCCL INFO comm 0x55d2 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x9f - Init COMPLETE\n"
    )
    assert replay(log) == ((), None, None)
