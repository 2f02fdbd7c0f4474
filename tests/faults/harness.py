"""A live `hang-watchdog run` for fault tests: a real process on loopback, its output kept, and
the checks every fault makes (no traceback, /healthz truthful, no orphan)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from tests.simfixtures import REPO_ROOT, sim_env

QUIET = ("--no-cdn-default", "--gpu-source", "none")


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, step: float = 0.05) -> Any:
    """Poll `cond` until it is truthy; AssertionError after `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout} s")


STARTED: list[Watchdog] = []  # stopped by tests/faults/conftest.py after each test


class Watchdog:
    """`python -m watchdog run ARGS` in the background, stderr and stdout to files."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        STARTED.append(self)
        self.err_path, self.out_path = tmp / "watchdog.err", tmp / "watchdog.out"
        self._err, self._out = open(self.err_path, "wb"), open(self.out_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "watchdog", "run", *args],
            stdout=self._out,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
            env=sim_env(env),
            cwd=REPO_ROOT,
        )

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_line(self, regex: str, timeout: float = 20.0) -> re.Match[str]:
        """The first stderr match of `regex`, waiting for it."""
        return wait_for(lambda: re.search(regex, self.stderr), timeout)  # type: ignore[no-any-return]

    def port(self, timeout: float = 20.0) -> int:
        return int(self.wait_line(r"metrics on http://[^:]+:(\d+)/metrics", timeout).group(1))

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(status, body) of GET `path` on the exporter."""
        url = f"http://127.0.0.1:{self.port()}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._close_files()

    def stop(self) -> int:
        """SIGTERM and wait; SIGKILL as a last resort (the test then fails on the code)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close_files()
        return self.proc.returncode

    def _close_files(self) -> None:
        for fh in (self._err, self._out):
            with contextlib.suppress(OSError):
                fh.close()

    def assert_clean(self) -> None:
        """No traceback reached the operator."""
        text = self.stderr + self.stdout
        assert "Traceback" not in text, text[-3000:]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_if_alive(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def child_pid(wd: Watchdog, timeout: float = 20.0) -> int:
    """The supervised child's PID from the watchdog's `started ... (pid N)` line."""
    return int(wd.wait_line(r"started .* \(pid (\d+)\)", timeout).group(1))


# -- shared by the log fault modules --------------------------------------------------------------

DEATH = (
    "ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
)


FOUND = r"-> dead: engine_dead"


def watch(tmp_path: Path, log: Path, pid: int) -> Watchdog:
    wd = Watchdog(
        tmp_path, *QUIET, "--pid", str(pid), "--log-file", str(log), "--tick-s", "0.2",
        "--metrics-addr", "127.0.0.1:0", "--no-stacks",
    )  # fmt: skip
    wd.port()
    wd.wait_line(r"state: - -> ")
    return wd


def ticking(wd: Watchdog) -> int:
    """Iterations the loop completed, from its own counter on /metrics."""
    body = wd.get("/metrics")[1]
    for line in body.splitlines():
        if line.startswith("hang_watchdog_loop_duration_seconds_count"):
            return int(float(line.split()[-1]))
    raise AssertionError("no loop counter on /metrics")


def finish(wd: Watchdog) -> None:
    """The loop still ticks (within 3 s), /healthz says ok, SIGTERM ends it cleanly."""
    before = ticking(wd)
    wait_for(lambda: ticking(wd) > before, timeout=3)
    assert wd.get("/healthz")[0] == 200
    assert wd.stop() in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    wd.assert_clean()
