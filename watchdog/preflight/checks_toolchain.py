"""FlashInfer's JIT toolchain: nvcc (new enough for the GPUs), ninja, and the arch-list variables.

FlashInfer compiles kernels at run time unless prebuilt ones cover the GPUs; a host without
nvcc/ninja then dies after the weights are loaded (flashinfer/jit/cpp_ext.py get_cuda_path and
run_ninja, v0.6.7: "Could not find nvcc", FileNotFoundError for 'ninja').
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from watchdog.preflight.checks_gpu import GpuInventory, arch_target
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned

# Oldest CUDA toolkit whose nvcc can target each compute capability's arch-specific target.
# 10.3 / 12.1: "CUDA Toolkit 12.9 adds compiler target support for SM architecture 10.3 (sm_103,
#   sm_103f, sm_103a) and 12.1 (sm_121)" (CUDA Features Archive, 12.9 General CUDA,
#   https://docs.nvidia.com/cuda/archive/12.9.1/cuda-features-archive/index.html).
# 10.0 / 12.0: Blackwell support starts with CUDA 12.8 (Blackwell Compatibility Guide, "Building
#   Applications Using CUDA Toolkit 12.8", https://docs.nvidia.com/cuda/blackwell-compatibility-guide).
# 11.0: sm_110 (Thor, renamed from sm_101) arrived with CUDA 13.0 / PTX ISA 9.0 (UNVERIFIED against
#   NVIDIA's own notes; from a GCC nvptx patch). 9.0: sm_90a needs CUDA 12.0 (UNVERIFIED).
MIN_CUDA: dict[str, tuple[int, int]] = {
    "8.0": (11, 0),
    "8.6": (11, 1),
    "8.9": (11, 8),
    "9.0": (12, 0),
    "10.0": (12, 8),
    "10.3": (12, 9),
    "11.0": (13, 0),
    "12.0": (12, 8),
    "12.1": (12, 9),
}
DEFAULT_CUDA_ROOT = Path("/usr/local/cuda")
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_NVCC_FIXES = (
    "install the CUDA toolkit (nvcc) matching the GPUs and set CUDA_HOME to it",
    # The commands depend on what was published for this FlashInfer: the cubin_package and
    # jit_cache_package checks name them (preflight/checks_cubins.py).
    "or install FlashInfer's prebuilt kernels (flashinfer-cubin, flashinfer-jit-cache) as the "
    "cubin_package and jit_cache_package "
    "checks say",
)


def strip_local(version: str) -> str:
    """ "0.6.16+cu130" -> "0.6.16": wheels from flashinfer.ai carry a CUDA local version."""
    return version.split("+", 1)[0]


def jit_needed(versions: Mapping[str, str | None] | None) -> tuple[bool | None, str]:
    """Whether FlashInfer will JIT-compile: it will unless matching cubin and jit-cache exist."""
    if versions is None:
        return None, "package versions unknown"
    fi = versions.get("flashinfer-python")
    if not fi:
        return False, "FlashInfer is not installed"
    cubin, cache = versions.get("flashinfer-cubin"), versions.get("flashinfer-jit-cache")
    if cubin == fi and cache and strip_local(cache) == strip_local(fi):
        # UNVERIFIED: that the jit-cache wheel's arch list covers every GPU; it is built per CUDA.
        return False, f"flashinfer-cubin and flashinfer-jit-cache {fi} provide prebuilt kernels"
    return True, f"no prebuilt kernels cover FlashInfer {fi} (cubin {cubin}, jit-cache {cache})"


def find_nvcc(environ: Mapping[str, str], cuda_default: Path) -> Path | None:
    """nvcc from CUDA_HOME, CUDA_PATH, PATH, then the default root: FlashInfer's search order
    (flashinfer jit/cpp_ext.py get_cuda_path; /usr/local/cuda default since flashinfer PR #1948)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return Path(root) / "bin" / "nvcc"
    on_path = shutil.which("nvcc", path=environ.get("PATH", ""))
    if on_path:
        return Path(on_path)
    default = cuda_default / "bin" / "nvcc"
    return default if default.is_file() else None


def nvcc_release(nvcc: Path, environ: Mapping[str, str], timeout_s: float) -> tuple[int, int]:
    """Parse `Cuda compilation tools, release 12.8, V12.8.93` from `nvcc --version`."""
    proc = subprocess.run(
        [str(nvcc), "--version"],
        env=dict(environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    match = _RELEASE.search(proc.stdout)
    if not match:
        raise ValueError(f"{nvcc} --version printed no 'release X.Y': {proc.stdout.strip()[:120]}")
    return int(match.group(1)), int(match.group(2))


def check_nvcc(
    inv: GpuInventory,
    versions: Mapping[str, str | None] | None,
    environ: Mapping[str, str],
    cuda_default: Path,
    timeout_s: float,
) -> CheckResult:
    """nvcc present and new enough for every GPU's arch target, when the JIT will run."""
    needed, why = jit_needed(versions)
    nvcc = find_nvcc(environ, cuda_default)
    if nvcc is None:
        if needed is False:
            return skipped("nvcc", f"not needed: {why}")
        return failed(
            "nvcc",
            f"nvcc not found (CUDA_HOME, CUDA_PATH, PATH, {cuda_default}) and {why}",
            _NVCC_FIXES,
        )
    try:
        release = nvcc_release(nvcc, environ, timeout_s)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        bad = failed if needed else warned
        return bad("nvcc", f"{nvcc} does not work: {e}", _NVCC_FIXES, path=str(nvcc))
    return _judge_release(inv, nvcc, release, needed)


def _judge_release(
    inv: GpuInventory, nvcc: Path, release: tuple[int, int], needed: bool | None
) -> CheckResult:
    """Compare nvcc's release with the minimum for each GPU's compute capability."""
    shown = f"{nvcc} is CUDA {release[0]}.{release[1]}"
    details = {"path": str(nvcc), "release": f"{release[0]}.{release[1]}"}
    unknown = [cc for cc in inv.ccs if cc not in MIN_CUDA]
    too_old = [cc for cc in inv.ccs if cc in MIN_CUDA and release < MIN_CUDA[cc]]
    if too_old:
        need = max(MIN_CUDA[cc] for cc in too_old)
        targets = ", ".join("sm_" + arch_target(c).replace(".", "") for c in too_old)
        fixes = [f"install CUDA >= {need[0]}.{need[1]} and point CUDA_HOME at it", *_NVCC_FIXES[1:]]
        bad = failed if needed else warned
        return bad("nvcc", f"{shown}, too old for {targets}", fixes, **details)
    if unknown:
        return warned(
            "nvcc",
            f"{shown}; no data on the minimum CUDA for CC {', '.join(unknown)}",
            ["check NVIDIA's CUDA release notes for this GPU architecture"],
            **details,
        )
    if inv.gpus is None:
        return passed("nvcc", f"{shown} (GPUs unknown, architecture not checked)", **details)
    return passed("nvcc", f"{shown}, can target {', '.join(map(arch_target, inv.ccs))}", **details)


def check_ninja(
    versions: Mapping[str, str | None] | None, environ: Mapping[str, str]
) -> CheckResult:
    """ninja on PATH: FlashInfer runs `ninja -v -C ...` (jit/cpp_ext.py run_ninja)."""
    needed, why = jit_needed(versions)
    found = shutil.which("ninja", path=environ.get("PATH", ""))
    if found:
        return passed("ninja", f"ninja at {found}", path=found)
    if needed is False:
        return skipped("ninja", f"not needed: {why}")
    return failed(
        "ninja",
        f"ninja not on PATH and {why}",
        ["pip install ninja (into the server's environment) or apt-get install ninja-build"],
    )


def parse_arch_list(value: str) -> list[str]:
    """ "9.0;10.0a 10.3+PTX" -> ["9.0", "10.0", "10.3"] (major.minor, suffixes dropped)."""
    out = []
    for item in re.split(r"[;\s,]+", value.strip()):
        match = re.match(r"(\d+)\.(\d+)", item)
        if match:
            out.append(f"{match.group(1)}.{match.group(2)}")
    return out


def check_arch_lists(
    inv: GpuInventory, versions: Mapping[str, str | None] | None, environ: Mapping[str, str]
) -> CheckResult:
    """TORCH_CUDA_ARCH_LIST / FLASHINFER_CUDA_ARCH_LIST, when set, must cover every GPU."""
    names = [v for v in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST") if environ.get(v)]
    if not names:
        return skipped("arch_list", "TORCH_CUDA_ARCH_LIST and FLASHINFER_CUDA_ARCH_LIST are unset")
    if inv.gpus is None:
        return skipped("arch_list", "GPUs unknown")
    problems = _uncovered(names, inv.ccs, environ)
    if not problems:
        return passed("arch_list", f"{', '.join(names)} cover CC {', '.join(inv.ccs)}")
    needed, _ = jit_needed(versions)
    targets = " ".join(arch_target(c) for c in inv.ccs)
    fixes = [f'export {n}="{targets}" (or unset it to let FlashInfer detect)' for n in names]
    bad = failed if needed else warned
    return bad("arch_list", "; ".join(problems), fixes)


def _uncovered(names: Sequence[str], ccs: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    problems = []
    for name in names:
        missing = [cc for cc in ccs if cc not in parse_arch_list(environ[name])]
        if missing:
            problems.append(f"{name}={environ[name]!r} lacks {', '.join(missing)}")
    return problems
