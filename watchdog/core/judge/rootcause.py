"""The root cause a log names under its verdict: which CUDA error and call, which missing
header, library or tool, which communicator set-up stage, which engine loop died of what.

A signature or a generic class says *what* failed (crashed, engine death, a JIT build, a
collective); this module reads the same lines once more for *why*, in six general readings:

- `cuda`: a fatal CUDA error in any engine's format, with its name and the call that returned it;
- `toolchain`: a JIT build that failed on a missing header, library or tool, with the package
  that provides it;
- `collective_setup`: a communicator that never came up (NCCL init, NVSHMEM bootstrap or its
  transport's connect, a rendezvous), with the stage;
- `transport`: the transport under a collective or a KV transfer that failed (NCCL's IB plugin,
  RDMA verbs, UCX, NIXL, NVSHMEM's IB transports: core/judge/transport.py);
- `engine_loop`: an engine's request loop that died, with the first exception in it;
- `signal`: a fatal signal the server's own handler reported, with where its frames fault
  (core/judge/fatalsignal.py).

The first cause in log order wins: the error that killed the loop comes before the errors its
teardown logs (an illegal address freeing memory at exit is a decoy). Pure: lines in, a Cause out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.core.judge.fatalsignal import SIGNAL_FIX, signal_reading
from watchdog.core.judge.generic import after_progress
from watchdog.core.judge.nccltrail import nccl_trail
from watchdog.core.judge.transport import transport_reading_at
from watchdog.core.model import LogEvent


@dataclass(frozen=True)
class Cause:
    """A root cause read from the log: what it is, its fix, and the line that says it."""

    kind: str  # cuda | toolchain | collective_setup | transport | engine_loop | signal
    summary: str
    fix: str
    line: str
    stage: str = ""  # collective_setup: bootstrap | init | first collective

    def text(self) -> str:
        return self.summary + (f" (stage: {self.stage})" if self.stage else "")


# ---- 1. CUDA errors -------------------------------------------------------------------------

# cudaGetErrorString texts (CUDA runtime API, cudaError_t) and the enum name each belongs to.
_CUDA_NAMES = {
    "an illegal memory access was encountered": "cudaErrorIllegalAddress",
    "misaligned address": "cudaErrorMisalignedAddress",
    "an illegal instruction was encountered": "cudaErrorIllegalInstruction",
    "unspecified launch failure": "cudaErrorLaunchFailure",
    "device-side assert triggered": "cudaErrorAssert",
    "out of memory": "cudaErrorMemoryAllocation",
    "the launch timed out and was terminated": "cudaErrorLaunchTimeout",
    "uncorrectable ECC error encountered": "cudaErrorECCUncorrectable",
    "operation not permitted when stream is capturing": "cudaErrorStreamCaptureUnsupported",
    "no kernel image is available for execution on the device": "cudaErrorNoKernelImageForDevice",
    "too many resources requested for launch": "cudaErrorLaunchOutOfResources",
    "invalid argument": "cudaErrorInvalidValue",
    "initialization error": "cudaErrorInitializationError",
}
# TensorRT-LLM cpp/include/tensorrt_llm/common/cudaUtils.h check(): TLLM_THROW("[TensorRT-LLM]
# [ERROR] CUDA runtime error in %s: %s", func, _cudaGetErrorEnum(result)) followed by the throw
# site ` (/src/tensorrt_llm/cpp/...cpp:123)` and its C++ frame list; cuBLAS statuses go through
# the same check (`_cudaGetErrorEnum(cublasStatus_t)` returns `CUBLAS_STATUS_*`).
_TRT_CUDA = re.compile(
    r"CUDA runtime error in (?P<call>.+?): (?P<err>[^:(]+?)\s*(?:\(/\S+:\d+\)|$)"
)
# PyTorch aten/src/ATen/cuda/CUDABlas.cpp TORCH_CUDABLAS_CHECK: "CUDA error: CUBLAS_STATUS_X
# when calling `cublasGemmEx( ...)`".
_CUBLAS_CALL = re.compile(r"(?P<err>CUBLAS_STATUS_[A-Z_]+) when calling `(?P<call>[^`(]+)")
# PyTorch c10/cuda/CUDAException.cpp c10_cuda_check_implementation: "CUDA error: <string>" (then
# "CUDA kernel errors might be asynchronously reported ..."); C10_CUDA_DRIVER_CHECK "CUDA driver
# error: <string>"; torch.cuda.OutOfMemoryError "CUDA out of memory. Tried to allocate ...".
_TORCH_CUDA = re.compile(r"CUDA (?:driver )?error: (?P<err>[^\n]+?)\s*$")
_TORCH_OOM = re.compile(r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]i?B)")
# The kernel driver's Xid line (dmesg): `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., GPU
# has fallen off the bus.` (NVIDIA XID catalogue, docs.nvidia.com/deploy/xid-errors).
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)")
_XIDS = {
    "13": "graphics engine exception (a kernel fault)",
    "31": "GPU memory page fault (a kernel touched an invalid address)",
    "43": "GPU stopped processing (the application faulted)",
    "48": "double-bit ECC error",
    "63": "ECC page retirement or row remapping",
    "64": "ECC page retirement or row remapping failure",
    "74": "NVLink error",
    "79": "GPU has fallen off the bus",
    "92": "high single-bit ECC error rate",
    "94": "contained ECC error",
    "95": "uncontained ECC error",
    "119": "GSP RPC timeout",
    "120": "GSP error",
}
# Xid 45 is the driver's preemptive cleanup of a channel whose process died: a consequence.
_XID_CONSEQUENCE = frozenset({"45"})
# An error logged while the process tears down, not the one that stopped it (CPython's
# "Exception ignored in: <function ... __del__>", destructors, process-group teardown).
_TEARDOWN = re.compile(
    r"Exception ignored in|__del__|during (?:cleanup|shutdown|teardown)|destroy_process_group"
    r"|at exit|atexit"
)

_CUDA_FIX = (
    "A fatal CUDA error poisons the CUDA context: the process must restart. Restart the "
    "server; if it recurs, rerun once with CUDA_LAUNCH_BLOCKING=1 to find the kernel that "
    "faults, check `nvidia-smi -q` and dmesg for Xid events, and try the engine's eager mode "
    "(no CUDA graphs) to tell a kernel bug from a graph-capture one."
)
_OOM_FIX = (
    "The GPU ran out of memory and the engine did not recover. Restart with a lower memory "
    "share or batch (vLLM --gpu-memory-utilization / --max-num-seqs, SGLang "
    "--mem-fraction-static, TensorRT-LLM kv_cache_free_gpu_memory_fraction)."
)
_XID_FIX = (
    "The GPU driver reported a hardware or kernel fault. Drain the node, read `nvidia-smi -q` "
    "(ECC, remapped rows) and dmesg; reset the GPU when idle, and replace it if the Xid recurs."
)


def _cuda_name(err: str) -> str:
    err = err.strip().rstrip(".")
    if err.startswith(("cudaError", "CUDA_ERROR_", "CUBLAS_STATUS_")):
        return err.split()[0]
    name = _CUDA_NAMES.get(err)
    return f"{name} ({err})" if name else err


def cuda_cause(line: str) -> Cause | None:
    """The CUDA error one line reports, with the call that returned it when the line names it."""
    if _TEARDOWN.search(line):
        return None
    if m := _TRT_CUDA.search(line):
        err = m["err"]
        fix = _OOM_FIX if "out of memory" in err else _CUDA_FIX
        call = m["call"].strip().lstrip(":").split("(", 1)[0]
        return Cause("cuda", f"CUDA error {_cuda_name(err)} returned by {call}", fix, line)
    if m := _CUBLAS_CALL.search(line):
        return Cause(
            "cuda", f"cuBLAS error {m['err']} returned by {m['call'].strip()}", _CUDA_FIX, line
        )
    if m := _TORCH_OOM.search(line):
        return Cause("cuda", f"CUDA out of memory (tried to allocate {m['size']})", _OOM_FIX, line)
    if m := _TORCH_CUDA.search(line):
        err = m["err"]
        if err.startswith("out of memory"):
            return Cause(
                "cuda", "CUDA error cudaErrorMemoryAllocation (out of memory)", _OOM_FIX, line
            )
        # PyTorch reports the error at the next synchronising call, not at the kernel: the call
        # is unknown unless CUDA_LAUNCH_BLOCKING=1 was set.
        return Cause(
            "cuda",
            f"CUDA error {_cuda_name(err)} (the call is not in the log: CUDA reports kernel "
            "errors asynchronously; CUDA_LAUNCH_BLOCKING=1 names it)",
            _CUDA_FIX,
            line,
        )
    if (m := _XID.search(line)) and m["xid"] not in _XID_CONSEQUENCE:
        what = _XIDS.get(m["xid"], "see NVIDIA's Xid catalogue")
        return Cause("cuda", f"GPU Xid {m['xid']} on {m['pci']}: {what}", _XID_FIX, line)
    return None


# ---- 2. JIT toolchain ---------------------------------------------------------------------

# gcc `fatal error: cuda_runtime.h: No such file or directory`, clang `fatal error:
# 'cuda_runtime.h' file not found`, nvcc's EDG front end `catastrophic error: cannot open source
# file "cuda_fp8.h"`.
_HEADER = re.compile(
    r"(?:fatal error: '?(?P<h1>[\w./+-]+\.(?:h|hpp|cuh))'?:? "
    r"(?:No such file or directory|file not found)"
    r"|catastrophic error: cannot open source file \"(?P<h2>[\w./+-]+)\")"
)
# GNU ld / lld: `/usr/bin/ld: cannot find -lcuda` (`ld.lld: error: unable to find library -lcuda`).
_LIB = re.compile(r"(?:cannot find|unable to find library) -l(?P<lib>[\w+.-]+)")
# A CUDA binary utility or build tool the build ran and the shell or Python could not find:
# `sh: 1: ptxas: not found`, `/bin/sh: nvcc: command not found`, Python's `FileNotFoundError:
# [Errno 2] No such file or directory: '/usr/local/cuda/bin/cuobjdump'`.
_TOOLS = (
    "nvcc|ptxas|fatbinary|nvlink|cuobjdump|nvdisasm|cicc|ninja|c\\+\\+|g\\+\\+|gcc|cc|cudafe\\+\\+"
)
_TOOL = re.compile(
    rf"(?:(?<![\w/.+-])(?P<t1>{_TOOLS}): (?:command )?not found"
    rf"|No such file or directory: '(?:[^']*/)?(?P<t2>{_TOOLS})')"
)
_NINJA = re.compile(r"ninja: build stopped: subcommand failed|Ninja build failed")

# What provides each file (Ubuntu packages of NVIDIA's CUDA apt repository, -X-Y = the CUDA
# version; the pip wheel NVIDIA publishes for the same library).
_HEADER_PKG = (
    (
        r"^cuda(?:_runtime|_runtime_api|_fp16|_bf16|_fp8|_fp4)?\.h$|^cuda\.h$",
        "cuda-cudart-dev-X-Y (pip: nvidia-cuda-runtime-cu12)",
    ),
    (r"^cublas", "libcublas-dev-X-Y (pip: nvidia-cublas-cu12)"),
    (r"^cusparse", "libcusparse-dev-X-Y"),
    (r"^curand", "libcurand-dev-X-Y"),
    (r"^cufft", "libcufft-dev-X-Y"),
    (r"^nvrtc", "cuda-nvrtc-dev-X-Y (pip: nvidia-cuda-nvrtc-cu12)"),
    (r"^nccl", "libnccl-dev (pip: nvidia-nccl-cu12)"),
    (r"^cudnn", "libcudnn9-dev-cuda-12 (pip: nvidia-cudnn-cu12)"),
    (r"^(?:cub|thrust|cuda/std|cuda/)", "cuda-cccl-X-Y"),
    (r"^Python\.h$", "python3-dev (the interpreter's headers)"),
)
_LIB_PKG = {
    "cuda": "the NVIDIA driver's libcuda.so (or the stub: "
    "LIBRARY_PATH=$CUDA_HOME/lib64/stubs, cuda-driver-dev-X-Y)",
    "cudart": "cuda-cudart-dev-X-Y",
    "cublas": "libcublas-dev-X-Y",
    "cublasLt": "libcublas-dev-X-Y",
    "nvrtc": "cuda-nvrtc-dev-X-Y",
    "nccl": "libnccl-dev",
    "curand": "libcurand-dev-X-Y",
    "cusparse": "libcusparse-dev-X-Y",
}
_TOOL_PKG = {
    "nvcc": "cuda-nvcc-X-Y",
    "ptxas": "cuda-nvcc-X-Y",
    "fatbinary": "cuda-nvcc-X-Y",
    "nvlink": "cuda-nvcc-X-Y",
    "cicc": "cuda-nvcc-X-Y",
    "cudafe++": "cuda-nvcc-X-Y",
    "cuobjdump": "cuda-cuobjdump-X-Y",
    "nvdisasm": "cuda-nvdisasm-X-Y",
    "ninja": "ninja-build (pip: ninja)",
    "gcc": "build-essential",
    "cc": "build-essential",
    "c++": "build-essential",
    "g++": "build-essential",
}
_TOOLCHAIN_FIX = (
    "A just-in-time kernel build failed on the host's toolchain; a restart fails the same way. "
    "Install {what} in the image (or point CUDA_HOME at a full CUDA toolkit), or install the "
    "prebuilt kernels (flashinfer-cubin and flashinfer-jit-cache for FlashInfer), then run "
    "`hang-watchdog preflight` before the next start."
)


def _header_pkg(h: str) -> str:
    base = h.rsplit("/", 1)[-1] if not h.startswith(("cuda/", "cub/", "thrust/")) else h
    return next((p for pat, p in _HEADER_PKG if re.search(pat, base)), "the CUDA toolkit's headers")


def toolchain_cause(line: str) -> Cause | None:
    """The missing header, library or tool a JIT build line reports, with its package."""
    if m := _HEADER.search(line):
        h = m["h1"] or m["h2"]
        pkg = _header_pkg(h)
        return Cause(
            "toolchain",
            f"JIT build: header {h} not found (provided by {pkg})",
            _TOOLCHAIN_FIX.format(what=pkg),
            line,
        )
    if m := _LIB.search(line):
        lib = m["lib"]
        pkg = _LIB_PKG.get(lib, f"the package that ships lib{lib}.so")
        return Cause(
            "toolchain",
            f"JIT build: the linker cannot find lib{lib} (provided by {pkg})",
            _TOOLCHAIN_FIX.format(what=pkg),
            line,
        )
    if m := _TOOL.search(line):
        t = m["t1"] or m["t2"]
        pkg = _TOOL_PKG.get(t, "the CUDA toolkit")
        return Cause(
            "toolchain",
            f"JIT build: the tool {t} is not installed (provided by {pkg})",
            _TOOLCHAIN_FIX.format(what=pkg),
            line,
        )
    return None


# ---- 3. Communicator set-up -----------------------------------------------------------------

# torch c10d NCCLUtils: "NCCL error in: <file>:<line>, internal error - please report this issue
# to the NCCL developers, NCCL version X" / "unhandled system error (run with NCCL_DEBUG=INFO for
# details)"; NCCL's own "ncclInternalError"/"ncclSystemError" names and `NCCL WARN` lines.
# vLLM vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK: "NCCL error: <string>".
# NCCL's CUDACHECK (src/include/checks.h): `WARN("Cuda failure '%s'", cudaGetErrorString(err))`
# and always returns ncclUnhandledCudaError: the WARN is the error, not a warning NCCL moves past.
_NCCL_ERR = re.compile(
    r"NCCL error in: \S+, (?P<what>[^,]+?)(?:,| \(|$)|NCCL error: (?P<what2>[^,(]+)"
    r"|(?P<name>nccl(?:Internal|System|Unhandled\w*|InvalidUsage|Remote)Error)"
    r"|NCCL WARN (?P<what3>Cuda failure '[^']+')"
)
# Where in the set-up: NCCL's init.cc / ncclCommInitRank, torch's getNcclComm / comm creation,
# init_process_group; NCCL's bootstrap.cc and NVSHMEM's bootstrap plugins; c10d's TCPStore and
# torch elastic's rendezvous (torch/distributed/elastic/rendezvous).
_STAGE_BOOT = re.compile(
    r"[Bb]ootstrap|rendezvous|Rendezvous|TCPStore|DistStoreError|clients joined"
    r"|retrieving ncclUniqueId|waitForInput"
)
_STAGE_INIT = re.compile(
    r"ncclCommInit|CommInitRank|init\.cc|NCCLUtils\.[ch]pp|getNcclComm|init_process_group|initialize_model_parallel"
    r"|init_distributed_environment|comm(?:unicator)? init|Init START|nvshmemi?_init|nvshmem_init"
    r"|/init/init\.cu"
    # A process that had not finished starting: vLLM's worker and engine start-up (v1
    # multiproc_executor.py `WorkerProc failed to start.`, core.py `EngineCore failed to start.`,
    # utils.py `Engine core initialization failed`, a constructor's or init_device's frame).
    r"|failed to start|initialization failed|, in __init__\s*$|, in init_device\s*$"
    r"|, in from_engine_args\s*$"
    # NCCL's proxy answering a connection's set-up messages (src/proxy.cc proxyProgressAsync:
    # `Received and initiated operation=Init|Setup|Connect res=0`): a transport being set up.
    r"|operation=(?:Init|Setup|Connect) res="
    # Ray (python/ray/exceptions.py ActorDiedError): an actor whose constructor raised, `The
    # actor died because of an error raised in its creation task, ray::NAME.__init__()`.
    r"|error raised in its creation task"
)
_INIT_DONE = re.compile(r"Init COMPLETE|init COMPLETE")
_INIT_MARK = re.compile(r"Init START|Init COMPLETE|init COMPLETE")
_NEAR = 20  # lines before an error read for the set-up it belongs to
# NVSHMEM host/bootstrap: `bootstrap ... timed out` / `nvshmemi_bootstrap... failed`; torch's
# rendezvous: `DistStoreError: Timed out after N seconds waiting for clients. 1/2 clients joined.`
# (torch/csrc/distributed/c10d/TCPStore.cpp) and elastic `RendezvousTimeoutError`.
_SETUP = re.compile(
    r"nvshmem\S*:\d+: non-zero status: \d+:? .*(?:[Bb]ootstrap|Connection timed out)"
    r"|(?i:nvshmem)\S*.*[Bb]ootstrap.*(?:timed? ?out|failed|error)"
    r"|[Bb]ootstrap.*(?i:nvshmem).*(?:timed? ?out|failed|error)"
    r"|waiting for clients\. \d+/\d+ clients joined|RendezvousTimeoutError|RendezvousClosedError"
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp broadcastUniqueNCCLID: the rank could not
    # fetch the communicator's ncclUniqueId from the store (rank 0 never published it).
    r"|is setting up NCCL communicator and retrieving ncclUniqueId from"
)
# torch/csrc/distributed/c10d/socket.cpp SocketImpl::waitForInput (C10D_WARNING): a store
# client's wait for the store's answer timed out, `waitForInput: socket SocketImpl(...) timed out
# after Nms`. At start-up that is a rank the rendezvous waits for that never arrived; a store
# serves later waits too (a KV pipe's keys, a weight-sync group), so it is set-up only with a
# start-up beside it.
_STORE_WAIT = re.compile(r"waitForInput: socket .* timed out after \d+ms")
# NVIDIA/nvshmem (3.x) src/host/transport/transport.cpp nvshmemi_setup_connections, called from
# nvshmemi_common_init (src/host/init/init.cu `nvshmem setup connections failed`) only: a
# transport's connect_endpoints failing (`connect EPS failed`) is set-up, never a runtime error.
# Under it the IB transports' own steps: ibrc.cpp ep_create / ep_connect (`ibv_modify_qp failed`,
# `ep_connect failed`), transport_ib_common.cpp (`transport create connect failed`), ibgda.cpp
# (`create DCT share err.`), each through NVSHMEMI_NZ_ERROR_JMP (`file:line: non-zero status: N`).
_NVSHMEM_CONNECT = re.compile(
    r"(?P<file>[\w.]+):\d+: non-zero status: (?P<st>-?\d+):? (?P<what>connect EPS failed"
    r"|ep_connect failed|ibv_modify_qp failed|transport create connect failed"
    r"|nvshmem setup connections failed|create DCT share err)"
    # The message on a line of its own, under its `file:N: non-zero status: N` line (the macro
    # prints both; a console or a poster may break them apart).
    r"|^\s*(?P<bare>connect EPS failed|nvshmem setup connections failed)\s*$"
)
_SETUP_FIX = (
    "The communicator between the ranks never came up, so no collective can run. Check that "
    "every rank started and reaches the others (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / "
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME on multi-homed hosts, firewalls, the rendezvous "
    "address), rerun with NCCL_DEBUG=INFO (and NVSHMEM_DEBUG=INFO) to see the step that "
    "fails, then restart every rank together."
)


def setup_stage(lines: Sequence[str], i: int) -> str:
    """The set-up stage line `i` failed in, read from it and the kept lines before it."""
    before = lines[max(0, i - _NEAR) : i + 1]
    if any(_INIT_DONE.search(x) for x in before):
        return "first collective"
    # The error's own message may run on below it, and so may the traceback it ends.
    near = lines[max(0, i - 20) : i + 30]
    if any(_STAGE_BOOT.search(x) for x in near):
        return "bootstrap"
    if any(_STAGE_INIT.search(x) for x in near):
        return "init"
    return "first collective"


def _came_up_before(lines: Sequence[str], i: int) -> bool:
    """Did the last communicator init NCCL logged before line `i` complete, further back than the
    lines read with the error? Then an error now is a collective's, not set-up's."""
    for j in range(i - 1, -1, -1):
        if m := _INIT_MARK.search(lines[j]):
            return "START" not in m[0] and j < i - _NEAR
    return False


# Every line setup_cause can read holds one of these (NCCL's and NVSHMEM's words, the IB steps
# NVSHMEM names without its own, torch's rendezvous and store): a log with none of them is read
# no further for a set-up failure (core/judge/derived.py runs on every tick).
# Lower-case literals: a substring test per line costs a third of one case-blind regex.
_SETUP_HINTS = (
    "nccl",
    "nvshmem",
    "rendezvous",
    "clients joined",
    "connect eps failed",
    "ep_connect failed",
    "ibv_modify_qp failed",
    "transport create connect failed",
    "create dct share err",
    "waitforinput",
)


def setup_hinted(text: str) -> bool:
    """Could setup_cause read anything in `text`?"""
    low = text.lower()
    return any(h in low for h in _SETUP_HINTS)


def setup_cause(lines: Sequence[str], i: int) -> Cause | None:
    """A communicator set-up failure on line `i` (an NCCL error before init completed, an
    NVSHMEM bootstrap or a rendezvous that timed out), with its stage."""
    line = lines[i]
    if (trail := nccl_trail(lines, i)) is not None:
        return Cause("collective_setup", trail.summary, _SETUP_FIX, trail.line, trail.stage)
    if m := _NVSHMEM_CONNECT.search(line):
        where = f" ({m['file']}, status {m['st']})" if m["file"] else ""
        return Cause(
            "collective_setup",
            "NVSHMEM could not connect its transport's endpoints (IB queue pairs): "
            f"{m['what'] or m['bare']}{where}",
            _SETUP_FIX,
            line,
            "init",
        )
    if _STORE_WAIT.search(line):
        near = [x for x in lines[max(0, i - _NEAR) : i + 30] if not _STORE_WAIT.search(x)]
        if not any(_STAGE_INIT.search(x) or _STAGE_BOOT.search(x) for x in near):
            return None
        return Cause(
            "collective_setup",
            f"the rendezvous store never answered: {line.strip()[:160]}",
            _SETUP_FIX,
            line,
            "bootstrap",
        )
    if _SETUP.search(line):
        stage = setup_stage(lines, i)
        return Cause(
            "collective_setup",
            f"communicator set-up failed: {line.strip()[:160]}",
            _SETUP_FIX,
            line,
            stage,
        )
    m = _NCCL_ERR.search(line)
    if m is None or "{" in m[0]:  # `raise RuntimeError(f"NCCL error: {error_str}")`: source
        return None
    stage = setup_stage(lines, i)
    what = (m["what"] or m["what2"] or m["name"] or m["what3"] or "NCCL error").strip()
    if stage == "first collective" and (
        _came_up_before(lines, i) or not any(_STAGE_INIT.search(x) for x in lines[: i + 1])
    ):
        # No sign of set-up around it: a collective's failure, the set-up stage unknown.
        return Cause("collective", f"NCCL {what} in a collective", _SETUP_FIX, line)
    return Cause(
        "collective_setup",
        f"NCCL {what} while setting up the communicator",
        _SETUP_FIX,
        line,
        stage,
    )


# ---- 4. An engine's request loop that died ------------------------------------------------

# Each engine's own words for its request loop dying, from its source:
# - TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py PyExecutor._event_loop_wrapper
#   (the executor-loop thread's target): logger.error(f"Error in event loop: {e}") then re-raise;
#   tensorrt_llm/executor/proxy.py: "Executor worker initialization error: ..." and
#   RuntimeError("Executor worker returned error"); tensorrt_llm/llmapi/utils.py ManagedThread:
#   "Error in thread {name}: {e}" (await_response_thread and the other executor threads);
# - CPython Lib/threading.py excepthook: "Exception in thread NAME (TARGET):" for any thread
#   that ends with an exception; an engine's loop thread names its target;
# - vLLM vllm/v1/engine/core.py "EngineCore encountered a fatal error" / "EngineCore hit an
#   exception" and vllm/v1/engine/async_llm.py output_handler: "AsyncLLM output_handler failed."
#   (the API server's side once the engine core is gone);
# - SGLang srt/managers/scheduler.py "Scheduler hit an exception";
# - Dynamo's workers run these engines in-process and log their lines, plus the same
#   ManagedThread helper (components/src/dynamo/trtllm/publisher.py: "Error in thread {name}"),
#   and their own: the prefill worker's queue-handler task ends the worker with `[ERROR] prefill
#   queue handler failed: {e!r}` (examples/llm/components/prefill_worker.py, v0.1-v0.2), the
#   engine monitor with `vLLM AsyncLLM health check failed: {e}`
#   (components/src/dynamo/vllm/engine_monitor.py).
# The rest from the sweep of each engine's source (tests/data/deaths.toml cites each line):
# vLLM V0 vllm/engine/async_llm_engine.py@v0.7.3 `Engine background task failed`, 0.7 V1
# vllm/v1/engine/async_llm.py@v0.7.3 `EngineCore output handler hit an error`, 0.32
# vllm/v1/executor/multiproc_executor.py `WorkerProc hit an exception.` / `WorkerProc failed.`
# and ray_executor_v2.py `RayWorkerProc failed: %s`; SGLang's other loops (`X hit an
# exception`, srt/managers/*.py); TensorRT-LLM executor/worker.py worker_main `Failed to
# initialize executor on rank N: {e}` and pyexecutor/hang_detector.py `Executor loop crashed on
# this rank`; Dynamo's SGLang health monitor `SGLang engine unresponsive after N attempts` and
# TensorRT-LLM monitor `TRT-LLM engine is unhealthy: ERR` (components/src/dynamo/*/).
# A `said` group is the exception the loop's own line carries.
_LOOP = (
    (
        re.compile(r"Error in event loop: (?P<said>.+)"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        # The executor thread's own traceback through its loop (its death line cut or, before
        # 0.20's _event_loop_wrapper, never written): py_executor.py's loop frames.
        re.compile(r", in (?:_executor_loop(?:_overlap|_pp)?|_event_loop_wrapper)\s*$"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        re.compile(r"Executor worker returned error|Executor worker initialization error"),
        "TensorRT-LLM's executor worker",
    ),
    (re.compile(r"Error in thread (?P<n>\w+): "), "thread {n}"),
    (re.compile(r"Exception in thread (?P<n>[^\s:]+(?: \(\w+\))?):"), "thread {n}"),
    (
        re.compile(
            r"EngineCore encountered a fatal error|EngineCore hit an exception"
            r"|EngineCore failed to start|, in run_engine_core\s*$|Process EngineCore\w*:\s*$"
        ),
        "vLLM's engine core loop",
    ),
    (
        re.compile(r", in (?:run_mp_engine|run_engine_loop)\s*$"),
        "vLLM V0's engine loop",
    ),
    (
        re.compile(r"AsyncLLM output_handler failed"),
        "vLLM's API-server output handler (the engine core is gone)",
    ),
    (re.compile(r"Scheduler hit an exception"), "SGLang's scheduler loop"),
    (re.compile(r"DetokenizerManager hit an exception"), "SGLang's detokenizer loop"),
    (re.compile(r"TokenizerManager hit an exception"), "SGLang's tokenizer manager loop"),
    (re.compile(r"DataParallelController hit an exception"), "SGLang's data-parallel controller"),
    (re.compile(r"TpModelWorkerClient hit an exception"), "SGLang's overlap worker thread"),
    (re.compile(r"Engine background task failed"), "vLLM V0's engine loop (AsyncLLMEngine)"),
    (
        re.compile(r"EngineCore output handler hit an error: (?P<said>.+)"),
        "vLLM's API-server output handler (the engine core is gone)",
    ),
    (
        re.compile(r"RayWorkerProc failed: (?P<said>.+)|WorkerProc (?:hit an exception|failed\.)"),
        "a vLLM worker process",
    ),
    (
        re.compile(r"Failed to initialize executor on rank (?P<r>\d+): (?P<said>.+)"),
        "TensorRT-LLM's executor on rank {r} (at start-up)",
    ),
    (
        re.compile(r"Executor loop crashed on this rank"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        re.compile(r"SGLang engine unresponsive after \d+ attempts"),
        "the SGLang engine under Dynamo (its health monitor)",
    ),
    (
        re.compile(r"TRT-LLM engine is unhealthy: (?P<said>.+)"),
        "the TensorRT-LLM engine under Dynamo (its engine monitor)",
    ),
    (
        re.compile(r"prefill queue handler failed: (?P<said>.+)"),
        "Dynamo's prefill worker (its prefill-queue handler)",
    ),
    (
        re.compile(r"AsyncLLM health check failed:(?: (?P<said>.+))?"),
        "the vLLM engine under Dynamo (its engine monitor's health check)",
    ),
    (
        re.compile(r"Initiating Dynamo Runtime shutdown"),
        "a Dynamo worker's engine (the worker shut its runtime down)",
    ),
)
# An exception line: `RuntimeError: ...`, `torch.OutOfMemoryError: ...` (not the loop's own).
_EXC_LINE = re.compile(
    r"(?:^|\s)(?P<exc>(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (?P<msg>\S.*)$"
)
# A dying loop's timeout: vLLM's shm_broadcast acquire_read `raise TimeoutError`, the
# executor's `RPC call to %s timed out` (v1/executor/multiproc_executor.py), asyncio's.
_TIMEOUT = re.compile(r"\bTimeoutError\b|timed out")
_LOOP_SPAN = 60  # lines of the dying loop's traceback read for its timeout
_LOOP_TIMEOUT_FIX = (
    "The engine's request loop died of a timeout: it waited on something that never answered, "
    "usually a worker that hung (a kernel or a collective that never returned) or died. The "
    "stacks of every worker at the time name it (hang-watchdog diagnose --pid PID); then "
    "restart the server."
)
_LOOP_FIX = (
    "The engine's request loop died, so no request can finish; the server must restart. Fix "
    "the root cause named here (the first exception in the dying loop), then restart."
)


def _loop_name(line: str) -> str | None:
    for pat, name in _LOOP:
        if m := pat.search(line):
            return name.format(**m.groupdict())
    return None


def _loop_said(line: str) -> str:
    """The exception a loop's own line carries (TensorRT-LLM's and Dynamo's lines), or ''."""
    for pat, _ in _LOOP:
        if (m := pat.search(line)) and m.groupdict().get("said"):
            return m["said"].strip()
    return ""


