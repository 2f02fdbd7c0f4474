"""The configuration's key table: every key with its type, default, help and bounds.

Field names are the TOML keys and, with dashes, the flags (watchdog/commands/flags.py builds
them from this table). Loading and validation live in watchdog/config.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key and what to do."""


def _f(default: Any, help: str, *, lo: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    meta = {"help": help, "lo": lo, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Config:
    """Every setting of the daemon. Field names are the TOML keys; flags use dashes."""

    # target
    pid: int | None = _f(None, "PID of the server to watch")
    match: str | None = _f(None, "regex over command lines that finds the server")
    systemd_unit: str | None = _f(None, "systemd unit whose MainPID is the server")
    command: list[str] = _f([], "supervise this command (set by `run -- COMMAND ...`)")
    # sources
    log_files: list[str] = _f([], "log files to follow ('-' is standard input)")
    journal_unit: str | None = _f(None, "follow this unit's journal (journalctl -f -u UNIT)")
    server_url: str | None = _f(
        None, "base URL of the server's HTTP API (any engine), e.g. http://127.0.0.1:8000"
    )
    gpu_source: str = _f("nvml", "nvml | dcgm:URL | file:PATH | none")
    gpus: list[str] = _f(
        [], "judge only these GPUs (indices or UUIDs; default: the server's own, found itself)"
    )
    cdn_hosts: list[str] = _f([], "extra kernel-CDN hosts HOST[:PORT] to watch sockets to")
    cdn_default: bool = _f(
        True, "also watch FlashInfer's default CDN edge.urm.nvidia.com (resolved in the background)"
    )
    signatures: list[str] = _f([], "operator signature files added to the built-in ones")
    engine: str | None = _f(
        None,
        "force the engine profile (vllm, sglang, trtllm, or one from `engines`); default: "
        "detected from the server's command line and process titles",
    )
    engines: list[str] = _f([], "operator engine profile files added to the shipped ones")
    # timing and thresholds
    tick_s: float = _f(1.0, "seconds between observations", lo=0.05)
    window_s: float = _f(
        600.0,
        "seconds of observations kept; must exceed stall_after_s, blind_stall_after_s and "
        "gpu_spin_for_s",
        lo=10,
    )
    stall_after_s: float = _f(15.0, "no progress with work pending for this long is a stall", lo=1)
    suspect_after_s: float = _f(3.0, "no progress for this long starts stack capture", lo=1)
    proven_after_s: float = _f(
        6.0,
        "no progress for this long is a hang when the cause is proven: stacks unchanged across "
        "two dumps with a matching socket or log line, or the server's own decisive words; "
        "stall_after_s when that is lower",
        lo=1,
    )
    blind_stall_after_s: float = _f(
        120.0,
        "stall threshold when no GPU figures are available and no evidence proves the cause",
        lo=1,
    )
    load_deadline_s: float = _f(
        1800.0,
        "a launcher still waiting for its shard this long after the load last showed progress "
        "is a stall; its periodic waiting line alone is loading, not a loop",
        lo=1,
    )
    socket_hold_s: float = _f(
        30.0,
        "a kernel-CDN socket seen during a stall stays evidence this long after it closed;"
        " FlashInfer waits up to 20 s between download attempts",
        lo=0,
    )
    health_confirm: int = _f(
        3, "/health answers in a row with the same failing status that make it evidence", lo=1
    )
    stats_due_factor: float = _f(
        1.5,
        "a stats line's claim of pending work holds for this many stats intervals, learnt from "
        "the lines' own timestamps, plus stats_due_slack_s",
        lo=1,
    )
    stats_due_slack_s: float = _f(
        2.0, "seconds added to a stats line's claim for the log source's own latency", lo=0
    )
    not_generating_hold_s: float = _f(
        30.0,
        "an engine's logged failed health check (SGLang's 'not generating') is a witness of "
        "pending work for this long",
        lo=0,
    )
    restart_echo_s: float = _f(
        10.0,
        "after a restart, lines before the new server's first startup line are the old "
        "server's and are dropped for at most this long",
        lo=0,
    )
    gpu_spin_sm: float = _f(
        0.9, "SM utilisation ratio at or above which a GPU counts as busy", lo=0
    )
    gpu_spin_dram: float = _f(
        0.05, "DRAM bandwidth ratio at or below which a busy GPU is spinning", lo=0
    )
    gpu_spin_for_s: float = _f(10.0, "how long the spin must last", lo=0)
    gpu_busy_dram: float = _f(
        0.15, "DRAM ratio above which a slow batch is real work, not a hang", lo=0
    )
    gpu_spin_power_ratio: float = _f(
        0.3,
        "without DRAM figures: power draw / enforced power limit at or below which a busy GPU "
        "is spinning",
        lo=0,
    )
    gpu_spin_clock_ratio: float = _f(
        0.5,
        "without DRAM figures: SM clock / its maximum below which low power is a low clock, "
        "not a spin",
        lo=0,
    )
    gpu_spin_power_max_ratio: float = _f(
        0.5,
        "whatever the DRAM figure: power draw / enforced power limit above which a busy GPU is "
        "computing, never spinning; on an H200 spins drew 0.19-0.23 of the limit, matmuls 0.9-0.99",
        lo=0,
    )
    gpu_spin_tensor: float = _f(
        0.1,
        "tensor-core activity ratio above which a busy GPU is computing, never spinning, "
        "where GPM or DCGM reports it",
        lo=0,
    )
    # fleet (docs/fleet.md)
    deployment: str = _f(
        "",
        "name shared by every watchdog of one multi-node deployment; exported as the "
        "`deployment` label that fleet rules group by (empty: a standalone server)",
    )
    node: str = _f("", "node label exported with this server's ranks (default: the host name)")
    fleet_remediation: str = _f(
        "cause",
        "with `deployment` set, which watchdog restarts: `cause`, the one whose verdict names "
        "the cause rank; `leader`, only the one with fleet_leader set",
        choices=("cause", "leader"),
    )
    fleet_leader: bool = _f(False, "in leader mode, this instance restarts the whole deployment")
    fleet_prometheus_url: str = _f(
        "",
        "in cause mode, the Prometheus (http://HOST:PORT) every watchdog of the deployment "
        "reads: the node whose rank it names as the root cause restarts, the others do not",
    )
    fleet_settle_s: float = _f(
        10.0, "in cause mode, how long this node must hold the root cause before it acts", lo=0
    )
    nccl_ras: str = _f(
        "auto",
        "query NCCL's RAS service (read-only): auto (absence said once, retried rarely), on, off",
        choices=("auto", "on", "off"),
    )
    nccl_ras_addr: str = _f(
        "",
        "address of NCCL's RAS service, as NCCL_RAS_ADDR sets it (empty: NCCL's default "
        "localhost:28028, tried quietly; set, it is a source that is down when it does not answer)",
    )
    nccl_ras_interval_s: float = _f(30.0, "seconds between two RAS queries", lo=1)
    nccl_ras_deadline_s: float = _f(10.0, "hard deadline of one RAS query", lo=0.5)
    # outputs
    log_format: str = _f(
        "text", "how log, state and verdict lines on stderr look", choices=("text", "json")
    )
    metrics_addr: str = _f("127.0.0.1:9433", "exporter listen address HOST:PORT, or 'off'")
    metrics_stale_s: float = _f(30.0, "/healthz answers 503 when the loop is older than this", lo=1)
    incident_dir: str | None = _f(
        None, "write incident bundles here (none: no bundles; with remediate: state_dir/incidents)"
    )
    max_incidents: int = _f(50, "incident bundles kept", lo=1)
    max_incident_bytes: int = _f(512 * 1024 * 1024, "bytes of incident bundles kept", lo=1024)
    state_dir: str = _f("/var/lib/hang-watchdog", "remediation counters and the active fallback")
    # stacks
    stacks: bool = _f(True, "take py-spy stacks when the server looks stuck")
    pyspy: str | None = _f(
        None, "py-spy executable (default: beside the watchdog's Python, then on PATH)"
    )
    stack_native: bool = _f(True, "py-spy --native")
    stack_locals: bool = _f(False, "py-spy --locals: off by default, locals can hold user prompts")
    stack_deadline_s: float = _f(10.0, "hard deadline of each py-spy dump", lo=0.5)
    stack_second_after_s: float = _f(
        2.0, "second (Python-only) dump this long after the first; native frames follow", lo=0
    )
    # remediation (off unless enabled)
    remediate: bool = _f(False, "restart the server with the signature's fallback")
    dry_run: bool = _f(False, "log and export the remediation plan without acting")
    restarter: str = _f(
        "supervise", "how to restart", choices=("supervise", "systemd", "kubernetes", "command")
    )
    restart_command: list[str] = _f(
        [], "argv for the command restarter; {signature} {fallback} {args} {env_file} placeholders"
    )
    fallback_file: str | None = _f(None, "EnvironmentFile the systemd/kubernetes restarters write")
    remediate_min_confidence: float = _f(
        0.6, "act only on hang verdicts at least this confident", lo=0
    )
    cooldown_s: float = _f(300.0, "minimum seconds between two restarts", lo=0)
    max_restarts: int = _f(3, "restarts allowed per window before giving up", lo=0)
    restart_window_s: float = _f(3600.0, "the window for max_restarts", lo=1)
    stop_grace_s: float = _f(30.0, "SIGTERM to SIGKILL grace when stopping the server", lo=0)
    recover_within_s: float = _f(600.0, "progress must resume this soon after a restart", lo=1)
    smoke_test: bool = _f(True, "after a restart, send 4 short completions to the OpenAI API")
    fallback_overrides: dict[str, str] = _f(
        {}, "signature id -> fallback name, replacing the shipped choice"
    )
    canary: bool = _f(
        False, "when idle, send one max_tokens=1 request and treat a timeout as a stall"
    )
    canary_idle_s: float = _f(120.0, "idle this long before a canary", lo=1)
    canary_timeout_s: float = _f(30.0, "canary request timeout", lo=1)


KEYS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}

# Old key -> new key, kept working for one release (docs/engines.md "Names kept for one
# release"): the watchdog watched vLLM only when these were named.
ALIASES: dict[str, str] = {"vllm_url": "server_url"}
