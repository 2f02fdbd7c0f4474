"""Remediation end to end: `python -m watchdog run --remediate -- python -m watchdog.sim.vllm_sim`
as real processes, with the simulator's GPU file, /metrics and OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.simfixtures import sim_env
from watchdog.sim.cdn import free_port
from watchdog.sim.versions import write_dist_infos

FLAG = "--attention-config.use_trtllm_attention=0"


class Watchdog:
    """One `hang-watchdog run` process supervising the simulator."""

    def __init__(
        self,
        tmp: Path,
        scenario: str,
        versions: dict[str, str],
        *extra: str,
        sim_args: tuple[str, ...] = (),
    ) -> None:
        self.tmp, self.port = tmp, free_port()
        fake = tmp / "versions"
        write_dist_infos(str(fake), versions)  # the sim's interpreter reports these versions
        env = sim_env()
        env["PYTHONPATH"] = f"{fake}{os.pathsep}{env['PYTHONPATH']}"
        gpu = tmp / "gpu.jsonl"
        argv = [sys.executable, "-m", "watchdog", "run", "--gpu-source", f"file:{gpu}",
                "--server-url", f"http://127.0.0.1:{self.port}", "--state-dir", str(tmp / "state"),
                "--incident-dir", str(tmp / "incidents"), "--metrics-addr", "127.0.0.1:0",
                "--no-cdn-default", "--tick-s", "0.5", "--stall-after-s", "3",
                "--suspect-after-s", "2", "--stack-second-after-s", "1", "--gpu-spin-for-s", "2",
                "--stop-grace-s", "5", "--cooldown-s", "0", "--recover-within-s", "60", *extra,
                "--", sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario,
                "--mode", "serve", "--port", str(self.port), "--startup-s", "1",
                "--gpu-file", str(gpu), "--stats-interval", "1", "--workdir", str(tmp),
                *sim_args]  # fmt: skip
        self.err = tmp / f"watchdog-{time.monotonic_ns()}.err"
        with open(self.err, "wb") as fh:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=fh)

    def text(self) -> str:
        return self.err.read_bytes().decode("utf-8", "replace")

    def wait_for(self, regex: str, timeout: float = 90.0) -> re.Match[str]:
        end = time.monotonic() + timeout
        while True:
            match = re.search(regex, self.text())
            if match:
                return match
            if time.monotonic() > end or self.proc.poll() is not None:
                raise AssertionError(
                    f"no {regex!r} (rc={self.proc.poll()}); tail:\n{self.text()[-3000:]}"
                )
            time.sleep(0.2)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        port = self.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics").group(1)
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
        out = {}
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def starts(self) -> list[str]:
        return re.findall(r"INFO: started (.*) \(pid \d+\)", self.text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def remediation_record(tmp: Path) -> dict[str, Any]:
    records = [
        json.loads(p.read_text()).get("remediation")
        for p in sorted((tmp / "incidents").glob("*/incident.json"))
    ]
    found = [r for r in records if r]
    assert found, "no incident bundle records a remediation"
    return found[-1]


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
