"""Configuration: one table of keys with defaults, loaded from TOML and overridden by flags.

Every key has a default; an unknown key or a bad value is a `ConfigError` naming the key
(the CLI turns it into exit code 2).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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
    vllm_url: str | None = _f(None, "base URL of the server's HTTP API, e.g. http://127.0.0.1:8000")
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
    suspect_after_s: float = _f(8.0, "no progress for this long starts stack capture", lo=1)
    blind_stall_after_s: float = _f(
        120.0, "stall threshold when no GPU figures are available", lo=1
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
    stack_second_after_s: float = _f(5.0, "second dump this long after the first", lo=0)
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


MAX_NUMBER = 1e9  # seconds: about 31 years; larger values overflow time_t and deque sizes
KEYS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file, then flag overrides (None means 'not given')."""
    values: dict[str, Any] = _read_toml(Path(path)) if path is not None else {}
    base = build_config(values, origin=str(path) if path else "config")
    flags = {k: v for k, v in (overrides or {}).items() if v is not None and v != [] and k in KEYS}
    if not flags:
        return base
    merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(Config)}
    for key, value in flags.items():  # a bad flag value is blamed on the command line
        merged[key] = _coerce(key, value, "command line")
    return build_config(merged, origin="command line")


def build_config(values: Mapping[str, Any], origin: str = "config") -> Config:
    """Validate a mapping of keys into a Config."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key {unknown[0]!r}; run `hang-watchdog run --help` for the keys"
        )
    cfg = Config()
    for key, value in values.items():
        setattr(cfg, key, _coerce(key, value, origin))
    _cross_check(cfg, origin)
    return cfg


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "save the config file as UTF-8"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError as exc:  # `x = [[[[...` past the parser's depth limit
        raise ConfigError(f"{path}: TOML nested too deeply to be a config file") from exc
    return doc


def _coerce(key: str, value: Any, origin: str) -> Any:
    f = KEYS[key]
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    kind = f.type if isinstance(f.type, str) else str(f.type)
    bad = ConfigError(
        f"{origin}: key {key!r}: expected {kind.replace(' | None', '')}, got {value!r}"
    )
    if value is None and "None" in kind:
        return None
    if "bool" in kind:
        if not isinstance(value, bool):
            raise bad
    elif "int" in kind and "float" not in kind:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        if abs(value) > MAX_NUMBER:  # OverflowError later, in a sleep or a C call
            raise ConfigError(
                f"{origin}: key {key!r}: must be a number up to {MAX_NUMBER:g}, got {value!r}"
            )
    elif "float" in kind:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            value = math.inf
        # NaN compares false with every bound and passes them; a huge value overflows sleeps
        # and buffer sizes later, so both are refused here.
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise ConfigError(
                f"{origin}: key {key!r}: must be a finite number up to {MAX_NUMBER:g}, "
                f"got {value!r}"
            )
    elif "list" in kind:
        if isinstance(value, str) and isinstance(default, list):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad
    elif "dict" in kind:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad
    elif not isinstance(value, str):
        raise bad
    lo, choices = f.metadata.get("lo"), f.metadata.get("choices")
    if lo is not None and value < lo:
        raise ConfigError(f"{origin}: key {key!r}: must be >= {lo}, got {value!r}")
    if choices and value not in choices:
        raise ConfigError(
            f"{origin}: key {key!r}: must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


def _cross_check(cfg: Config, origin: str) -> None:
    ratios = (
        "gpu_spin_sm",
        "gpu_spin_dram",
        "gpu_busy_dram",
        "gpu_spin_power_ratio",
        "gpu_spin_clock_ratio",
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
    _check_vllm_url(cfg.vllm_url, origin)
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
        import re

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


def _check_vllm_url(url: str | None, origin: str) -> None:
    if not url:
        return
    where = f"{origin}: key 'vllm_url': {url!r}"
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
