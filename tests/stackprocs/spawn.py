"""Start a stackprocs target as a real child process and wait until it is blocked."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_target(
    script: str,
    *,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    ready_timeout_s: float = 30.0,
) -> subprocess.Popen[str]:
    """Run tests/stackprocs/<script> and return once it printed "ready" (it is then blocked)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=full_env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready and proc.stdout.readline().strip() == "ready":
            time.sleep(0.2)  # let it enter the blocking call after printing
            return proc
        if proc.poll() is not None:
            break
    stop(proc)
    raise AssertionError(f"{script} did not become ready within {ready_timeout_s} s")


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill a target and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
