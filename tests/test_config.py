"""Config: defaults, TOML overrides, flags over TOML, and errors that name the key (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simfixtures import run_watchdog
from watchdog.commands.cli import build_parser, config_from_args
from watchdog.config import KEYS, Config, ConfigError, build_config, load_config
from watchdog.core.judge.classify import Thresholds

REPO = Path(__file__).resolve().parent.parent


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "watchdog.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.metrics_addr == "127.0.0.1:9433"
    assert (cfg.tick_s, cfg.stall_after_s, cfg.gpu_spin_for_s) == (1.0, 15.0, 10.0)
    assert cfg.remediate is False and cfg.stack_locals is False  # off unless the operator opts in
    assert cfg.gpu_source == "nvml" and cfg.log_files == []
    th = Thresholds.from_config(cfg)
    assert th == Thresholds()  # the classifier's defaults are the config's defaults


def test_every_key_has_a_default_and_help() -> None:
    cfg = Config()
    for name, f in KEYS.items():
        assert f.metadata["help"], name
        getattr(cfg, name)


def test_toml_overrides_defaults(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        'stall_after_s = 30\ngpu_source = "file:/run/gpu.jsonl"\n'
        'log_files = ["/var/log/vllm.log"]\nstacks = false\nmax_incidents = 7\n'
        'fallback_overrides = { gpu_kernel_spin = "none" }\n',
    )
    cfg = load_config(path)
    assert cfg.stall_after_s == 30.0 and isinstance(cfg.stall_after_s, float)
    assert cfg.gpu_source == "file:/run/gpu.jsonl"
    assert cfg.log_files == ["/var/log/vllm.log"]
    assert cfg.stacks is False and cfg.max_incidents == 7
    assert cfg.fallback_overrides == {"gpu_kernel_spin": "none"}
    assert cfg.tick_s == 1.0  # untouched keys keep their defaults


def test_flags_override_toml(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'stall_after_s = 30\nlog_format = "json"\nstacks = true\n')
    cfg = load_config(
        path, {"stall_after_s": 20.0, "stacks": False, "log_format": None, "log_files": []}
    )
    assert cfg.stall_after_s == 20.0 and cfg.stacks is False
    assert cfg.log_format == "json"  # None means "flag not given"


def test_command_line_flags_override_toml(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'stall_after_s = 30\nmetrics_addr = "127.0.0.1:9500"\nstacks = true\n')
    args = build_parser().parse_args(
        [
            "run",
            "--config",
            str(path),
            "--stall-after-s",
            "25",
            "--no-stacks",
            "--log-file",
            "a.log",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.stall_after_s == 25.0 and cfg.stacks is False and cfg.log_files == ["a.log"]
    assert cfg.metrics_addr == "127.0.0.1:9500"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'stall_afer_s'") as info:
        load_config(_toml(tmp_path, "stall_afer_s = 5\n"))
    assert str(tmp_path / "watchdog.toml") in str(info.value)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"stall_after_s": "soon"}, "stall_after_s"),
        ({"max_incidents": 2.5}, "max_incidents"),
        ({"max_incidents": True}, "max_incidents"),
        ({"stacks": "yes"}, "stacks"),
        ({"log_files": [1, 2]}, "log_files"),
        ({"fallback_overrides": {"x": 1}}, "fallback_overrides"),
        ({"metrics_addr": 9433}, "metrics_addr"),
        ({"tick_s": 0.0}, "tick_s"),
        ({"stall_after_s": 0.5}, "stall_after_s"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"gpu_spin_sm": 1.5}, "gpu_spin_sm"),
        ({"gpu_spin_dram": 2}, "gpu_spin_dram"),
        ({"remediate_min_confidence": 1.01}, "remediate_min_confidence"),
        ({"log_format": "xml"}, "log_format"),
        ({"restarter": "reboot"}, "restarter"),
        ({"gpu_source": "rocm"}, "gpu_source"),
        ({"gpu_source": "dcgm"}, "gpu_source"),
        ({"suspect_after_s": 20.0}, "suspect_after_s"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else "-".join(f"{k}={v[k]}" for k in v),
)
def test_bad_values_name_the_key(values: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config(values, origin="site.toml")
    msg = str(info.value)
    assert msg.startswith("site.toml: ") and f"'{key}'" in msg


def test_good_gpu_sources_are_accepted() -> None:
    for src in ("nvml", "none", "dcgm:http://127.0.0.1:9400/metrics", "file:/run/gpu.jsonl"):
        assert build_config({"gpu_source": src}).gpu_source == src


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "stall_after_s = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_unknown_key_exits_2_through_the_cli(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'server_url = "http://127.0.0.1:8000"\nstall_afer_s = 5\n')
    proc = run_watchdog("run", "--config", str(path))
    assert proc.returncode == 2
    assert "stall_afer_s" in proc.stderr and str(path) in proc.stderr


def test_bad_flag_value_exits_2_through_the_cli(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'server_url = "http://127.0.0.1:8000"\n')
    proc = run_watchdog("run", "--config", str(path), "--gpu-spin-sm", "1.5")
    assert proc.returncode == 2
    assert "gpu_spin_sm" in proc.stderr


FLOAT_KEYS = sorted(k for k, f in KEYS.items() if "float" in str(f.type))


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 1e300])
def test_non_finite_floats_are_refused_naming_the_key(key: str, bad: float) -> None:
    # NaN passes every `lo` bound and silently disabled detection; inf overflowed sleeps.
    with pytest.raises(ConfigError, match="finite number") as info:
        build_config({key: bad}, origin="site.toml")
    assert f"'{key}'" in str(info.value)


def test_nan_in_the_toml_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'stall_after_s': must be a finite number") as info:
        load_config(_toml(tmp_path, "stall_after_s = nan\n"))
    assert str(tmp_path / "watchdog.toml") in str(info.value)


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [("--stall-after-s", "nan", "stall_after_s"), ("--tick-s", "inf", "tick_s")],
)
def test_non_finite_flags_exit_2_without_a_traceback(flag: str, value: str, key: str) -> None:
    url = ["--server-url", "http://127.0.0.1:8000"]
    proc = run_watchdog("run", *url, "--no-cdn-default", flag, value)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and f"'{key}'" in proc.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"window_s": 10.0, "stall_after_s": 20.0, "blind_stall_after_s": 9.0}, "stall_after_s"),
        ({"window_s": 100.0}, "blind_stall_after_s"),
        ({"window_s": 12.0, "blind_stall_after_s": 11.0, "gpu_spin_for_s": 12.0}, "gpu_spin_for_s"),
        (
            {"window_s": 15.0, "stall_after_s": 15.0, "suspect_after_s": 15.0},
            "suspect_after_s",
        ),
    ],
)
def test_a_window_not_longer_than_a_threshold_is_refused(values: dict, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config(values, origin="site.toml")
    msg = str(info.value)
    assert "'window_s'" in msg and named in msg and "set window_s above" in msg


def test_window_longer_than_every_threshold_is_accepted() -> None:
    cfg = build_config({"window_s": 30.0, "stall_after_s": 20.0, "blind_stall_after_s": 29.0})
    assert cfg.window_s == 30.0


def test_window_shorter_than_the_stall_exits_2_through_the_cli() -> None:
    proc = run_watchdog("run", "--server-url", "http://127.0.0.1:8000", "--no-cdn-default",
                "--window-s", "10", "--stall-after-s", "20")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "'window_s'" in proc.stderr and "stall_after_s (20 s)" in proc.stderr


@pytest.mark.parametrize("path", ["kubernetes/config.toml", "systemd/config.toml"])
def test_shipped_configs_load(path: str) -> None:
    cfg = load_config(REPO / path)
    assert cfg.window_s > max(cfg.stall_after_s, cfg.blind_stall_after_s)


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.toml"
    path.write_bytes(b"\xff\xfes\x00t\x00")
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_config(path)
    assert str(path) in str(info.value)
    proc = run_watchdog("run", "--config", str(path), "--no-cdn-default")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and "UTF-8" in proc.stderr


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:notport",
        "http://127.0.0.1:0",
        "http://127.0.0.1:70000",
        "127.0.0.1:8000",
        "ftp://127.0.0.1:8000",
        "http://:8000",
    ],
)
def test_a_bad_server_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="e.g. http://127.0.0.1:8000") as info:
        build_config({"server_url": url}, origin="site.toml")
    assert "'server_url'" in str(info.value) and repr(url) in str(info.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "https://vllm.internal/prefix/", "http://[::1]:8000"]
)
def test_good_server_urls_are_accepted(url: str) -> None:
    assert build_config({"server_url": url}).server_url == url


@pytest.mark.parametrize("host", ["a b:xx", "host:xx", "host:0", "http://host/"])
def test_a_bad_cdn_host_is_refused_even_without_a_target(host: str) -> None:
    with pytest.raises(ConfigError, match="HOST\\[:PORT\\]|1-65535") as info:
        build_config({"server_url": "http://127.0.0.1:8000", "cdn_hosts": [host]})
    assert "'cdn_hosts'" in str(info.value)


def test_bad_server_url_flag_exits_2_through_the_cli() -> None:
    proc = run_watchdog("run", "--server-url", "http://127.0.0.1:notport", "--no-cdn-default")
    assert proc.returncode == 2, proc.stderr
    assert "'server_url'" in proc.stderr and "Traceback" not in proc.stderr


def test_runtime_checks_name_the_key_against_the_worst_loop() -> None:
    from watchdog.configcheck import check_stale_after, check_watchdog_interval

    cfg = Config(tick_s=1.0, metrics_stale_s=5.0)
    check_stale_after(cfg, 4.9)
    with pytest.raises(ConfigError, match=r"key 'metrics_stale_s'.*Set it above 5"):
        check_stale_after(cfg, 5.0)
    check_watchdog_interval(cfg, 4.9, 5.0)
    with pytest.raises(ConfigError, match=r"key 'tick_s'.*WatchdogSec= to at least 11s"):
        check_watchdog_interval(cfg, 5.0, 5.0)


def test_the_daemons_window_uses_the_configured_thresholds() -> None:
    """The witness and restart-echo numbers reach the live window, not only classify()."""
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.daemon.loop import Daemon

    cfg = Config(
        metrics_addr="off",
        stacks=False,
        cdn_default=False,
        stats_due_factor=2.5,
        stats_due_slack_s=4.0,
        not_generating_hold_s=12.0,
        restart_echo_s=3.0,
    )
    daemon = Daemon(cfg, load_signatures(), [])
    th = daemon.window.th
    assert th == daemon.thresholds == Thresholds.from_config(cfg)
    assert (th.stats_due_factor, th.not_generating_hold_s, th.restart_echo_s) == (2.5, 12.0, 3.0)
    assert daemon.window.progress.witnesses.th is th
