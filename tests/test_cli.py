"""`hang-watchdog` command line end to end: usage errors, log format from the config file,
and a diagnose of a PID that does not exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simfixtures import run_watchdog, sim_env


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_watchdog(*args, cwd=cwd)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--bogus"], "hang-watchdog run: unrecognized arguments: --bogus"),
        (["run", "--pid", "abc"], "hang-watchdog run: argument --pid: invalid int value: 'abc'"),
        (["run"], "hang-watchdog run: nothing to watch; give --pid"),
        (["diagnose", "--", "true"], "hang-watchdog diagnose: only `run` takes `-- COMMAND ...`"),
        (["nosuch"], "hang-watchdog: unknown command 'nosuch'"),
    ],
    ids=["unknown-flag", "bad-value", "nothing-to-watch", "stray-command", "unknown-command"],
)
def test_usage_errors_have_one_prefix_and_exit_2(args: list[str], expected: str) -> None:
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(expected), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, one prefix
    assert done.stdout == ""


def diagnose_with_missing_sources(tmp_path: Path, config: str, *flags: str) -> list[str]:
    """stderr lines of a short diagnose whose log and GPU files are missing (two warnings)."""
    (tmp_path / "watchdog.toml").write_text(config)
    done = cli(
        "diagnose",
        "--config",
        str(tmp_path / "watchdog.toml"),
        "--log-file",
        str(tmp_path / "absent.log"),
        "--gpu-source",
        f"file:{tmp_path / 'absent.jsonl'}",
        "--duration",
        "1",
        "--no-cdn-default",
        *flags,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_log_format_json_in_the_config_file_applies_to_warnings_too(tmp_path: Path) -> None:
    lines = diagnose_with_missing_sources(tmp_path, 'log_format = "json"\n')
    records = [json.loads(line) for line in lines]  # every stderr line is one JSON object
    warnings = [r for r in records if r.get("level") == "WARNING"]
    assert any("absent.log" in r["message"] for r in warnings), records
    assert all(r["event"] == "log" and r["ts"].endswith("Z") for r in warnings)
    assert any(r["event"] == "state" for r in records)


def test_log_format_flag_overrides_the_config_file(tmp_path: Path) -> None:
    lines = diagnose_with_missing_sources(tmp_path, 'log_format = "json"\n', "--log-format", "text")
    assert lines and not any(line.startswith("{") for line in lines), lines
    assert any("WARNING: source logs is down" in line for line in lines), lines


def test_diagnose_of_a_pid_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    # PIDs are always below pid_max, so this one cannot exist.
    pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    done = cli("diagnose", "--pid", str(pid), "--duration", "5", "--no-cdn-default")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        f"hang-watchdog diagnose: no process with PID {pid}; check the PID or use --match"
    )
    assert "gone" not in done.stdout + done.stderr


def test_a_metrics_address_in_use_is_a_config_error(tmp_path: Path) -> None:
    import socket

    log = tmp_path / "server.log"
    log.write_text("")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = cli("run", "--log-file", str(log), "--gpu-source", "none", "--no-cdn-default",
                   "--metrics-addr", f"127.0.0.1:{port}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"metrics_addr': cannot listen on 127.0.0.1:{port}" in done.stderr


def test_run_of_a_pid_that_does_not_exist_is_an_error() -> None:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    done = cli("run", "--pid", str(pid), "--no-cdn-default", "--metrics-addr", "off")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        f"hang-watchdog run: no process with PID {pid}; check the PID or use --match/--systemd-unit"
    )


def test_a_closed_stdout_ends_quietly() -> None:
    # `hang-watchdog signatures | head`: the reader is gone before the listing is written.
    proc = subprocess.Popen(
        [sys.executable, "-m", "watchdog", "signatures"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=sim_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141  # what a shell reports for a process ended by SIGPIPE
    assert err == ""


def test_an_incident_dir_that_is_a_file_is_a_config_error_at_start(tmp_path: Path) -> None:
    taken = tmp_path / "incidents"
    taken.write_text("not a directory")
    flags = ["--gpu-source", "none", "--no-cdn-default", "--metrics-addr", "off"]
    done = cli("run", "--server-url", "http://127.0.0.1:9", *flags, "--incident-dir", str(taken))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"key 'incident_dir': {taken} is a file, not a directory" in done.stderr


def test_a_missing_incident_dir_is_created_at_start(tmp_path: Path) -> None:
    from watchdog.config import build_config
    from watchdog.daemon.wiring import build

    bundles = tmp_path / "a" / "incidents"
    values = {"server_url": "http://127.0.0.1:9", "gpu_source": "none", "metrics_addr": "off"}
    cfg = build_config({**values, "cdn_default": False, "incident_dir": str(bundles)})
    build(cfg).close()
    assert bundles.is_dir() and list(bundles.iterdir()) == []
