"""The one table of exported metrics; the exporter, tests and README are checked against it."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "hang_watchdog_"

# Results of one stack capture (the daemon passes one of these to MetricsSink.stack_capture).
STACK_RESULTS: tuple[str, ...] = (
    "ok",
    "partial",
    "timeout",
    "permission_denied",
    "not_found",
    "error",
)

# Outcomes of one remediation: "planned" is what --dry-run records instead of acting.
REMEDIATION_OUTCOMES: tuple[str, ...] = (
    "planned",
    "recovered",
    "not_recovered",
    "failed",
    "skipped",
)

# How a hang episode ended (daemon/episodes.py): the server moved on by itself (never restarted
# during the episode), or it came back under a new process (a remediation, systemd, an operator).
EPISODE_OUTCOMES: tuple[str, ...] = ("recovered_on_its_own", "restarted")

# Why the log source left lines unparsed (LogSource.skipped): a stream reader's queue overflowed,
# a followed file ran too far ahead and was jumped, or a tick's parse budget ran out.
LOG_SKIP_REASONS: tuple[str, ...] = ("dropped", "lag", "budget")

# Source names exported a second time under their old name, for one release: the server's HTTP
# source was `vllm` while the watchdog knew one engine (docs/metrics-and-alerts.md).
SOURCE_ALIASES: dict[str, str] = {"server": "vllm"}

# Upper bounds of the loop-duration histogram, seconds. A tick is ~1 s; py-spy dumps can take 10+.
LOOP_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: its full exposed name, Prometheus type, label names and meaning."""

    name: str
    type: str  # "gauge", "counter" or "histogram"
    labels: tuple[str, ...]
    help: str


