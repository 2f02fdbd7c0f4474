"""GPU inventory for pre-flight: count, names, compute capabilities, driver, fabric state.

Every NVML call runs in a worker thread with a deadline, because a wedged driver can block
NVML for minutes and pre-flight must never hang.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned
from watchdog.sources import deadline
from watchdog.sources.gpu.backend import FabricInfo, GpuBackend, GpuError

T = TypeVar("T")
log = logging.getLogger("hang_watchdog.preflight")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as pre-flight sees it."""

    index: int
    name: str | None
    cc: str | None  # "major.minor", e.g. "10.3"
    fabric: FabricInfo | None = None
    fabric_error: str | None = None


@dataclass(frozen=True)
class GpuInventory:
    """All GPUs, or why they could not be listed (`gpus is None`)."""

    gpus: tuple[GpuInfo, ...] | None
    driver: str | None = None
    error: str | None = None
    source: str = "nvml"

    @property
    def ccs(self) -> tuple[str, ...]:
        """Distinct compute capabilities, sorted; empty when unknown."""
        return tuple(sorted({g.cc for g in self.gpus or () if g.cc}))


def arch_target(cc: str) -> str:
    """The arch-specific target a GPU needs, e.g. "10.3" -> "10.3a".

    FlashInfer compiles SM 9.x and newer with the `a` (architecture-specific) suffix; its JIT
    workspace for GB300 is `.../103a/` (flashinfer-ai/flashinfer flashinfer/jit/core.py, v0.6.7).
    """
    major = int(cc.split(".")[0])
    return f"{cc}a" if major >= 9 else cc


def call_with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    """Run `fn` under a hard deadline; raise GpuError if it does not return within `timeout_s`."""
    try:
        return deadline.call_with_deadline(fn, timeout_s, name="preflight-gpu")
    except deadline.DeadlineExceeded as e:
        raise GpuError(f"GPU backend did not answer within {timeout_s:g} s") from e
    except GpuError:
        raise
    except Exception as e:  # a bug in a backend must not take pre-flight down
        log.exception("GPU backend failed unexpectedly")
        raise GpuError(f"GPU backend failed unexpectedly: {type(e).__name__}: {e}") from e


def collect_gpus(
    backend: GpuBackend | None, timeout_s: float, source: str = "nvml"
) -> GpuInventory:
    """List the GPUs through `backend`; never raises (errors become `GpuInventory.error`)."""
    if backend is None:
        return GpuInventory(None, error="GPU source disabled (--gpu-source none)", source="none")
    try:
        return call_with_deadline(lambda: _inventory(backend, source), timeout_s)
    except GpuError as e:
        return GpuInventory(None, error=str(e), source=source)


def _inventory(backend: GpuBackend, source: str) -> GpuInventory:
    """Ask the backend for everything pre-flight needs, then shut it down."""
    backend.init()
    try:
        driver = backend.driver_version()
        gpus = []
        for index in range(backend.device_count()):
            sample = backend.sample(index)
            fabric, fabric_error = None, None
            try:
                fabric = backend.fabric(index)
            except GpuError as e:
                fabric_error = str(e)
            gpus.append(GpuInfo(index, sample.name, sample.cc, fabric, fabric_error))
        return GpuInventory(tuple(gpus), driver=driver, source=source)
    finally:
        with contextlib.suppress(GpuError):  # shutting down a broken NVML is best effort
            backend.shutdown()


def check_gpus(inv: GpuInventory) -> CheckResult:
    """GPUs: count, names, compute capabilities, driver version, architecture targets."""
    if inv.gpus is None:
        if inv.source == "none":
            return skipped("gpus", inv.error or "GPU source disabled")
        return failed(
            "gpus",
            f"could not list GPUs: {inv.error}",
            [
                "check that the NVIDIA driver is loaded: nvidia-smi",
                "in a container, expose the GPUs (--gpus all / nvidia.com/gpu resource)",
                "or run with --gpu-source none to skip the GPU-dependent checks",
            ],
        )
    if not inv.gpus:
        return failed("gpus", "NVML reports no GPUs", ["check CUDA_VISIBLE_DEVICES and nvidia-smi"])
    names = sorted({g.name or "unknown" for g in inv.gpus})
    targets = [arch_target(c) for c in inv.ccs]
    details = {
        "count": len(inv.gpus),
        "names": names,
        "compute_capabilities": list(inv.ccs),
        "arch_targets": targets,
        "driver": inv.driver,
    }
    reason = (
        f"{len(inv.gpus)} GPU(s): {', '.join(names)}; CC {', '.join(inv.ccs) or 'unknown'}"
        f" (needs {', '.join(targets) or 'unknown'}); driver {inv.driver or 'unknown'}"
    )
    if not inv.ccs:
        return warned("gpus", reason, ["check nvidia-smi; compute capability was unreadable"])
    return passed("gpus", reason, **details)