def root_cause(lines: Sequence[str]) -> Cause | None:
    """The root cause the lines name, first in log order; an engine loop's death names the
    first specific cause or exception around it."""
    loop: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        name = _loop_name(line)
        if name is not None and loop is None:
            loop = (i, name)
        specific = (
            toolchain_cause(line)
            or setup_cause(lines, i)
            or _transport(lines, i)
            or cuda_cause(line)
            or _signal(lines, i)
        )
        if specific is not None:
            return _in_loop(loop[1], specific) if loop is not None else specific
    if loop is None:
        return None
    i, name = loop
    exc = _first_exception(lines[i:])
    said = _loop_said(lines[i])
    if exc is None and said:  # the loop's own line carries the exception
        return Cause("engine_loop", f"{name} died: {said[:200]}", _LOOP_FIX, lines[i])
    # The traceback a chained exception printed first (`The above exception was the direct
    # cause`) lies above the loop's frame: it is read too.
    waited = _timeout(lines[max(0, i - _LOOP_SPAN) : i + _LOOP_SPAN], exc)
    if waited is not None:
        return Cause("engine_loop", f"{name} died: {waited}", _LOOP_TIMEOUT_FIX, lines[i])
    if exc is None:
        return Cause(
            "engine_loop",
            f"{name} died; its first exception is not in the log (cause unknown: the engine's "
            "full log or the process's stacks name it)",
            _LOOP_FIX,
            lines[i],
        )
    return Cause("engine_loop", f"{name} died: {exc[:200]}", _LOOP_FIX, lines[i])


