"""The real NvmlBackend against a patched pynvml (this module only), plus one live-GPU test."""

from __future__ import annotations

import ctypes
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from watchdog.sources.gpu.backend import GpuError
from watchdog.sources.gpu.nvml import NvmlBackend
from watchdog.sources.gpu.source import GpuSource


class FakeNvml:
    """Scripted replacements for the pynvml functions NvmlBackend calls. Handles are ints."""

    def __init__(self, gpus: int = 2, gpm: bool = True) -> None:
        self.gpus = gpus
        self.gpm = gpm
        self.rates = {i: (97, 3) for i in range(gpus)}  # percent: gpu, memory
        self.gpm_values = {i: (99.0, 0.5, 0.0) for i in range(gpus)}  # percent: SM, DRAM, tensor
        self.gpm_returns = (pynvml.NVML_SUCCESS, pynvml.NVML_SUCCESS, pynvml.NVML_SUCCESS)
        self.errors: dict[str, Exception] = {}  # function name -> error it raises
        self.calls: dict[str, int] = {}
        self.freed = 0
        self.shutdowns = 0
        self.fabric_versions: list[int] = []
        self.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        self._last_device = 0

    def install(self, mp: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                mp.setattr(pynvml, name, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.errors:
                raise self.errors[name]
            return fn(*args)

        return call

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.65.06"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA GB300"  # older pynvml returned bytes: the backend decodes

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (10, 3)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 650_500  # mW

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 2032

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 1_400_000  # mW

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return 1_200_000  # mW

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=4321, usedGpuMemory=None), SimpleNamespace(pid=1234)]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = self.rates[h]
        return util

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = 1 if self.gpm else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        self._last_device = h
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        assert mg.version == pynvml.NVML_GPM_METRICS_GET_VERSION and mg.numMetrics == 3
        ids = (
            pynvml.NVML_GPM_METRIC_SM_UTIL,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        )
        by_id = dict(
            zip(
                ids,
                zip(self.gpm_values[self._last_device], self.gpm_returns, strict=True),
                strict=True,
            )
        )
        for i in range(mg.numMetrics):
            value, ret = by_id[mg.metrics[i].metricId]
            mg.metrics[i].value, mg.metrics[i].nvmlReturn = value, ret
        return mg

    def nvmlDeviceGetGpuFabricInfoV(self, h: int, ref: Any) -> int:
        info = ref._obj  # ctypes.byref(...) keeps the struct here
        self.fabric_versions.append(info.version)
        info.state = self.fabric_state
        info.status = pynvml.NVML_SUCCESS
        info.healthSummary = 1
        info.healthMask = 1 << 14  # GFM_STATE CONNECTED
        return pynvml.NVML_SUCCESS


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    f = FakeNvml()
    f.install(monkeypatch)
    return f


def started() -> NvmlBackend:
    backend = NvmlBackend()
    backend.init()
    return backend


def test_gpm_supported_reads_gpm_over_the_interval_between_polls(fake: FakeNvml) -> None:
    backend = started()
    first = backend.sample(0)
    assert first.method == "utilization_rates"  # no interval yet on the first poll
    assert first.sm == pytest.approx(0.97) and first.dram == pytest.approx(0.03)
    second = backend.sample(0)
    assert second.method == "gpm"
    assert second.sm == pytest.approx(0.99) and second.dram == pytest.approx(0.005)
    assert fake.freed == 1  # the previous sample was freed after use
    assert (second.cc, second.name, second.power_w) == ("10.3", "NVIDIA GB300", 650.5)
    assert second.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert second.sm_clock_mhz == 1980.0
    assert (second.power_limit_w, second.sm_clock_max_mhz) == (1400.0, 2032.0)
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 1  # a fixed figure: read once per GPU
    assert (second.procs, second.pids) == (2, (1234, 4321))
    backend.shutdown()
    assert fake.freed == 2 and fake.shutdowns == 1


def test_gpm_unsupported_uses_utilization_rates(fake: FakeNvml) -> None:
    fake.gpm = False
    fake.rates[1] = (100, 0)
    backend = started()
    for _ in range(3):
        s = backend.sample(1)
        assert (s.method, s.sm, s.dram) == ("utilization_rates", 1.0, 0.0)
    assert "nvmlGpmSampleGet" not in fake.calls


def test_gpm_metric_with_error_return_is_none(fake: FakeNvml) -> None:
    fake.gpm_returns = (
        pynvml.NVML_SUCCESS,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    )
    backend = started()
    backend.sample(0)
    s = backend.sample(0)
    assert s.method == "gpm" and s.sm == pytest.approx(0.99) and s.dram is None
    assert s.tensor is None


def test_gpm_reads_tensor_activity_and_rates_have_none(fake: FakeNvml) -> None:
    fake.gpm_values[0] = (96.0, 17.0, 93.0)  # bf16 matmul 8192^3 on an H200
    backend = started()
    assert backend.sample(0).tensor is None  # the first poll: utilisation rates, no tensor
    s = backend.sample(0)
    assert (s.sm, s.dram, s.tensor) == pytest.approx((0.96, 0.17, 0.93))


