"""End to end: a TP=4 simulated vLLM where one worker is the cause and three wait in all_reduce.

Real processes (`VLLM::Worker_TPn` titles), real py-spy, the real `diagnose` command: the verdict
names the cause, the rank and the ranks waiting on it, for a cubin download and a spinning rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, sim_env

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory
pytestmark = pytest.mark.slow

SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]


def _diagnose(tmp_path: Path, sim: SimHandle, *extra: str) -> dict:
    argv = [sys.executable, "-m", "watchdog", "diagnose", "--pid", str(sim.pid)]
    argv += ["--server-url", f"http://127.0.0.1:{sim.port}", "--gpu-source", f"file:{sim.gpu_file}"]
    argv += ["--log-file", str(sim.log_file), *SHORT, "--gpu-spin-for-s", "4"]
    # No --until-hang: a download stall can be called from logs and sockets before the stacks
    # arrive; the verdict at the end of the run has them.
    argv += ["--duration", "20", "--json", "--no-cdn-default", *extra]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=150, env=sim_env(), cwd=tmp_path
    )
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def _check_ranks(verdict: dict, cause: int, activity: str, role: str = "worker") -> None:
    assert verdict["cause_rank"] == cause, verdict
    assert verdict["waiting_ranks"] == [r for r in range(4) if r != cause], verdict
    by_rank = {r["rank"]: r for r in verdict["ranks"] if r["rank"] is not None}
    assert sorted(by_rank) == [0, 1, 2, 3], verdict["ranks"]
    assert by_rank[cause]["part"] == "cause" and by_rank[cause]["activity"] == activity
    assert by_rank[cause]["gpu"] == cause  # the sim puts rank n's pid on GPU n
    for r, view in by_rank.items():
        assert view["role"] == role  # the profile's name: VLLM::Worker_TPn, sglang::scheduler_TPn
        if r != cause:
            assert view["part"] == "waiting" and view["activity"] == "collective", view
            assert view["frame"].startswith(("barrier", "all_reduce")) and view["unchanged"]
    # Each rank's own last progress: the waiting ranks' GPUs moved memory after the cause
    # stopped (the sim's waiting ranks finish their share of the step first), so the cause
    # is the first rank to stop.
    progress = {p["rank"]: p for p in verdict["rank_progress"]}
    assert sorted(progress) == [0, 1, 2, 3], verdict["rank_progress"]
    print("seconds since each rank's progress:",
          {r: (p["seconds"], p["signal"]) for r, p in sorted(progress.items())})  # fmt: skip
    for r in range(4):
        if r != cause:
            assert progress[r]["signal"] == "gpu", progress
            assert progress[cause]["seconds"] >= progress[r]["seconds"] + 1, progress
    first = next(e["detail"] for e in verdict["evidence"] if e["kind"] == "rank_progress")
    assert first.startswith(f"rank {cause} stopped first"), first
    line = next(e["detail"] for e in verdict["evidence"] if e["kind"] == "rank_cause")
    assert line.startswith(f"rank {cause} ({role}) is in "), line
    assert "3 other ranks wait for it" in line


def test_tp4_download_rank_is_named_cause(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=["--tp", "4", "--gpus", "4", "--hang-rank", "2"]
        + ["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    verdict = _diagnose(tmp_path, sim, "--cdn-host", f"127.0.0.1:{cdn}")
    assert verdict["signature"] == "cubin_download_stall", verdict
    _check_ranks(verdict, 2, "download")
    cause = next(r for r in verdict["ranks"] if r["part"] == "cause")
    assert cause["frame"].startswith("download_file") and cause["sockets"], cause


def test_tp4_spinning_rank_is_named_cause(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    sim = sim_factory(
        "kernel_deadlock", mode="serve", extra_args=["--tp", "4", "--gpus", "4", "--hang-rank", "1"]
    )
    verdict = _diagnose(tmp_path, sim)
    assert verdict["state"] == "hung", verdict
    _check_ranks(verdict, 1, "gpu_wait")
    cause = next(r for r in verdict["ranks"] if r["part"] == "cause")
    assert cause["frame"].startswith("synchronize"), cause


SGLANG_TP4 = ["--engine", "sglang", "--tp", "4", "--gpus", "4", "--health-timeout-s", "5"]


def test_sglang_tp4_download_rank_is_named_cause(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """SGLang TP=4: `sglang::scheduler_TP0..3` under the launcher; rank 3 blocks in FlashInfer's
    download (no `Fetching` line: SGLang sets FlashInfer's logger to ERROR), ranks 0-2 wait."""
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*SGLANG_TP4, "--hang-rank", "3"]
        + ["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    for rank in range(4):  # siblings, as SGLang's launcher starts them
        pid = sim.child_pid(f"sglang::scheduler_TP{rank}")
        assert psutil.Process(pid).ppid() == sim.pid
    verdict = _diagnose(tmp_path, sim, "--cdn-host", f"127.0.0.1:{cdn}")
    assert verdict["signature"] == "cubin_download_stall", verdict
    _check_ranks(verdict, 3, "download", role="scheduler")
    cause = next(r for r in verdict["ranks"] if r["part"] == "cause")
    assert cause["frame"].startswith("download_file") and cause["sockets"], cause
    assert "Fetching" not in sim.log_text()
    assert sim.wait_for_line(r"^\[[\d-]+ [\d:]+ TP3\] Load weight begin\.")


def test_sglang_tp4_spinning_rank_is_named_cause(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    sim = sim_factory("kernel_deadlock", mode="serve", extra_args=[*SGLANG_TP4, "--hang-rank", "0"])
    verdict = _diagnose(tmp_path, sim)
    assert verdict["state"] == "hung", verdict
    _check_ranks(verdict, 0, "gpu_wait", role="scheduler")
