"""The template unit hang-watchdog@.service: one watchdog per server, verified by systemd-analyze,
hardened like hang-watchdog.service, each instance with its own config, state and metrics port."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import (
    SYSTEMD,
    assert_clean,
    needs_analyze,
    stage,
    unit_entries,
    values,
    verify,
)
from watchdog.config import load_config

TEMPLATE = SYSTEMD / "hang-watchdog@.service"
SINGLE = SYSTEMD / "hang-watchdog.service"
INSTANCE_CONFIG = SYSTEMD / "instance.toml"


@needs_analyze
def test_template_instances_verify_cleanly(tmp_path: Path) -> None:
    staged = stage(tmp_path)
    for name in ("vllm-a", "sglang-7"):
        assert_clean(verify(staged / f"hang-watchdog@{name}.service"))


@needs_analyze
@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("Type=notify", "Type=notifyy", "service type"),
        ("StateDirectory=", "StateDirectoryy=", "Unknown key"),
        ("/bin/hang-watchdog run", "/bin/missing run", "not executable"),
    ],
)
def test_broken_template_fails_verification(
    tmp_path: Path, old: str, new: str, expect: str
) -> None:
    staged = stage(tmp_path)
    unit = staged / "hang-watchdog@.service"
    unit.write_text(unit.read_text().replace(old, new, 1))
    result = verify(staged / "hang-watchdog@vllm-a.service")
    assert expect in result.stderr
    with pytest.raises(AssertionError):
        assert_clean(result)


def test_each_instance_has_its_own_config_state_and_environment() -> None:
    (exec_start,) = values(TEMPLATE, "ExecStart")
    assert "--config /etc/hang-watchdog/%i.toml" in exec_start
    assert "--state-dir /var/lib/hang-watchdog/%i" in exec_start
    assert "--incident-dir /var/lib/hang-watchdog/%i/incidents" in exec_start
    assert values(TEMPLATE, "StateDirectory") == ["hang-watchdog/%i hang-watchdog/%i/incidents"]
    assert values(TEMPLATE, "ReadWritePaths") == ["/var/lib/hang-watchdog/%i"]
    assert values(TEMPLATE, "EnvironmentFile") == ["-/etc/default/hang-watchdog-%i"]
    assert "%i" in values(TEMPLATE, "Description", section="Unit")[0]


def test_template_is_hardened_exactly_like_the_single_unit() -> None:
    differs = {"ExecStart", "StateDirectory", "ReadWritePaths", "EnvironmentFile", "Description"}
    single = [e for e in unit_entries(SINGLE) if e[1] not in differs]
    template = [e for e in unit_entries(TEMPLATE) if e[1] not in differs]
    assert template == single


def test_instance_config_loads_with_the_template_flags(tmp_path: Path) -> None:
    cfg = load_config(
        INSTANCE_CONFIG,
        {"state_dir": str(tmp_path / "vllm-a"), "incident_dir": str(tmp_path / "vllm-a" / "inc")},
    )
    assert cfg.metrics_addr.startswith("127.0.0.1:") and cfg.remediate is False
    assert cfg.state_dir.endswith("vllm-a") and cfg.deployment == ""
