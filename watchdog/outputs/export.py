"""Prometheus exporter: a sink the daemon updates each loop, read fresh at every scrape.

The sink works as a custom collector does in prometheus/client_python (its ProcessCollector):
each scrape builds new metric families from the latest loop, so a GPU or CDN host that vanished
leaves no stale series. The families and their text are the daemon's own
(outputs/exposition.py): prometheus_client is not imported, nor its HTTP stack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from watchdog.core.model import STATES, Observation, Verdict
from watchdog.outputs.exposition import Family
from watchdog.outputs.fleet import FleetLabels, fleet_series
from watchdog.outputs.metrics_table import (
    EPISODE_OUTCOMES,
    LOG_SKIP_REASONS,
    LOOP_BUCKETS,
    METRICS,
    REMEDIATION_OUTCOMES,
    SOURCE_ALIASES,
    STACK_RESULTS,
    MetricSpec,
)

Series = list[tuple[tuple[str, ...], float]]


def _family(spec: MetricSpec) -> Family:
    """An empty family for one row of the table."""
    return Family.of(spec.name, spec.type, spec.help, spec.labels)


def _optional(value: float | None) -> Series:
    """A label-less series, or none at all when the value is unknown."""
    return [] if value is None else [((), float(value))]


def _loop_series(obs: Observation, verdict: Verdict, wall: float) -> dict[str, Series]:
    """The series that one loop replaces wholesale; a field nobody could read is left out."""
    out: dict[str, Series] = {n: [] for n in (_SM, _DRAM, _POWER, "hang_watchdog_cdn_connections")}
    for g in obs.gpus:
        key = (str(g.index), g.uuid or "")
        for name, value in ((_SM, g.sm), (_DRAM, g.dram), (_POWER, g.power_w)):
            if value is not None:
                out[name].append((key, float(value)))
    hosts: dict[str, float] = {}
    for conn in obs.conns:
        hosts[conn.host] = hosts.get(conn.host, 0.0) + 1.0
    out["hang_watchdog_cdn_connections"] = [((h,), n) for h, n in sorted(hosts.items())]
    out["hang_watchdog_state"] = [((s,), float(s == verdict.state)) for s in STATES]
    out["hang_watchdog_seconds_since_progress"] = _optional(verdict.seconds_since_progress)
    out["hang_watchdog_progress_ratio"] = _optional(verdict.progress_ratio)
    out["hang_watchdog_source_up"] = _source_up(obs.sources)
    out["hang_watchdog_last_loop_timestamp_seconds"] = [((), wall)]
    out.update(_ras_series(obs.nccl_ras))
    return out


def _ras_series(ras: Any) -> dict[str, Series]:
    """NCCL RAS findings (sources/rasreport.py findings()), only from a report that answered."""
    if not isinstance(ras, dict) or not ras.get("up"):
        return {}
    counts = found if isinstance(found := ras.get("counts"), dict) else {}
    behind = [b for b in ras.get("behind") or () if isinstance(b, list) and len(b) == 2]
    return {
        "hang_watchdog_nccl_ras_communicators": [((), float(ras.get("communicators") or 0))],
        "hang_watchdog_nccl_ras_ranks": [((k,), float(v)) for k, v in sorted(counts.items())],
        "hang_watchdog_nccl_ras_rank_collectives_behind": [
            ((str(int(rank)),), float(n)) for rank, n in behind[:64]
        ],
    }


def _source_up(sources: dict[str, bool]) -> Series:
    """One series per source, and the old name of a renamed one beside its new name."""
    up = dict(sources)
    for new, old in SOURCE_ALIASES.items():
        if new in up:
            up.setdefault(old, up[new])
    return [((k,), float(v)) for k, v in sorted(up.items())]


_SM = "hang_watchdog_gpu_sm_utilization_ratio"
_DRAM = "hang_watchdog_gpu_dram_bandwidth_utilization_ratio"
_POWER = "hang_watchdog_gpu_power_watts"


class MetricsSink:
    """The exported series, updated from each loop iteration and read by every scrape."""

    def __init__(
        self,
        signatures: Sequence[str],
        *,
        version: str,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        fleet: FleetLabels | None = None,
    ) -> None:
        if stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be > 0 seconds, got {stale_after_s!r}")
        self._version = version
        self._fleet = fleet if fleet is not None else FleetLabels.resolve("", "")
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._incidents: dict[str, float] = {s: 0.0 for s in signatures}
        self._episodes: dict[str, float] = {o: 0.0 for o in EPISODE_OUTCOMES}
        # hang_watchdog_hang covers signatures only; incidents also count "stalled" episodes.
        self._signatures: list[str] = list(signatures)
        self._hang: tuple[str | None, float] = (None, 0.0)  # (signature, confidence)
        self._captures: dict[str, float] = {r: 0.0 for r in STACK_RESULTS}
        self._log_skips: dict[str, float] = {r: 0.0 for r in LOG_SKIP_REASONS}
        self._remediations: dict[tuple[str, str], float] = {}
        self._fallbacks: dict[str, bool] = {}
        self._exhausted = False
        self._restarts = 0.0
        self._last_restart: float | None = None
        self._plan: tuple[str, ...] | None = None  # labels of hang_watchdog_remediation_plan_info
        self._buckets = [0.0] * len(LOOP_BUCKETS)
        self._loop_count = 0
        self._loop_sum = 0.0
        # Before the first loop, staleness counts from construction, and the exported loop
        # timestamp is the start time: HangWatchdogStale also fires if no loop ever completes.
        self._last_loop_t = clock()
        self._series: dict[str, Series] = {
            "hang_watchdog_state": [((s,), 0.0) for s in STATES],
            "hang_watchdog_last_loop_timestamp_seconds": [((), wall())],
        }

    def observe(
        self,
        obs: Observation,
        verdict: Verdict,
        loop_seconds: float | None,
        lag_seconds: float | None = None,
    ) -> None:
        """Record one completed loop iteration: replaces every per-loop series."""
        series = _loop_series(obs, verdict, self._wall())
        series["hang_watchdog_loop_lag_seconds"] = _optional(lag_seconds)
        series.update(fleet_series(obs, verdict, self._fleet))
        signature = verdict.signature if verdict.is_hang else None
        with self._lock:
            if signature is not None:
                self._incidents.setdefault(signature, 0.0)  # a signature the list lacked
                if signature not in self._signatures:
                    self._signatures.append(signature)
            self._hang = (signature, float(verdict.confidence))
            self._series = series
            self._last_loop_t = self._clock()
            if loop_seconds is not None:
                self._loop_count += 1
                self._loop_sum += loop_seconds
                for i, bound in enumerate(LOOP_BUCKETS):
                    if loop_seconds <= bound:
                        self._buckets[i] += 1

    def incident(self, signature: str) -> None:
        """Count one newly opened incident for a signature."""
        with self._lock:
            self._incidents[signature] = self._incidents.get(signature, 0.0) + 1

    def episode(self, outcome: str) -> None:
        """Count one ended episode by outcome (one of metrics_table.EPISODE_OUTCOMES)."""
        if outcome not in EPISODE_OUTCOMES:
            raise ValueError(f"episode outcome {outcome!r} is not one of {EPISODE_OUTCOMES}")
        with self._lock:
            self._episodes[outcome] += 1

    def stack_capture(self, result: str) -> None:
        """Count one stack capture by result (one of metrics_table.STACK_RESULTS)."""
        if result not in STACK_RESULTS:
            raise ValueError(f"stack capture result {result!r} is not one of {STACK_RESULTS}")
        with self._lock:
            self._captures[result] += 1

    def log_lines_skipped(self, reason: str, count: int) -> None:
        """Count log lines the log source left unparsed (outputs/metrics_hook.py MetricsHook)."""
        if reason not in LOG_SKIP_REASONS:
            raise ValueError(f"log skip reason {reason!r} is not one of {LOG_SKIP_REASONS}")
        with self._lock:
            self._log_skips[reason] += count

    def remediation(self, action: str, outcome: str) -> None:
        """Count one remediation by action and outcome (metrics_table.REMEDIATION_OUTCOMES)."""
        if outcome not in REMEDIATION_OUTCOMES:
            raise ValueError(
                f"remediation outcome {outcome!r} is not one of {REMEDIATION_OUTCOMES}"
            )
        with self._lock:
            # Every outcome of an action appears (at 0) with its first remediation, so a later
            # failure is an increase() from 0 rather than a brand-new series.
            for each in REMEDIATION_OUTCOMES:
                self._remediations.setdefault((action, each), 0.0)
            self._remediations[(action, outcome)] += 1

    def set_fallback_active(self, fallback: str, active: bool) -> None:
        """Export whether a fallback is currently applied to the server."""
        with self._lock:
            self._fallbacks[fallback] = active

    def set_plan(self, plan: dict[str, Any], *, dry_run: bool) -> None:
        """The last plan, as an info series: shadow mode exports exactly what it would do."""
        env = " ".join(f"{k}={v}" for k, v in sorted(plan.get("env", {}).items()))
        labels = (
            str(plan.get("signature", "")),
            str(plan.get("fallback") or "none"),
            "dry_run" if dry_run else "acted",
            " ".join(plan.get("args", [])),
            env,
        )
        with self._lock:
            self._plan = labels

    def set_remediation_exhausted(self, exhausted: bool) -> None:
        """Export whether the restart cap was hit (cleared only by an operator)."""
        with self._lock:
            self._exhausted = exhausted

    def set_restarts(self, last_wall: float | None, started: int = 0) -> None:
        """The last restart's time (from the state) and `started` more restarts begun now."""
        with self._lock:
            self._last_restart = last_wall
            self._restarts += started

    def seconds_since_loop(self) -> float:
        """Seconds since the last completed loop (or since construction, before the first)."""
        with self._lock:
            return self._clock() - self._last_loop_t

    def healthy(self) -> bool:
        """True while a loop completed within stale_after_s."""
        return self.seconds_since_loop() <= self._stale_after_s

    def collect(self) -> list[Family]:
        """Fresh families from the latest loop, in table order (called at every scrape)."""
        with self._lock:
            values = {**self._series, **self._counters()}
            buckets = [(repr(b), c) for b, c in zip(LOOP_BUCKETS, self._buckets, strict=True)]
            buckets.append(("+Inf", float(self._loop_count)))
            loop_sum = self._loop_sum
        out = []
        for spec in METRICS:
            family = _family(spec)
            if spec.type == "histogram":
                family.add_histogram((), buckets, loop_sum)
            for labels, value in values.get(spec.name, []):
                family.add(labels, value)
            out.append(family)
        return out

    def _counters(self) -> dict[str, Series]:
        """The series that outlive a loop: signatures, counters, remediation state."""
        signature, confidence = self._hang
        sigs = list(self._signatures)
        return {
            "hang_watchdog_hang": [((s,), float(s == signature)) for s in sigs],
            "hang_watchdog_hang_confidence_ratio": [
                ((s,), confidence if s == signature else 0.0) for s in sigs
            ],
            "hang_watchdog_incidents_total": [((s,), v) for s, v in self._incidents.items()],
            "hang_watchdog_episodes_total": [((o,), v) for o, v in self._episodes.items()],
            "hang_watchdog_stack_captures_total": [((r,), v) for r, v in self._captures.items()],
            "hang_watchdog_log_lines_skipped_total": [
                ((r,), v) for r, v in self._log_skips.items()
            ],
            "hang_watchdog_build_info": [((self._version,), 1.0)],
            "hang_watchdog_remediations_total": sorted(self._remediations.items()),
            "hang_watchdog_fallback_active": [
                ((f,), float(a)) for f, a in sorted(self._fallbacks.items())
            ],
            "hang_watchdog_remediation_exhausted": [((), float(self._exhausted))],
            "hang_watchdog_remediation_restarts_total": [((), self._restarts)],
            "hang_watchdog_remediation_last_restart_timestamp_seconds": _optional(
                self._last_restart
            ),
            "hang_watchdog_remediation_plan_info": [(self._plan, 1.0)] if self._plan else [],
        }
