"""The shipped systemd units pass `systemd-analyze verify`, are hardened, and agree."""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.deploystandins import systemd_expand
from tests.fakes import (
    ROOT,
    SYSTEMD,
    assert_clean,
    needs_analyze,
    stage,
    values,
    verify,
)
from watchdog.commands.preflight import add_arguments, options_from_args
from watchdog.config import load_config
from watchdog.remediation.restarters import env_file_text
from watchdog.sources.facts import trtllm_attention

README_FRAGMENT = ROOT / "docs" / "deployment.md"
PREFLIGHT_FRAGMENT = ROOT / "docs" / "preflight.md"
DROP_IN = SYSTEMD / "vllm.service.d" / "10-hang-watchdog.conf"
STATE_DIR = "/var/lib/hang-watchdog"


@needs_analyze
def test_shipped_units_verify_cleanly(tmp_path: Path) -> None:
    staged = stage(tmp_path)
    assert_clean(verify(staged / "hang-watchdog.service", staged / "vllm.service"))
    assert_clean(verify(staged / "sglang.service"))


@needs_analyze
def test_drop_in_is_loaded_and_verifies(tmp_path: Path) -> None:
    staged = stage(tmp_path)
    drop_in = staged / "vllm.service.d" / "10-hang-watchdog.conf"
    assert drop_in.exists()
    assert_clean(verify(staged / "vllm.service"))
    drop_in.write_text(drop_in.read_text() + "EnvironmentFil=-/nowhere\n")
    result = verify(staged / "vllm.service")
    assert "EnvironmentFil" in result.stderr


@needs_analyze
@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("Type=notify", "Type=notifyy", "service type"),
        ("WatchdogSec=", "WatchdogSecs=", "Unknown key"),
        ("/bin/hang-watchdog run", "/bin/missing run", "not executable"),
    ],
)
def test_broken_copy_fails_verification(tmp_path: Path, old: str, new: str, expect: str) -> None:
    staged = stage(tmp_path)
    unit = staged / "hang-watchdog.service"
    text = unit.read_text()
    assert old in text
    unit.write_text(text.replace(old, new, 1))
    result = verify(unit)
    assert expect in result.stderr
    with pytest.raises(AssertionError):
        assert_clean(result)


def test_watchdog_unit_is_notify_with_watchdog_and_restart() -> None:
    unit = SYSTEMD / "hang-watchdog.service"
    assert values(unit, "Type") == ["notify"]
    assert values(unit, "NotifyAccess") == ["main"]
    assert values(unit, "Restart") == ["on-failure"]
    (watchdog_sec,) = values(unit, "WatchdogSec")
    assert int(watchdog_sec) >= 10


def test_watchdog_unit_hardening() -> None:
    unit = SYSTEMD / "hang-watchdog.service"
    for key, expected in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "no",  # NVML needs /dev/nvidia*; DevicePolicy=closed + DeviceAllow
        "DevicePolicy": "closed",
    }.items():
        assert values(unit, key) == [expected], key
    caps = {"CAP_SYS_PTRACE", "CAP_KILL"}
    assert set(" ".join(values(unit, "CapabilityBoundingSet")).split()) == caps
    assert set(" ".join(values(unit, "AmbientCapabilities")).split()) == caps
    allowed = " ".join(values(unit, "DeviceAllow"))
    assert "/dev/nvidiactl rw" in allowed and "char-nvidia-frontend rw" in allowed
    assert values(unit, "ProtectProc") == []  # "invisible" would hide the vLLM processes


def test_config_paths_are_writable_and_shared_with_vllm_unit() -> None:
    cfg = load_config(SYSTEMD / "config.toml")
    writable = values(SYSTEMD / "hang-watchdog.service", "ReadWritePaths")
    assert writable == [STATE_DIR]
    assert values(SYSTEMD / "hang-watchdog.service", "StateDirectory") == [
        "hang-watchdog hang-watchdog/incidents"
    ]
    for path in (cfg.state_dir, cfg.incident_dir, cfg.fallback_file):
        assert path is not None and (path + "/").startswith(STATE_DIR + "/"), path
    assert cfg.restarter == "systemd" and cfg.remediate is False
    assert cfg.journal_unit == cfg.systemd_unit == "vllm.service"
    optional_env_file = "-" + str(cfg.fallback_file)
    assert optional_env_file in values(SYSTEMD / "vllm.service", "EnvironmentFile")
    drop_in = SYSTEMD / "vllm.service.d" / "10-hang-watchdog.conf"
    assert optional_env_file in values(drop_in, "EnvironmentFile")


