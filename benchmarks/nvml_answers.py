"""NVML answers as data: record what a real driver returns, replay it to the real NvmlBackend.

`RecordingNvml` wraps pynvml on a GPU host and keeps, per GPU and per poll, what each call
returned (or which NVML error it raised). `ReplayNvml` is a stand-in for pynvml that gives those
answers back, so `watchdog.sources.gpu.nvml.NvmlBackend` (passed `module=`) runs unchanged on a
machine without a GPU. The JSON format (tests/data/nvml/README.md):

    {"driver": "...", "devices": [{"polls": [{"nvmlDeviceGetPowerUsage": 81234, ...}, ...]}]}

A value `{"error": "NVML_ERROR_NOT_SUPPORTED"}` raises that NVMLError; the string "CHILD" in a
process list stands for the workload's PID, filled in at replay. Polls after the last repeat it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # pure Python: importable without the driver (libnvidia-ml loads at nvmlInit)

# Per-device calls whose answers are recorded (the ones NvmlBackend.sample makes).
DEVICE_CALLS = (
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetUtilizationRates",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)
CHILD = "CHILD"


def _error_name(code: int) -> str:
    names = [n for n in dir(pynvml) if n.startswith("NVML_ERROR_")]
    return next((n for n in names if getattr(pynvml, n) == code), str(code))


def _plain(call: str, value: Any) -> Any:
    """One NVML answer as JSON data, in the shape ReplayNvml gives back."""
    if call == "nvmlDeviceGetComputeRunningProcesses":
        return sorted(int(p.pid) for p in value)
    if call == "nvmlDeviceGetUtilizationRates":
        return {"gpu": int(value.gpu), "memory": int(value.memory)}
    if call == "nvmlGpmQueryDeviceSupport":
        return {"isSupportedDevice": int(value.isSupportedDevice)}
    if call == "nvmlDeviceGetCudaComputeCapability":
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


class RecordingNvml:
    """pynvml, with every per-device answer kept by GPU index and poll."""

    def __init__(self, real: Any = pynvml) -> None:
        self._real = real
        self._current: int | None = None  # the GPU whose poll is being recorded
        self.driver: str | None = None
        self.devices: dict[int, list[dict[str, Any]]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name in DEVICE_CALLS:
            return self._recorded(name, attr)
        return attr

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802 - pynvml's name
        handle = self._real.nvmlDeviceGetHandleByIndex(index)
        self._current = index
        self.devices.setdefault(index, []).append({})  # one poll begins with its handle
        return handle

    def nvmlSystemGetDriverVersion(self) -> Any:  # noqa: N802
        self.driver = _plain("", self._real.nvmlSystemGetDriverVersion())
        return self.driver

    def _recorded(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            polls = self.devices.get(self._current) if self._current is not None else None
            poll = polls[-1] if polls else {}
            try:
                value = fn(*args)
            except self._real.NVMLError as exc:
                poll[name] = {"error": _error_name(exc.value)}
                raise
            if name == "nvmlGpmMetricsGet":
                poll[name] = _gpm_values(args[0])
            elif name == "nvmlGpmSampleGet":
                poll[name] = True  # the sample itself is opaque; that it worked is the answer
            else:
                poll[name] = _plain(name, value)
            return value

        return call

    def answers(self, note: str, child_pid: int | None = None) -> dict[str, Any]:
        """What was recorded, in the fixture format; the workload's PID becomes "CHILD"."""
        devices = [{"polls": [dict(p) for p in self.devices[i]]} for i in sorted(self.devices)]
        key = "nvmlDeviceGetComputeRunningProcesses"
        for poll in (p for d in devices for p in d["polls"]):
            if child_pid is not None and isinstance(poll.get(key), list):
                poll[key] = [CHILD if pid == child_pid else pid for pid in poll[key]]
        return {"note": note, "driver": self.driver, "devices": devices}


# GPM metric id -> its key in a recorded `nvmlGpmMetricsGet` answer.
GPM_KEYS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
}


def _gpm_values(mg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(mg.numMetrics):
        m = mg.metrics[i]
        key = GPM_KEYS.get(m.metricId, str(m.metricId))
        ok = m.nvmlReturn == pynvml.NVML_SUCCESS
        out[key] = float(m.value) if ok else {"error": _error_name(m.nvmlReturn)}
    return out


class ReplayNvml:
    """A pynvml stand-in answering from recorded data; constants and structs are pynvml's."""

    def __init__(self, answers: dict[str, Any], child_pid: int = 0) -> None:
        self._answers = answers
        self._child = child_pid
        self._polls: dict[int, int] = {}  # index -> polls started
        self._gpm_device = 0

    @classmethod
    def load(cls, path: str | Path, child_pid: int = 0) -> ReplayNvml:
        return cls(json.loads(Path(path).read_text()), child_pid)

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)  # NVMLError, NVML_* constants, c_nvml* structs

    # -- lifecycle and system ---------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self._answers["devices"])

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return str(self._answers.get("driver") or "")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._polls[index] = self._polls.get(index, 0) + 1
        return index

    # -- per-device answers -----------------------------------------------------------------
    def _answer(self, h: int, call: str) -> Any:
        polls = self._answers["devices"][h]["polls"]
        poll = polls[min(self._polls.get(h, 1), len(polls)) - 1]
        if call not in poll:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        value = poll[call]
        if isinstance(value, dict) and set(value) == {"error"}:
            raise pynvml.NVMLError(getattr(pynvml, value["error"]))
        return value

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return str(self._answer(h, "nvmlDeviceGetUUID"))

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        return str(self._answer(h, "nvmlDeviceGetName"))

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        major, minor = self._answer(h, "nvmlDeviceGetCudaComputeCapability")
        return int(major), int(minor)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return int(self._answer(h, "nvmlDeviceGetPowerUsage"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:  # noqa: N802
        return int(self._answer(h, "nvmlDeviceGetEnforcedPowerLimit"))

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:  # noqa: N802
        return int(self._answer(h, "nvmlDeviceGetPowerManagementLimit"))

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:  # noqa: N802
        return int(self._answer(h, "nvmlDeviceGetClockInfo"))

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:  # noqa: N802
        return int(self._answer(h, "nvmlDeviceGetMaxClockInfo"))

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:  # noqa: N802
        pids = self._answer(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=self._child if p == CHILD else int(p)) for p in pids]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:  # noqa: N802
        rates = self._answer(h, "nvmlDeviceGetUtilizationRates")
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = int(rates["gpu"]), int(rates["memory"])
        return util

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:  # noqa: N802
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(
            self._answer(h, "nvmlGpmQueryDeviceSupport")["isSupportedDevice"]
        )
        return support

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:  # noqa: N802
        self._gpm_device = h
        polls = self._answers["devices"][h]["polls"]
        if "nvmlGpmSampleGet" in polls[min(self._polls.get(h, 1), len(polls)) - 1]:
            self._answer(h, "nvmlGpmSampleGet")  # raises a recorded error
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        pass

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:  # noqa: N802
        values = self._answer(self._gpm_device, "nvmlGpmMetricsGet")
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            # A metric the recording did not ask for (tensor, before the watchdog read it)
            # answers as the driver does for a metric it lacks.
            got = values.get(GPM_KEYS.get(m.metricId, ""), {"error": "NVML_ERROR_NOT_SUPPORTED"})
            if isinstance(got, dict):
                m.value, m.nvmlReturn = 0.0, getattr(pynvml, got["error"])
            else:
                m.value, m.nvmlReturn = float(got), pynvml.NVML_SUCCESS
        return mg