FLEET = ("deployment", "node", "engine")
RANK = (*FLEET, "rank", "role")

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "hang_watchdog_gpu_sm_utilization_ratio",
        "gauge",
        ("gpu", "uuid"),
        "Fraction of SMs busy (0-1), per GPU.",
    ),
    MetricSpec(
        "hang_watchdog_gpu_dram_bandwidth_utilization_ratio",
        "gauge",
        ("gpu", "uuid"),
        "Fraction of peak DRAM bandwidth in use (0-1), per GPU; near 0 with SM high is a spin.",
    ),
    MetricSpec(
        "hang_watchdog_gpu_power_watts",
        "gauge",
        ("gpu", "uuid"),
        "Board power draw in watts, per GPU.",
    ),
    MetricSpec(
        "hang_watchdog_state",
        "gauge",
        ("state",),
        "1 for the server's current state, 0 for every other state.",
    ),
    MetricSpec(
        "hang_watchdog_hang",
        "gauge",
        ("signature",),
        "1 while a hang with this signature holds; every known signature is pre-set to 0.",
    ),
    MetricSpec(
        "hang_watchdog_hang_confidence_ratio",
        "gauge",
        ("signature",),
        "Confidence (0-1) of the current verdict for this signature; 0 when it does not hold.",
    ),
    MetricSpec(
        "hang_watchdog_incidents_total",
        "counter",
        ("signature",),
        "Incidents opened (one per hang episode), by signature.",
    ),
    MetricSpec(
        "hang_watchdog_episodes_total",
        "counter",
        ("outcome",),
        "Episodes that reached stalled or hung and ended, by outcome: recovered_on_its_own "
        "(the server moved on by itself) or restarted.",
    ),
    MetricSpec(
        "hang_watchdog_seconds_since_progress",
        "gauge",
        (),
        "Seconds since the server last made progress; absent until progress is known.",
    ),
    MetricSpec(
        "hang_watchdog_progress_ratio",
        "gauge",
        (),
        "Fraction (0-1) of the current progress bar (loading, capture); absent when unknown.",
    ),
    MetricSpec(
        "hang_watchdog_cdn_connections",
        "gauge",
        ("host",),
        "Open TCP sockets from the server's process tree to each kernel-CDN host.",
    ),
    MetricSpec(
        "hang_watchdog_source_up",
        "gauge",
        ("source",),
        "1 when the source (gpu, logs, server, ...) answered in the last loop, 0 when it is "
        "down; `server` is also exported as `vllm`, its old name, for one release.",
    ),
    MetricSpec(
        "hang_watchdog_stack_captures_total",
        "counter",
        ("result",),
        "py-spy stack captures, by result.",
    ),
    MetricSpec(
        "hang_watchdog_log_lines_skipped_total",
        "counter",
        ("reason",),
        "Log lines not parsed because the log came faster than it was read, by reason.",
    ),
    MetricSpec(
        "hang_watchdog_loop_duration_seconds",
        "histogram",
        (),
        "Wall time of one watchdog loop iteration: sources, classification and every hook.",
    ),
    MetricSpec(
        "hang_watchdog_loop_lag_seconds",
        "gauge",
        (),
        "How late the last loop iteration started against its tick schedule: a watchdog "
        "starved of CPU on a busy host (give it CPU priority) or a slow previous iteration.",
    ),
    MetricSpec(
        "hang_watchdog_last_loop_timestamp_seconds",
        "gauge",
        (),
        "Unix time the last loop completed (start time before the first); old = watchdog stuck.",
    ),
    MetricSpec(
        "hang_watchdog_build_info",
        "gauge",
        ("version",),
        "Always 1; the label carries the watchdog version.",
    ),
    MetricSpec(
        "hang_watchdog_remediations_total",
        "counter",
        ("action", "outcome"),
        "Remediations by action and outcome (planned = dry run).",
    ),
    MetricSpec(
        "hang_watchdog_fallback_active",
        "gauge",
        ("fallback",),
        "1 while this fallback is applied to the server (until `fallback clear`).",
    ),
    MetricSpec(
        "hang_watchdog_remediation_exhausted",
        "gauge",
        (),
        "1 when the restart cap was hit; the watchdog no longer acts until an operator clears it.",
    ),
    MetricSpec(
        "hang_watchdog_remediation_restarts_total",
        "counter",
        (),
        "Restarts this watchdog started (from 0 at each start; fleet cause mode sums it over a "
        "deployment for max_restarts).",
    ),
    MetricSpec(
        "hang_watchdog_remediation_last_restart_timestamp_seconds",
        "gauge",
        (),
        "Unix time of the last restart this watchdog recorded (kept across its restarts); "
        "absent before the first. Fleet cause mode reads it for a deployment-wide cooldown.",
    ),
    MetricSpec(
        "hang_watchdog_remediation_plan_info",
        "gauge",
        ("signature", "fallback", "mode", "args", "env"),
        "Always 1: the last remediation plan (mode dry_run or acted), with the exact arguments "
        "and environment it adds.",
    ),
    MetricSpec(
        "hang_watchdog_deployment_info",
        "gauge",
        FLEET,
        "Always 1: the deployment (config key `deployment`), node and engine this watchdog "
        "watches; fleet rules join on it.",
    ),
    MetricSpec(
        "hang_watchdog_rank_last_progress_timestamp_seconds",
        "gauge",
        RANK,
        "Unix time each rank of the server last made progress (now while idle); the lowest "
        "across a deployment is the first rank to stop.",
    ),
    MetricSpec(
        "hang_watchdog_rank_waiting",
        "gauge",
        RANK,
        "1 while this rank waits on another (in a collective) during a hang, else 0.",
    ),
    MetricSpec(
        "hang_watchdog_nccl_ras_communicators",
        "gauge",
        (),
        "NCCL communicators in the last RAS report (absent while RAS is not answering).",
    ),
    MetricSpec(
        "hang_watchdog_nccl_ras_ranks",
        "gauge",
        ("state",),
        "Ranks of the last NCCL RAS report per state: unresponsive, dead, behind (fewer "
        "collectives than their peers), async_error (absent while RAS is not answering).",
    ),
    MetricSpec(
        "hang_watchdog_nccl_ras_rank_collectives_behind",
        "gauge",
        ("rank",),
        "Collectives an NCCL rank completed fewer than its communicator's peers (last RAS "
        "report); only ranks behind, at most 64.",
    ),
    MetricSpec(
        "hang_watchdog_rank_cause_priority",
        "gauge",
        (*RANK, "signature"),
        "Present only for the rank the verdict names as the cause of a hang: the signature's "
        "priority (higher wins across nodes).",
    ),
)


def spec(name: str) -> MetricSpec:
    """The spec of one metric by its full name; KeyError names the unknown metric."""
    for item in METRICS:
        if item.name == name:
            return item
    raise KeyError(f"{name} is not in watchdog.outputs.metrics_table.METRICS")
