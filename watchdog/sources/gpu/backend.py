"""The GPU interface: a backend per vendor API, and the source that polls it with a deadline.

`GpuBackend` is what `NvmlBackend` (watchdog/sources/gpu/nvml.py) implements and what tests fake
with `FakeGpuBackend`. Only nvml.py imports pynvml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from watchdog.core.model import GpuSample


@dataclass(frozen=True)
class FabricInfo:
    """NVML GPU fabric (NVLink/NVSwitch) state (nvmlDeviceGetGpuFabricInfo, nvidia-ml-py)."""

    state: (
        int  # NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not started, 2 in progress, 3 completed
    )
    status: int | None = None  # nvmlReturn; meaningful only when state is completed
    health_summary: int | None = None  # 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity
    health_mask: int | None = None


class GpuBackend(Protocol):
    """A vendor API behind the smallest interface the watchdog needs. Methods may raise
    `GpuError`; the GpuSource turns that into a down source, never into a crash."""

    def init(self) -> None: ...

    def device_count(self) -> int: ...

    def sample(self, index: int) -> GpuSample: ...

    def driver_version(self) -> str | None: ...

    def fabric(self, index: int) -> FabricInfo | None: ...

    def shutdown(self) -> None: ...


class GpuError(Exception):
    """A GPU backend could not answer (no library, no driver, GPU lost, call failed)."""
