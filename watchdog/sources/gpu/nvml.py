"""The real GPU backend: NVML through nvidia-ml-py. The only module that imports pynvml.

Partial failure is data (gpustat style): a field whose call fails is None, a call the driver
does not support ("Not Supported" / "Function Not Found") is remembered and logged once
(nvitop style), and only a lost GPU or a failed init raises `GpuError`.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from watchdog.core.model import GpuSample
from watchdog.sources.gpu.backend import FabricInfo, GpuError

log = logging.getLogger("hang_watchdog.sources.gpu.nvml")

T = TypeVar("T")
Ratio = float | None

NO_LIBRARY = (
    "NVML not available (libnvidia-ml.so not found): is the NVIDIA driver installed? "
    "The GPU source is down; the watchdog keeps running on its other signals."
)
NO_MODULE = (
    "NVML not available (the Python module pynvml from nvidia-ml-py is not installed): "
    "pip install nvidia-ml-py. The GPU source is down; the watchdog keeps running on its "
    "other signals."
)


class NvmlBackend:
    """`GpuBackend` over NVML. Called from one thread only (GpuSource's worker)."""

    def __init__(self, logger: logging.Logger = log, module: Any = None) -> None:
        self._log = logger
        self._module = module  # a stand-in for pynvml (recorded answers); None: import it
        self._nvml: Any = None
        self._unsupported: set[str] = set()  # call names the driver said it does not support
        self._errors_seen: set[str] = set()
        self._gpm_ok: dict[int, bool] = {}  # index -> GPM usable on this GPU
        self._gpm_prev: dict[int, Any] = {}  # index -> previous GPM sample (owned, freed later)
        self._index: int | None = None  # the GPU being read, for error messages
        self._max_clock: dict[int, float | None] = {}  # index -> max SM clock (MHz)

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        """Load pynvml and libnvidia-ml lazily, so a host without them still imports this."""
        try:
            pynvml = self._module or importlib.import_module("pynvml")  # lazy: not at import
        except ImportError as exc:
            raise GpuError(NO_MODULE) from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise GpuError(NO_LIBRARY) from exc
            raise GpuError(f"NVML init failed: {exc}. The GPU source is down.") from exc
        self._nvml = pynvml

    def shutdown(self) -> None:
        """Free held GPM samples and shut NVML down; safe to call twice."""
        nvml = self._nvml
        if nvml is None:
            return
        for sample in self._gpm_prev.values():
            self._quiet(nvml.nvmlGpmSampleFree, sample)
        self._gpm_prev.clear()
        self._quiet(nvml.nvmlShutdown)
        self._nvml = None

    # -- GpuBackend --------------------------------------------------------------------------

    def device_count(self) -> int:
        nvml = self._require()
        try:
            return int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise GpuError(f"NVML could not count GPUs: {exc}") from exc

    def driver_version(self) -> str | None:
        nvml = self._require()
        return _text(self._field("nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion))

    def sample(self, index: int) -> GpuSample:
        """One GPU now; raises GpuError only when the GPU itself is unreachable (lost)."""
        nvml = self._require()
        h = self._handle(index)
        cc = self._field(
            "nvmlDeviceGetCudaComputeCapability", nvml.nvmlDeviceGetCudaComputeCapability, h
        )
        power = self._power(h)
        clock = self._field(
            "nvmlDeviceGetClockInfo", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM
        )
        procs = self._field(
            "nvmlDeviceGetComputeRunningProcesses", nvml.nvmlDeviceGetComputeRunningProcesses, h
        )
        sm, dram, tensor, method = self._utilisation(index, h)
        return GpuSample(
            index=index,
            uuid=_text(self._field("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, h)),
            name=_text(self._field("nvmlDeviceGetName", nvml.nvmlDeviceGetName, h)),
            cc=f"{cc[0]}.{cc[1]}" if cc is not None else None,
            sm=sm,
            dram=dram,
            power_w=power[0],
            sm_clock_mhz=float(clock) if clock is not None else None,
            procs=len(procs) if procs is not None else None,
            pids=tuple(sorted(int(p.pid) for p in procs)) if procs is not None else (),
            method=method,
            tensor=tensor,
            power_limit_w=power[1],
            sm_clock_max_mhz=self._max_sm_clock(index, h),
        )

    def _power(self, h: Any) -> tuple[float | None, float | None]:
        """Power draw and the limit the driver enforces (W): a spin draws near idle power
        while reading ~96 % busy (vllm #46097, eugr/spark-vllm-docker #260)."""
        nvml = self._nvml
        draw = self._field("nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, h)
        # Enforced = the lowest of every limiter (NVML docs); the management limit is the
        # operator's setting, read where the enforced one is not supported.
        limit = self._field(
            "nvmlDeviceGetEnforcedPowerLimit", nvml.nvmlDeviceGetEnforcedPowerLimit, h
        )
        if limit is None:
            limit = self._field(
                "nvmlDeviceGetPowerManagementLimit", nvml.nvmlDeviceGetPowerManagementLimit, h
            )
        return _watts(draw), _watts(limit) if limit else None

    def _max_sm_clock(self, index: int, h: Any) -> float | None:
        """The SM clock's maximum, read once per GPU (it does not change while running)."""
        if index not in self._max_clock:
            nvml = self._nvml
            mhz = self._field(
                "nvmlDeviceGetMaxClockInfo", nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM
            )
            if mhz is None:
                return None  # a transient failure is retried next poll
            self._max_clock[index] = float(mhz) if mhz else None
        return self._max_clock[index]

    def fabric(self, index: int) -> FabricInfo | None:
        """NVLink fabric state via nvmlDeviceGetGpuFabricInfoV (v3 struct); None if unsupported."""
        nvml = self._require()
        h = self._handle(index)
        info = nvml.c_nvmlGpuFabricInfo_v3_t()  # sets version 0x3000028 itself (pynvml.py)
        done = self._field(
            "nvmlDeviceGetGpuFabricInfoV", nvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info)
        )
        if done is None or info.state == nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None
        completed = info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return FabricInfo(
            state=int(info.state),
            status=int(info.status) if completed else None,  # "check only if state is complete"
            health_summary=int(info.healthSummary),
            health_mask=int(info.healthMask),
        )

    # -- utilisation -------------------------------------------------------------------------

    def _utilisation(self, index: int, h: Any) -> tuple[Ratio, Ratio, Ratio, str]:
        """SM, DRAM and tensor ratios: GPM over the interval since the last poll, else legacy
        rates (which have no tensor figure)."""
        if self._gpm_supported(index, h):
            got = self._gpm(index, h)
            if got is not None:
                return got[0], got[1], got[2], "gpm"
        nvml = self._nvml
        rates = self._field("nvmlDeviceGetUtilizationRates", nvml.nvmlDeviceGetUtilizationRates, h)
        if rates is None:
            return None, None, None, "utilization_rates"
        # gpu = "percent of time one or more kernels was executing": a stuck kernel reads ~100.
        return _ratio(rates.gpu), _ratio(rates.memory), None, "utilization_rates"

    def _gpm_supported(self, index: int, h: Any) -> bool:
        if index not in self._gpm_ok:
            nvml = self._nvml
            support = self._field("nvmlGpmQueryDeviceSupport", nvml.nvmlGpmQueryDeviceSupport, h)
            self._gpm_ok[index] = bool(support is not None and support.isSupportedDevice)
        return self._gpm_ok[index]

    def _gpm(self, index: int, h: Any) -> tuple[Ratio, Ratio, Ratio] | None:
        """Take a GPM sample, compute metrics against the previous one; None on the first poll."""
        nvml = self._nvml
        try:
            cur = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(h, cur)
        except nvml.NVMLError as exc:
            self._gpm_failed(index, "nvmlGpmSampleGet", exc)
            return None
        prev = self._gpm_prev.pop(index, None)
        self._gpm_prev[index] = cur
        if prev is None:
            return None  # no interval yet: this one poll uses the legacy rates
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 3
        mg.sample1, mg.sample2 = prev, cur
        mg.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        mg.metrics[1].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        # Tensor activity: a compute-bound matmul with its operands in L2 reads a spin's SM and
        # DRAM figures; its tensor pipes do not (0.72-0.93 measured on an H200).
        mg.metrics[2].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        try:
            nvml.nvmlGpmMetricsGet(mg)
        except nvml.NVMLError as exc:
            self._gpm_failed(index, "nvmlGpmMetricsGet", exc)
            return None
        finally:
            self._quiet(nvml.nvmlGpmSampleFree, prev)
        values = [
            _ratio(m.value) if m.nvmlReturn == nvml.NVML_SUCCESS else None
            for m in (mg.metrics[0], mg.metrics[1], mg.metrics[2])
        ]
        return values[0], values[1], values[2]

    def _gpm_failed(self, index: int, call: str, exc: Exception) -> None:
        self._raise_if_lost(index, exc)
        if self._is_unsupported(exc):
            self._gpm_ok[index] = False  # fall back to utilization rates for good
        self._note(call, exc)

    # -- the choke point ---------------------------------------------------------------------

    def _field(self, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Every per-field NVML call goes through here: error -> None, lost GPU -> GpuError."""
        if call in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            self._raise_if_lost(self._index, exc)
            self._note(call, exc)
            return None

    def _note(self, call: str, exc: Exception) -> None:
        if self._is_unsupported(exc):
            self._unsupported.add(call)
            self._log.info("NVML %s not supported here (%s); that field stays empty", call, exc)
            return
        key = f"{call}: {exc}"
        if key not in self._errors_seen:
            self._errors_seen.add(key)
            self._log.warning("NVML %s failed: %s; that field is empty this poll", call, exc)

    def _is_unsupported(self, exc: Exception) -> bool:
        nvml = self._nvml
        code = getattr(exc, "value", None)
        return code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _raise_if_lost(self, index: int | None, exc: Exception) -> None:
        nvml = self._nvml
        if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
            where = f"GPU {index}" if index is not None else "a GPU"
            raise GpuError(f"{where} is lost (NVML: {exc}); check dmesg for Xid errors") from exc

    def _handle(self, index: int) -> Any:
        nvml = self._nvml
        self._index = index
        try:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            raise GpuError(f"GPU {index} unreachable: NVML {exc}") from exc

    def _require(self) -> Any:
        if self._nvml is None:
            raise GpuError("NVML backend used before init() succeeded")
        return self._nvml

    def _quiet(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except self._nvml.NVMLError as exc:
            self._log.debug("NVML cleanup call failed: %s", exc)


def _ratio(percent: float | None) -> float | None:
    """NVML percent (0-100) as a ratio clamped to 0-1."""
    if percent is None:
        return None
    return min(1.0, max(0.0, float(percent) / 100.0))


def _watts(milliwatts: float | None) -> float | None:
    return milliwatts / 1000.0 if milliwatts is not None else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
