"""GPU samples from a dcgm-exporter `/metrics` page, for hosts where DCGM already owns the GPUs.

dcgm-exporter (https://github.com/NVIDIA/dcgm-exporter, README "Quickstart") serves Prometheus
text on :9400/metrics with one series per GPU and the labels `gpu` (index), `UUID`, `device`
(e.g. "nvidia0"), `modelName`, `Hostname`, and, with Kubernetes pod mapping, `container`,
`namespace`, `pod`. Its field list is configurable (etc/default-counters.csv,
etc/dcp-metrics-included.csv), so every figure here is optional and may be None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from watchdog.core.model import GpuSample
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, scrape_deadline

# Profiling (DCP) fields are ratios 0-1; DEV utilisation fields are percent 0-100
# (NVIDIA/dcgm-exporter etc/default-counters.csv, etc/dcp-metrics-included.csv).
SM_PROF = "DCGM_FI_PROF_SM_ACTIVE"
DRAM_PROF = "DCGM_FI_PROF_DRAM_ACTIVE"
SM_DEV = "DCGM_FI_DEV_GPU_UTIL"
DRAM_DEV = "DCGM_FI_DEV_MEM_COPY_UTIL"
POWER = "DCGM_FI_DEV_POWER_USAGE"  # W
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
TENSOR_PROF = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"  # ratio; in etc/dcp-metrics-included.csv
WANTED = frozenset({SM_PROF, DRAM_PROF, SM_DEV, DRAM_DEV, POWER, SM_CLOCK, TENSOR_PROF})

# DCGM reports "no value" as large sentinels (DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK
# 0x7ffffffffffffff0, DCGM_FP64_BLANK 2**47, from dcgm_structs.h; UNVERIFIED against a
# stored copy, but the exporter README shows MEMORY_TEMP = 9223372036854775794). No real
# figure we read (percent, ratio, W, MHz) comes near the smallest of them.
BLANK_AT_LEAST = float(0x7FFFFFF0)


def parse_dcgm(text: str) -> list[GpuSample]:
    """Samples, one per `gpu` label, sorted by index. Raises ValueError on malformed text."""
    try:
        return _parse(text)
    except (IndexError, KeyError, TypeError, OverflowError) as exc:
        # prometheus_client's parser raises IndexError on `# TYPE \xa0 0` (a lone non-ASCII
        # space where the metric name belongs): still just malformed text
        raise ValueError(f"malformed exporter text ({type(exc).__name__}: {exc})") from exc


def _parse(text: str) -> list[GpuSample]:
    values: dict[int, dict[str, float]] = {}
    labels: dict[int, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in WANTED:
            continue
        for series in family.samples:
            index = _index(series.labels.get("gpu"))
            if index is None:
                continue
            # MIG: one series per GPU instance (GPU_I_ID label); the whole-GPU series wins.
            seen = values.setdefault(index, {})
            if series.name in seen and "GPU_I_ID" in series.labels:
                continue
            seen[series.name] = series.value
            labels.setdefault(index, dict(series.labels))
    return [_sample(i, values[i], labels[i]) for i in sorted(values)]


def _sample(index: int, values: dict[str, float], labels: dict[str, str]) -> GpuSample:
    """One GPU's figures; PROF ratios preferred, DEV percentages as the fallback."""
    sm_prof = _clean(values.get(SM_PROF))
    dram_prof = _clean(values.get(DRAM_PROF))
    sm = sm_prof if sm_prof is not None else _percent(values.get(SM_DEV))
    dram = dram_prof if dram_prof is not None else _percent(values.get(DRAM_DEV))
    return GpuSample(
        index=index,
        uuid=labels.get("UUID") or None,
        name=labels.get("modelName") or None,
        sm=_unit(sm),
        dram=_unit(dram),
        power_w=_clean(values.get(POWER)),
        sm_clock_mhz=_clean(values.get(SM_CLOCK)),
        tensor=_unit(_clean(values.get(TENSOR_PROF))),
        method="dcgm_prof" if sm_prof is not None else "dcgm_dev",
    )


def _index(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _clean(value: float | None) -> float | None:
    if value is None or math.isnan(value) or value >= BLANK_AT_LEAST:
        return None
    return float(value)


def _percent(value: float | None) -> float | None:
    cleaned = _clean(value)
    return cleaned / 100.0 if cleaned is not None else None


def _unit(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


class DcgmSource:
    """Scrapes dcgm-exporter each poll; any failure marks the source down and returns ()."""

    part = "gpus"

    def __init__(
        self,
        url: str,
        client: httpx.Client | None = None,
        timeout_s: float = 2.0,
        *,
        name: str = "gpu",
    ) -> None:
        self.name = name
        self.health = SourceHealth(name)
        self.url = url
        self._timeout_s = timeout_s
        self._client = client
        self._own_client = client is None

    @property
    def deadline_s(self) -> float:
        """The longest a poll waits on the exporter."""
        return self._timeout_s

    def deadline(self, tick_s: float) -> Deadline:
        return scrape_deadline(self._timeout_s, 1)

    def poll(self, tick: SourceTick | None = None) -> tuple[GpuSample, ...]:
        """Every GPU dcgm-exporter reports now; () while down."""
        if self._client is None:
            # trust_env=False: a pod's HTTP(S)_PROXY is for egress, not for the node-local
            # exporter; pass your own client to change that.
            self._client = httpx.Client(timeout=self._timeout_s, trust_env=False)
        try:
            response = self._client.get(self.url, timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            self.health.down(f"dcgm-exporter at {self.url} did not answer: {_why(exc)}")
            return ()
        if response.status_code != 200:
            self.health.down(f"dcgm-exporter at {self.url} answered HTTP {response.status_code}")
            return ()
        try:
            samples = parse_dcgm(response.text)
        except ValueError as exc:
            self.health.down(f"dcgm-exporter at {self.url} sent unparsable metrics: {exc}")
            return ()
        if not samples:
            self.health.down(f"no DCGM GPU metrics at {self.url} (checked {_names(WANTED)})")
            return ()
        self.health.ok()
        return tuple(samples)

    def close(self) -> None:
        """Close the HTTP client if this source made it."""
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None


def _why(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return str(exc) or type(exc).__name__


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))
