"""Configuration checks that span keys or need more than a type and a bound, and the runtime
checks that need the built daemon (its worst loop) or the service manager's settings.

Each failure is a `ConfigError` naming the key, the value and what to set instead.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from watchdog.configkeys import Config, ConfigError


def cross_check(cfg: Config, origin: str) -> None:
    """Checks that span keys, or need more than a type and a bound."""
    ratios = (
        "gpu_spin_sm",
        "gpu_spin_dram",
        "gpu_busy_dram",
        "gpu_spin_power_ratio",
        "gpu_spin_clock_ratio",
        "gpu_spin_power_max_ratio",
        "gpu_spin_tensor",
        "remediate_min_confidence",
    )
    for key in ratios:
        if getattr(cfg, key) > 1:
            raise ConfigError(
                f"{origin}: key {key!r}: is a ratio between 0 and 1, got {getattr(cfg, key)}"
            )
    _check_gpu_source(cfg.gpu_source, origin)
    _check_target(cfg, origin)
    if cfg.suspect_after_s > cfg.stall_after_s:
        raise ConfigError(
            f"{origin}: key 'suspect_after_s': must not exceed stall_after_s ({cfg.stall_after_s})"
        )
    _check_window(cfg, origin)
    _check_labels(cfg, origin)
    _check_ras_addr(cfg, origin)
    _check_server_url(cfg.server_url, origin)
    _check_cdn_hosts(cfg.cdn_hosts, origin)


LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def _check_labels(cfg: Config, origin: str) -> None:
    """`deployment` and `node` become label values that rules group by: short, printable."""
    for key in ("deployment", "node"):
        value = getattr(cfg, key)
        if value and not LABEL_RE.match(value):
            raise ConfigError(
                f"{origin}: key {key!r}: {value!r} is not a usable label value; use up to 128 "
                "letters, digits and . _ : / - (starting with a letter or digit)"
            )


def _check_ras_addr(cfg: Config, origin: str) -> None:
    if not cfg.nccl_ras_addr:
        return
    host, sep, port = cfg.nccl_ras_addr.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(
            f"{origin}: key 'nccl_ras_addr': {cfg.nccl_ras_addr!r} is not HOST:PORT; use the "
            "job's NCCL_RAS_ADDR (default localhost:28028)"
        )


# Thresholds measured over the window: a window no longer than one of them never sees it pass.
WINDOWED = ("stall_after_s", "suspect_after_s", "blind_stall_after_s", "gpu_spin_for_s")


def _check_window(cfg: Config, origin: str) -> None:
    short = [k for k in WINDOWED if cfg.window_s <= getattr(cfg, k)]
    if short:
        longest = max(getattr(cfg, k) for k in short)
        names = ", ".join(f"{k} ({getattr(cfg, k):g} s)" for k in short)
        raise ConfigError(
            f"{origin}: key 'window_s': {cfg.window_s:g} s is not longer than {names}, so the "
            f"window never holds a stall that long; set window_s above {longest:g} (or lower "
            f"{', '.join(short)})"
        )


PID_MAX = 1 << 22  # the kernel's ceiling for /proc/sys/kernel/pid_max


def _check_target(cfg: Config, origin: str) -> None:
    if cfg.pid is not None and not 0 < cfg.pid <= PID_MAX:
        raise ConfigError(f"{origin}: key 'pid': {cfg.pid} is not a process id (1-{PID_MAX})")
    if cfg.match is not None:
        try:
            re.compile(cfg.match)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ConfigError(
                f"{origin}: key 'match': {cfg.match[:200]!r} is not a valid regular expression: "
                f"{exc}"
            ) from exc
    if cfg.command:
        given = [k for k in ("pid", "match", "systemd_unit") if getattr(cfg, k)]
        if given:
            raise ConfigError(
                f"{origin}: key {given[0]!r}: supervise mode (`run -- COMMAND`) watches the "
                f"command it starts; drop {given[0]} or the `-- COMMAND`"
            )


def _check_gpu_source(spec: str, origin: str) -> None:
    where = f"{origin}: key 'gpu_source'"
    if spec in ("nvml", "none"):
        return
    if spec.startswith("file:"):
        if not spec[5:].strip():
            raise ConfigError(f"{where}: file: needs a path, e.g. file:/run/gpu.jsonl")
        return
    if spec.startswith("dcgm:"):
        url = spec[5:]
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"{where}: {url!r} is not a DCGM exporter URL; give dcgm:http://HOST:PORT/metrics"
            )
        return
    raise ConfigError(f"{where}: must be nvml, none, dcgm:URL or file:PATH, got {spec!r}")


def _check_server_url(url: str | None, origin: str) -> None:
    if not url:
        return
    where = f"{origin}: key 'server_url': {url!r}"
    hint = "give the server's base URL, e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ConfigError(f"{where} is not a URL ({exc}); {hint}") from exc
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{where} is not an http:// or https:// URL; {hint}")
    host = parts.hostname
    if not host or any(c.isspace() for c in host):
        raise ConfigError(f"{where} has no valid host; {hint}")
    try:
        port = parts.port
    except ValueError:  # urllib: not a number, or outside 0-65535
        port = 0
    if port == 0:
        raise ConfigError(f"{where} has an invalid port, need a number in 1-65535; {hint}")


def _check_cdn_hosts(hosts: list[str], origin: str) -> None:
    from watchdog.sources.conns import parse_cdn_host

    for host in hosts:
        try:
            parse_cdn_host(host)
        except ValueError as exc:
            raise ConfigError(f"{origin}: key 'cdn_hosts': {exc}") from exc


def check_stale_after(cfg: Config, worst_tick_s: float) -> None:
    """/healthz turns 503 after `metrics_stale_s` without a loop: it must outlast the worst one."""
    if cfg.metrics_stale_s <= worst_tick_s:
        raise ConfigError(
            f"key 'metrics_stale_s': {cfg.metrics_stale_s:g} s, but one loop can take "
            f"{worst_tick_s:g} s when probes hang; /healthz would flap to 503 and a liveness "
            f"probe would kill a healthy watchdog. Set it above {worst_tick_s:g}"
        )


def check_watchdog_interval(cfg: Config, worst_tick_s: float, interval_s: float) -> None:
    """systemd's watchdog wants a ping every `interval_s` (half of WatchdogSec=), one per loop."""
    if worst_tick_s >= interval_s:
        # A loop that can outlast half of WatchdogSec= gets the watchdog killed and restarted
        # over and over (NVSentinel #1748 saw 49 liveness kills).
        raise ConfigError(
            f"key 'tick_s': one loop can take {worst_tick_s:g} s (tick_s {cfg.tick_s:g} plus "
            f"the probes' deadlines when they hang), not less than half of systemd's "
            f"WatchdogSec= ({interval_s:g} s); lower tick_s or raise WatchdogSec= to at least "
            f"{2 * worst_tick_s + 1:.0f}s in the unit"
        )