def test_vllm_unit_runs_preflight_and_applies_fallback_args() -> None:
    unit = SYSTEMD / "vllm.service"
    (pre,) = values(unit, "ExecStartPre")
    assert pre.startswith("/usr/local/bin/hang-watchdog preflight --python ")
    (start,) = values(unit, "ExecStart")
    # $VAR (unbraced, its own word) splits into arguments and disappears when unset.
    assert re.search(r"(^|\s)\$HANG_WATCHDOG_FALLBACK_ARGS(\s|$)", start), start


def preflight_server_args(unit: Path, env: Mapping[str, str]) -> tuple[str, ...]:
    """What the unit's preflight ExecStartPre= passes as --server-args, parsed by preflight."""
    (pre,) = [v for v in values(unit, "ExecStartPre") if " preflight " in v]
    argv = systemd_expand(pre, env)
    assert argv[:2] == ["/usr/local/bin/hang-watchdog", "preflight"], argv
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return options_from_args(parser.parse_args(argv[2:])).server_args


def environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads an EnvironmentFile= (systemd.exec(5)): `#` comments and
    blank lines skipped, one pair of surrounding quotes removed."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out[key] = value[1:-1] if value[:1] == value[-1:] and value[:1] in "\"'" else value
    return out


def written(args: list[str], fallbacks: list[str]) -> dict[str, str]:
    """What the systemd restarter's fallback file sets, read back as systemd reads it."""
    return environment_file(env_file_text(args, {}, fallbacks))


# The operator's own arguments, and the fallback the systemd restarter writes for vLLM >= 0.13.
OPERATOR = {"VLLM_MODEL": "my-model", "VLLM_SERVE_ARGS": "--tensor-parallel-size 8 --port 8000"}
FALLBACK = written(["--attention-config.use_trtllm_attention=0"], ["disable_trtllm_attention"])


@pytest.mark.parametrize("unit", [SYSTEMD / "vllm.service", DROP_IN], ids=["unit", "drop-in"])
def test_preflight_sees_the_servers_args_and_the_fallback(unit: Path) -> None:
    """Without them pre-flight FAILs SM103 + FlashInfer 0.6.7 even when the server runs with
    TRTLLM attention off, so the fallback could never start."""
    with_fallback = preflight_server_args(unit, {**OPERATOR, **FALLBACK})
    assert trtllm_attention(with_fallback, {}) is False, with_fallback
    assert "--tensor-parallel-size" in with_fallback
    operator_disabled = {"VLLM_SERVE_ARGS": "--attention-config.use_trtllm_attention=0"}
    assert trtllm_attention(preflight_server_args(unit, operator_disabled), {}) is False
    assert preflight_server_args(unit, {}) == ()  # both unset: still a valid invocation


def test_preflight_gets_exactly_the_arguments_exec_start_gets() -> None:
    env = {**OPERATOR, **FALLBACK}
    (start,) = values(SYSTEMD / "vllm.service", "ExecStart")
    served = systemd_expand(start, env)
    assert served[:3] == ["/opt/vllm/bin/vllm", "serve", "my-model"]
    assert tuple(served[3:]) == preflight_server_args(SYSTEMD / "vllm.service", env)
    # The drop-in's documented ExecStart for the operator's own unit agrees too.
    (example,) = re.findall(r"^#\s+ExecStart=(/\S.*)$", DROP_IN.read_text(), re.MULTILINE)
    assert tuple(systemd_expand(example, env)[3:]) == preflight_server_args(DROP_IN, env)


def test_an_old_unit_reading_the_old_name_still_gets_the_fallback() -> None:
    """A unit not yet updated (`$VLLM_WATCHDOG_ARGS`, the name before HANG_WATCHDOG_FALLBACK_ARGS)
    gets the same arguments from the file this watchdog writes."""
    assert FALLBACK["VLLM_WATCHDOG_ARGS"] == FALLBACK["HANG_WATCHDOG_FALLBACK_ARGS"]
    assert FALLBACK["VLLM_WATCHDOG_FALLBACK"] == FALLBACK["HANG_WATCHDOG_FALLBACKS"]
    (start,) = values(SYSTEMD / "vllm.service", "ExecStart")
    old = start.replace("$HANG_WATCHDOG_FALLBACK_ARGS", "$VLLM_WATCHDOG_ARGS")
    assert old != start
    env = {**OPERATOR, **FALLBACK}
    served = systemd_expand(old, env)
    assert served[-1] == "--attention-config.use_trtllm_attention=0"
    assert served == systemd_expand(start, env)


