"""Fatal CUDA errors in any engine's format, with their name and the call that returned them;
the GPU driver's Xid lines (pure: a line in, a Cause out)."""

from __future__ import annotations

import re

from watchdog.core.judge.cause import Cause

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
    "system not yet initialized": "cudaErrorSystemNotReady",
}
# cudaErrorSystemNotReady (802): "the system is not yet ready to start any CUDA work ... the
# system management software" (cuda_runtime_api.h): on an NVSwitch system (HGX, DGX) the Fabric
# Manager service has not brought the fabric up, so no kernel, collective or allocation runs.
NVSWITCH_FIX = (
    "The GPUs' NVSwitch fabric is not up (CUDA 802, cudaErrorSystemNotReady): start the "
    "nvidia-fabricmanager service (its version must match the driver's), check that "
    "`nvidia-smi -q` shows the fabric state Completed, then restart the server."
)


def fabric_down(err: str) -> bool:
    """Is this CUDA error text cudaErrorSystemNotReady (the NVSwitch fabric not up)?"""
    return err.startswith("system not yet initialized")


# NCCL's own CUDA failure under its error (src/include/checks.h CUDACHECK `Cuda failure
# 'text'`, and ncclGetLastError's `Cuda failure N 'text'` under torch's `Last error:`).
NCCL_CUDA = re.compile(r"Cuda failure (?:(?P<n>\d+) )?'(?P<text>[^']+)'")
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
TEARDOWN = re.compile(
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
    if TEARDOWN.search(line):
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
        if fabric_down(err):
            return Cause("cuda", f"CUDA error {_cuda_name(err)}", NVSWITCH_FIX, line)
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