def test_gpm_not_supported_mid_run_falls_back_for_good(fake: FakeNvml) -> None:
    backend = started()
    backend.sample(0)
    fake.errors["nvmlGpmMetricsGet"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    s = backend.sample(0)
    assert s.method == "utilization_rates" and s.sm == pytest.approx(0.97)
    del fake.errors["nvmlGpmMetricsGet"]
    assert backend.sample(0).method == "utilization_rates"


def test_failing_field_is_none_and_unsupported_logged_once(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.errors["nvmlDeviceGetPowerUsage"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    fake.errors["nvmlDeviceGetClockInfo"] = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    backend = started()
    with caplog.at_level(logging.INFO, logger="hang_watchdog.sources.gpu.nvml"):
        samples = [backend.sample(0) for _ in range(3)]
    assert all(s.power_w is None and s.sm_clock_mhz is None for s in samples)
    assert all(s.cc == "10.3" and s.sm is not None for s in samples)
    assert fake.calls["nvmlDeviceGetClockInfo"] == 1  # remembered as unsupported
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3  # a failure is retried next poll
    clock_logs = [r for r in caplog.records if "nvmlDeviceGetClockInfo" in r.getMessage()]
    power_logs = [r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]
    assert len(clock_logs) == 1 and len(power_logs) == 1


def test_power_limit_falls_back_to_the_management_limit(fake: FakeNvml) -> None:
    fake.errors["nvmlDeviceGetEnforcedPowerLimit"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = started()
    assert backend.sample(0).power_limit_w == 1200.0
    fake.errors["nvmlDeviceGetPowerManagementLimit"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    s = backend.sample(1)
    assert s.power_limit_w is None and s.power_w == 650.5  # the draw is still read


def test_max_clock_failure_is_retried_until_read(fake: FakeNvml) -> None:
    fake.errors["nvmlDeviceGetMaxClockInfo"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    backend = started()
    assert backend.sample(0).sm_clock_max_mhz is None
    del fake.errors["nvmlDeviceGetMaxClockInfo"]
    assert backend.sample(0).sm_clock_max_mhz == 2032.0
    backend.sample(0)
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2


def test_lost_gpu_raises_gpu_error(fake: FakeNvml) -> None:
    backend = started()
    fake.errors["nvmlDeviceGetHandleByIndex"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuError, match="GPU 1 unreachable"):
        backend.sample(1)
    del fake.errors["nvmlDeviceGetHandleByIndex"]
    fake.errors["nvmlDeviceGetUUID"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuError, match="GPU 0 is lost"):
        backend.sample(0)


def test_lost_gpu_becomes_placeholder_through_gpu_source(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pynvml.nvmlDeviceGetPowerUsage

    def power(h: int) -> int:
        if h == 1:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return real(h)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power)
    source = GpuSource(NvmlBackend(), deadline_s=30.0)
    try:
        got = source.poll()
    finally:
        source.close()
    assert source.health.up
    assert got[0].power_w == 650.5 and got[0].uuid is not None
    assert got[1].index == 1 and got[1].uuid is None and got[1].sm is None


def test_missing_library_is_a_clear_gpu_error(fake: FakeNvml) -> None:
    fake.errors["nvmlInit"] = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(GpuError) as err:
        NvmlBackend().init()
    assert "libnvidia-ml.so not found" in str(err.value)
    assert "keeps running on its other signals" in str(err.value)


def test_other_init_failure_names_the_nvml_error(fake: FakeNvml) -> None:
    fake.errors["nvmlInit"] = nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(GpuError, match="NVML init failed: Driver Not Loaded"):
        NvmlBackend().init()


def test_missing_python_module_is_a_clear_gpu_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(GpuError, match="pip install nvidia-ml-py"):
        NvmlBackend().init()


def test_use_before_init_is_an_error() -> None:
    with pytest.raises(GpuError, match="before init"):
        NvmlBackend().sample(0)


def test_driver_version_and_count(fake: FakeNvml) -> None:
    backend = started()
    assert backend.driver_version() == "580.65.06"
    assert backend.device_count() == 2
    fake.errors["nvmlDeviceGetCount"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(GpuError, match="could not count"):
        backend.device_count()


def test_fabric_reads_v3_struct(fake: FakeNvml) -> None:
    backend = started()
    info = backend.fabric(0)
    assert fake.fabric_versions == [pynvml.nvmlGpuFabricInfo_v3]
    assert info is not None
    assert (info.state, info.status, info.health_summary) == (3, 0, 1)
    assert info.health_mask == 1 << 14
    fake.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    info = backend.fabric(0)
    assert info is not None and info.state == 2 and info.status is None


def test_fabric_unsupported_is_none(fake: FakeNvml) -> None:
    backend = started()
    fake.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    assert backend.fabric(0) is None
    fake.errors["nvmlDeviceGetGpuFabricInfoV"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.fabric(1) is None


def test_fabric_struct_is_byref_ctypes(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", lambda h, ref: seen.append(ref))
    started().fabric(0)
    assert type(seen[0]) is type(ctypes.byref(ctypes.c_int()))  # a pointer, not a struct copy


@pytest.mark.gpu
def test_live_gpu() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML cannot initialise here: {exc}")
    pynvml.nvmlShutdown()
    backend = started()
    try:
        count = backend.device_count()
        assert count >= 1
        assert backend.driver_version()
        first = backend.sample(0)
        second = backend.sample(0)
        backend.fabric(0)  # must not raise, whatever the fabric
    finally:
        backend.shutdown()
    assert first.uuid and first.uuid.startswith("GPU-") and first.cc
    assert second.method in ("gpm", "utilization_rates")
    assert second.sm is not None and 0.0 <= second.sm <= 1.0
