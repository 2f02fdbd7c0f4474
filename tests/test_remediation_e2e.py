"""Remediation end to end: `python -m watchdog run --remediate -- python -m watchdog.sim.vllm_sim`
as real processes, with the simulator's GPU file, /metrics and OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fakes import Watchdog, remediation_record

pytestmark = pytest.mark.slow  # real watchdog and simulator processes

FLAG = "--attention-config.use_trtllm_attention=0"


@pytest.fixture
def watchdogs(tmp_path: Path) -> Iterator[Callable[..., Watchdog]]:
    made: list[Watchdog] = []

    def make(scenario: str, versions: dict[str, str], *extra: str) -> Watchdog:
        wd = Watchdog(tmp_path, scenario, versions, *extra)
        made.append(wd)
        return wd

    yield make
    for wd in made:
        wd.stop()


NEW = {"vllm": "0.14.0", "flashinfer-python": "0.6.7"}


def test_restarts_with_exactly_the_flag_and_recovers(
    watchdogs: Callable[..., Watchdog], tmp_path: Path
) -> None:
    wd = watchdogs("hang_unless_fallback", NEW, "--remediate")
    wd.wait_for(r"remediation: recovered: .*4 completions answered 200 with text")
    starts = wd.starts()
    assert len(starts) == 2 and FLAG not in starts[0] and starts[1].endswith(FLAG)
    record = remediation_record(tmp_path)
    assert record["outcome"] == "recovered" and record["plan"]["args"] == [FLAG]
    assert record["verification"]["smoke_test"]["ok"] is True
    m = wd.metrics()
    assert (
        m[
            (
                "hang_watchdog_remediations_total",
                (("action", "disable_trtllm_attention"), ("outcome", "recovered")),
            )
        ]
        == 1
    )
    assert m[("hang_watchdog_fallback_active", (("fallback", "disable_trtllm_attention"),))] == 1


def test_older_vllm_gets_the_environment_variable(
    watchdogs: Callable[..., Watchdog], tmp_path: Path
) -> None:
    wd = watchdogs("hang_unless_fallback", {**NEW, "vllm": "0.10.2"}, "--remediate")
    wd.wait_for(r"remediation: recovered")
    assert all(FLAG not in s for s in wd.starts())
    record = remediation_record(tmp_path)
    assert (
        record["plan"]["env"] == {"VLLM_USE_TRTLLM_ATTENTION": "0"} and record["plan"]["args"] == []
    )
    assert "0.10.2" in record["plan"]["how"]


def test_dry_run_acts_on_nothing_and_exports_the_plan(
    watchdogs: Callable[..., Watchdog], tmp_path: Path
) -> None:
    wd = watchdogs("hang_unless_fallback", NEW, "--dry-run")
    wd.wait_for(
        r"dry run: would trtllm_attention_deadlock: restart with fallback "
        r"disable_trtllm_attention: " + re.escape(FLAG)
    )
    m = wd.metrics()
    assert (
        m[
            (
                "hang_watchdog_remediations_total",
                (("action", "disable_trtllm_attention"), ("outcome", "planned")),
            )
        ]
        == 1
    )
    time.sleep(2)
    assert len(wd.starts()) == 1 and wd.proc.poll() is None
    assert not (tmp_path / "state" / "remediation.json").exists()
    assert remediation_record(tmp_path)["outcome"] == "planned"


def test_cap_holds_across_a_watchdog_restart(
    watchdogs: Callable[..., Watchdog], tmp_path: Path
) -> None:
    state = tmp_path / "state" / "remediation.json"
    first = watchdogs("kernel_deadlock", NEW, "--remediate", "--max-restarts", "2")
    first.wait_for(r"remediation: restarted:")
    first.stop()
    assert len(json.loads(state.read_text())["restarts"]) == 1
    second = watchdogs("kernel_deadlock", NEW, "--remediate", "--max-restarts", "2")
    second.wait_for(r"remediation_exhausted: 2 restarts within")
    assert len(json.loads(state.read_text())["restarts"]) == 2
    assert len(second.starts()) == 2  # its own first start plus one restart: the cap counted both
    m = second.metrics()
    assert m[("hang_watchdog_remediation_exhausted", ())] == 1
    time.sleep(3)
    assert len(second.starts()) == 2
    assert json.loads(state.read_text())["exhausted"] is True
