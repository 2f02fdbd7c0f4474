"""Faults around restarts in supervise mode: a server that dies again after every restart (a
restart storm) is capped and said; a stop signal in the middle of a restart leaves no server
behind."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.faults.harness import QUIET, Watchdog, alive, kill_if_alive, wait_for

pytestmark = pytest.mark.slow

# Prints vLLM's engine-death lines, then stays up (the API server outlives its engine).
DIES = (
    "import sys, time;"
    "print('ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.', flush=True);"
    "print('vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.',"
    " flush=True); time.sleep(612)"
)


def storm(tmp_path: Path, *extra: str) -> Watchdog:
    return Watchdog(
        tmp_path, *QUIET, "--metrics-addr", "127.0.0.1:0", "--tick-s", "0.2", "--no-stacks",
        "--remediate", "--cooldown-s", "0", "--stop-grace-s", "5", "--recover-within-s", "2",
        "--state-dir", str(tmp_path / "state"), "--incident-dir", str(tmp_path / "incidents"),
        *extra, "--", sys.executable, "-c", DIES,
    )  # fmt: skip


def servers(wd: Watchdog) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(wd.proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_restart_storm_is_capped_and_said(tmp_path: Path) -> None:
    wd = storm(tmp_path, "--max-restarts", "2")
    try:
        wd.wait_line(r"no more restarts until an operator runs", timeout=60)
        starts = len(re.findall(r"INFO: started ", wd.stderr))
        assert starts == 3, wd.stderr[-2000:]  # the first start and two restarts, no more
        assert wd.get("/healthz")[0] == 200
    finally:
        left = servers(wd)
        wd.stop()
    wait_for(lambda: not any(alive(p) for p in left), timeout=10)
    wd.assert_clean()


def test_sigterm_during_a_restart_leaves_no_server(tmp_path: Path) -> None:
    wd = storm(tmp_path, "--max-restarts", "5")
    seen: set[int] = set()
    try:
        wd.wait_line(r"via supervise|restarting", timeout=60)
        seen.update(servers(wd))
        wd.signal(signal.SIGTERM)
        seen.update(servers(wd))
        wd.wait(30)
        assert "SIGTERM received: stopping the server" in wd.stderr
        wait_for(lambda: not any(alive(p) for p in seen), timeout=10)
    finally:
        kill_if_alive(sorted(seen))
    wd.assert_clean()