def _timeout(lines: Sequence[str], exc: str | None) -> str | None:
    """The wait that timed out in a dying loop's traceback (`raise TimeoutError`, `RPC call to
    sample_tokens timed out`), or None when the loop died of something else."""
    if exc is not None:
        return f"a wait timed out ({exc[:200]})" if _TIMEOUT.search(exc) else None
    for line in lines:
        if m := _TIMEOUT.search(line):
            said = line[line.rfind("] ", 0, m.start()) + 2 :] if "] " in line else line
            return f"a wait timed out ({said.strip()[:200]})"
    return None


def _signal(lines: Sequence[str], i: int) -> Cause | None:
    """A fatal signal the server's own handler reported (core/judge/fatalsignal.py)."""
    got = signal_reading(lines, i)
    return None if got is None else Cause("signal", got.summary, SIGNAL_FIX, got.line)


def _transport(lines: Sequence[str], i: int) -> Cause | None:
    """A transport's own error line (core/judge/transport.py): which transport, what failed."""
    got = transport_reading_at(lines, i)
    return None if got is None else Cause("transport", got.summary, got.fix, lines[i])


def _in_loop(name: str, cause: Cause) -> Cause:
    return Cause(cause.kind, f"{name} died: {cause.summary}", cause.fix, cause.line, cause.stage)


