"""A JIT build that failed on a missing header, library or tool, with the package that
provides it (pure: a line in, a Cause out)."""

from __future__ import annotations

import re

from watchdog.core.judge.cause import Cause

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
