"""Stack capture of every rank in parallel: bounded concurrency, a deadline per rank, and one
overall deadline for the whole capture (real py-spy, real blocked processes)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from stackprocs.spawn import start_target, stop

from watchdog.core.model import ProcInfo
from watchdog.sources.stacks.capture import StackCapturer, resolve_pyspy

REAL_PYSPY = resolve_pyspy(None)
pytestmark = pytest.mark.skipif(REAL_PYSPY is None, reason="py-spy is a test dependency")


def _slow_pyspy(tmp_path: Path, delay_s: float) -> str:
    """A py-spy that takes `delay_s` longer than the real one (a loaded host, a big process)."""
    path = tmp_path / "slow-py-spy"
    path.write_text(
        f"#!{sys.executable}\nimport os, sys, time\ntime.sleep({delay_s})\n"
        f"os.execv({REAL_PYSPY!r}, [{REAL_PYSPY!r}, *sys.argv[1:]])\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[str]]]:
    procs = [start_target("collective_wait.py") for _ in range(4)]
    yield procs
    for p in procs:
        stop(p)


def _infos(procs: list[subprocess.Popen[str]]) -> list[ProcInfo]:
    return [
        ProcInfo(p.pid, os.getpid(), "python", f"VLLM::Worker_TP{i}", role="worker", rank=i)
        for i, p in enumerate(procs)
    ]


def test_ranks_queued_behind_others_get_their_own_deadline(tmp_path, ranks) -> None:
    """4 ranks, 2 at a time, each rank's two py-spy runs ~3 s: the second pair starts ~3 s in and
    still gets its full 4 s (a deadline shared by the whole phase would cut it off at 4 s)."""
    capturer = StackCapturer(
        pyspy=_slow_pyspy(tmp_path, 1.2),
        native=False,
        deadline_s=4.0,
        second_after_s=-1,
        max_parallel=2,
        overall_s=30.0,
    )
    started = time.monotonic()
    result = capturer.capture_now(_infos(ranks))
    took = time.monotonic() - started
    assert result.result == "ok", result.reason
    assert sorted(s.pid for s in result.samples) == sorted(p.pid for p in ranks)
    assert all(s.threads and s.error is None for s in result.samples)
    assert sorted(result.raw_text) == sorted(p.pid for p in ranks)  # text dumps too, for all
    print(f"4 ranks, 2 in parallel, slow py-spy: captured in {took:.1f} s")


def test_the_overall_deadline_bounds_the_whole_capture(tmp_path, ranks) -> None:
    """py-spy that never returns: every rank times out and the capture ends at overall_s."""
    hang = tmp_path / "hung-py-spy"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(hang.stat().st_mode | stat.S_IXUSR)
    capturer = StackCapturer(
        pyspy=str(hang), deadline_s=5.0, second_after_s=1.0, max_parallel=2, overall_s=2.0
    )
    started = time.monotonic()
    result = capturer.capture_now(_infos(ranks))
    took = time.monotonic() - started
    assert result.result == "timeout", result.reason
    assert all(s.error == "py-spy timed out" for s in result.samples)
    # 5 s (the per-rank deadline) without the overall deadline; with it, 2 s plus the kills.
    assert took < 4.5, took
    print(f"hung py-spy on 4 ranks, overall deadline 2 s: capture ended after {took:.1f} s")