def test_readme_excerpt_matches_the_shipped_unit() -> None:
    text = PREFLIGHT_FRAGMENT.read_text()
    unit = SYSTEMD / "vllm.service"
    for key in ("ExecStartPre", "ExecStart", "EnvironmentFile", "StartLimitBurst"):
        section = "Unit" if key.startswith("StartLimit") else "Service"
        for value in values(unit, key, section):
            assert f"{key}={value}\n" in text, f"{key}={value}"


@pytest.mark.parametrize("unit", [SYSTEMD / "vllm.service", DROP_IN], ids=["unit", "drop-in"])
def test_failing_preflight_hits_a_start_limit(unit: Path) -> None:
    """Restart=on-failure re-runs a failing ExecStartPre=; without a start limit, forever."""
    (interval,) = values(unit, "StartLimitIntervalSec", "Unit")
    (burst,) = values(unit, "StartLimitBurst", "Unit")
    restart_sec = int(values(SYSTEMD / "vllm.service", "RestartSec")[0])
    assert int(burst) >= 1
    # A preflight failing at once restarts every RestartSec: the burst must fit in the interval.
    assert int(interval) > int(burst) * restart_sec


@needs_analyze
def test_readme_reports_the_current_exposure_score(tmp_path: Path) -> None:
    staged = stage(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", "--threshold=30"]
        + [str(staged / "hang-watchdog.service")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    match = re.search(
        r"Overall exposure level for hang-watchdog\.service: (\d+\.\d)", result.stdout
    )
    assert match, result.stdout[-500:]
    assert f"exposure level {match.group(1)}" in README_FRAGMENT.read_text()


# --- SGLang: systemd/sglang.service with systemd/sglang-config.toml --------------------------
SGLANG_UNIT = SYSTEMD / "sglang.service"
SGLANG_OPERATOR = {"SGLANG_MODEL": "my-model", "SGLANG_SERVE_ARGS": "--tp-size 8 --port 30000"}
# What the systemd restarter writes for SGLang (the profile's disable_trtllm_attention).
SGLANG_FALLBACK = written(["--attention-backend", "flashinfer"], ["disable_trtllm_attention"])


def test_sglang_config_pairs_with_the_sglang_unit() -> None:
    cfg = load_config(SYSTEMD / "sglang-config.toml")
    assert cfg.systemd_unit == cfg.journal_unit == "sglang.service" and cfg.engine == "sglang"
    assert cfg.restarter == "systemd" and cfg.remediate is False
    assert cfg.fallback_file == load_config(SYSTEMD / "config.toml").fallback_file
    assert "-" + str(cfg.fallback_file) in values(SGLANG_UNIT, "EnvironmentFile")
    assert str(cfg.server_url).endswith(":30000")  # SGLang's default --port


def test_sglang_preflight_reads_the_args_as_sglangs() -> None:
    from watchdog.engines.loader import load_engines

    sglang = load_engines().get("sglang")
    assert sglang is not None
    (pre,) = values(SGLANG_UNIT, "ExecStartPre")
    assert " preflight --engine sglang " in pre, pre
    with_fallback = preflight_server_args(SGLANG_UNIT, {**SGLANG_OPERATOR, **SGLANG_FALLBACK})
    assert sglang.trtllm_attention(with_fallback) is False, with_fallback
    # Without the fallback SGLang picks TRTLLM-gen by itself on SM100/SM103 (None: by the GPU).
    assert sglang.trtllm_attention(preflight_server_args(SGLANG_UNIT, SGLANG_OPERATOR)) is None
    assert preflight_server_args(SGLANG_UNIT, {}) == ()


def test_sglang_preflight_gets_exactly_the_arguments_exec_start_gets() -> None:
    env = {**SGLANG_OPERATOR, **SGLANG_FALLBACK}
    (start,) = values(SGLANG_UNIT, "ExecStart")
    served = systemd_expand(start, env)
    assert served[:4] == ["/opt/sglang/bin/sglang", "serve", "--model-path", "my-model"]
    assert tuple(served[4:]) == preflight_server_args(SGLANG_UNIT, env)
    assert served[-2:] == ["--attention-backend", "flashinfer"]  # last: SGLang's argparse wins


def test_sglang_unit_start_limit_and_restart_match_vllms() -> None:
    for key, section in (("StartLimitIntervalSec", "Unit"), ("StartLimitBurst", "Unit")):
        assert values(SGLANG_UNIT, key, section) == values(SYSTEMD / "vllm.service", key, section)
    assert values(SGLANG_UNIT, "Restart") == ["on-failure"]
    assert values(SGLANG_UNIT, "Environment") == ["PYTHONUNBUFFERED=1"]