def _first_exception(lines: Sequence[str]) -> str | None:
    for line in lines:
        if _loop_name(line) is not None and _EXC_LINE.search(line) is None:
            continue
        m = _EXC_LINE.search(line)
        if m and not _TEARDOWN.search(line):
            return f"{m['exc']}: {m['msg'].strip()}"
    return None


def event_lines(events: Sequence[LogEvent]) -> list[str]:
    """The lines of the events after the server's last progress, each traceback's exception
    line in its place (a handled error the server moved past is no cause)."""
    out: list[str] = []
    for ev in after_progress(events):
        out.append(ev.line)
        exc = ev.fields.get("exception") if ev.kind == "stack" else None
        if exc and exc != ev.line:
            out.append(str(exc))
    return out


def cause_of(events: Sequence[LogEvent]) -> Cause | None:
    """The root cause the log's events name (replay and the live watch alike)."""
    return root_cause(event_lines(events))


_UNKNOWN = "unknown: the log shows the failure, not its cause"


def cause_json(cause: Cause | None, generic: bool) -> dict[str, str] | None:
    """`replay --json`'s `cause`: the root cause, or (under a generic class) `unknown`."""
    if cause is None:
        return {"kind": "unknown", "summary": _UNKNOWN} if generic else None
    return {
        "kind": cause.kind,
        "summary": cause.summary,
        "stage": cause.stage,
        "line": cause.line.strip(),
        "fix": cause.fix,
    }


def print_cause(cause: Cause | None, generic: bool) -> None:
    """`replay`'s cause lines under the verdict; under a generic class an unknown cause is
    said so (the class's `what would name the cause` line names the live evidence)."""
    if cause is None:
        if generic:
            print(f"  root cause: {_UNKNOWN}")
        return
    print(f"  root cause: {cause.text()}")
    print(f"  cause line: {cause.line.strip()[:300]}")
    print(f"  cause fix: {cause.fix}")
