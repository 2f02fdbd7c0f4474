"""Fault: the watchdog is stopped in the middle of an incident bundle write, then started
again. A bundle is built in `.tmp-PID-XXXX` and renamed into place once whole, so no bundle is
ever partial under its final name; the build dir of a writer that is gone is removed when the
next watchdog starts, and the remediation state file stays valid JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.harness import DEATH, FOUND, QUIET, Watchdog, wait_for
from tests.simfixtures import REPO_ROOT, sim_env
from watchdog.outputs.incident import load_incident

pytestmark = pytest.mark.slow

# A daemon (the real wiring) whose bundle write stops for good after its first files: the
# summary is rendered after timeline.jsonl and log-tail.txt are on disk.
WRITER = """\
import os, sys, time
from pathlib import Path
from watchdog.config import build_config
from watchdog.daemon.wiring import build
from watchdog.outputs import incident

tmp = Path(sys.argv[1])
def stuck(doc):
    (tmp / "mid-write").write_text("1")
    time.sleep(600)
incident.render_summary = stuck
log = tmp / "server.log"
cfg = build_config({"log_files": [str(log)], "gpu_source": "none", "cdn_default": False,
                    "metrics_addr": "off", "tick_s": 0.05, "incident_dir": str(tmp / "inc"),
                    "state_dir": str(tmp / "state"), "remediate": True, "dry_run": True,
                    "restarter": "command", "restart_command": ["true"],
                    "pid": os.getpid(), "stacks": False})
built = build(cfg)
built.daemon.tick()
with log.open("a") as fh:
    fh.write(sys.argv[2])
while True:
    built.daemon.tick()
    time.sleep(0.05)
"""


def bundles(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stop_mid_bundle_leaves_no_partial_bundle_and_a_valid_state(
    tmp_path: Path, sig: signal.Signals
) -> None:
    (tmp_path / "server.log").write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), DEATH], env=sim_env(), cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "mid-write").exists(), timeout=60)
    finally:
        proc.send_signal(sig)  # no handler here: the write is cut where it stands
        proc.wait(timeout=30)
    inc = tmp_path / "inc"
    assert list(inc.glob(".tmp-*")), "the write was not cut in the middle"
    assert bundles(inc) == []  # nothing partial under a bundle's name

    target = subprocess.Popen(["sleep", "616"])
    try:
        log = tmp_path / "server.log"
        cfg = tmp_path / "watchdog.toml"
        cfg.write_text(
            f"incident_dir = {str(inc)!r}\nstate_dir = {str(tmp_path / 'state')!r}\n"
            "remediate = true\ndry_run = true\nrestarter = 'command'\nrestart_command = ['true']\n"
        )
        wd = Watchdog(
            tmp_path, *QUIET, "--config", str(cfg), "--pid", str(target.pid), "--log-file",
            str(log), "--tick-s", "0.2", "--metrics-addr", "off", "--no-stacks",
        )  # fmt: skip
        wd.wait_line(r"state: - -> ")
        assert not list(inc.glob(".tmp-*")), "the dead writer's build dir is still there"
        with log.open("a") as fh:
            fh.write(DEATH)
        wd.wait_line(FOUND)
        found = wait_for(lambda: bundles(inc), timeout=30)
        for bundle in found:  # whole: every file the summary lists is there
            doc = load_incident(bundle)
            assert doc["verdict"]["signature"] == "engine_dead"
            assert (bundle / "summary.md").exists() and (bundle / "timeline.jsonl").exists()
        assert wd.stop() in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
        wd.assert_clean()
        for state in (tmp_path / "state").glob("*.json"):
            json.loads(state.read_text())  # the state file is whole JSON
        assert not list(inc.glob(".tmp-*"))
    finally:
        target.kill()
        target.wait()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
