"""Only the watched server's GPUs are judged: another server's busy GPU must not hide a stall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from watchdog.config import Config
from watchdog.core.model import GpuSample
from watchdog.core.state.gpuscope import in_container, server_gpus
from watchdog.daemon.wiring import build

A, B, C = ("GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000",
           "GPU-cccccccc-0000-4000-8000-000000000000")  # fmt: skip
NODE = (
    GpuSample(0, uuid=A, pids=(111,)),
    GpuSample(1, uuid=B, pids=(222,)),
    GpuSample(2, uuid=C, pids=(333,)),
)


def _idx(picked: tuple[GpuSample, ...]) -> list[int]:
    return [g.index for g in picked]


def test_the_operator_setting_wins() -> None:
    picked, how = server_gpus(NODE, configured=["2", B], environ={"NVIDIA_VISIBLE_DEVICES": A})
    assert (_idx(picked), how) == ([1, 2], "configured")
    assert _idx(server_gpus(NODE, configured=["0,2"])[0]) == [0, 2]  # comma lists too


def test_device_plugin_uuids_pick_the_servers_gpus() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": f"{C},{A}", "CUDA_VISIBLE_DEVICES": "0,1"}
    picked, how = server_gpus(NODE, environ=env, same_pid_namespace=False)
    assert (_idx(picked), how) == ([0, 2], "NVIDIA_VISIBLE_DEVICES UUIDs")


def test_host_pids_of_the_server_tree_pick_its_gpus() -> None:
    picked, how = server_gpus(NODE, environ={}, tree_pids=[50, 222])
    assert (_idx(picked), how) == ([1], "server processes")


def test_pids_and_indices_are_not_trusted_inside_a_container() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    picked, how = server_gpus(NODE, environ=env, tree_pids=[222], same_pid_namespace=False)
    assert (_idx(picked), how) == ([0, 1, 2], "all")
    picked, how = server_gpus(NODE, environ=env, tree_pids=[999])
    assert (_idx(picked), how) == ([1], "CUDA_VISIBLE_DEVICES indices")


def test_nothing_that_names_an_existing_gpu_means_all() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "GPU-gone"}
    assert server_gpus(NODE, environ=env) == (NODE, "all")


def test_container_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not in_container(str(tmp_path))
    (tmp_path / ".dockerenv").touch()
    assert in_container(str(tmp_path))


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in server process whose environment names GPU A, as the device plugin would."""
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": A}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    yield p
    p.kill()
    p.wait()


def test_another_servers_busy_gpu_does_not_count(tmp_path: Path, server) -> None:
    gpu_file = tmp_path / "gpu.jsonl"
    now = time.time()
    lines = [  # GPU 0 (ours) spins without memory traffic; GPU 1 (someone else's) is busy
        {"ts": now, "gpu": 0, "uuid": A, "sm": 0.99, "dram": 0.0, "procs": 1},
        {"ts": now, "gpu": 1, "uuid": B, "sm": 0.8, "dram": 0.6, "procs": 1},
    ]
    gpu_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = Config(
        pid=server.pid,
        gpu_source=f"file:{gpu_file}",
        metrics_addr="off",
        stacks=False,
        cdn_default=False,
    )
    built = build(cfg)
    try:
        deadline = time.monotonic() + 10
        while True:
            obs = built.daemon.observe()
            if [g.index for g in obs.gpus] == [0] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [(g.index, g.uuid) for g in obs.gpus] == [(0, A)]
    finally:
        built.daemon.close()


def test_the_choice_holds_while_its_evidence_is_unavailable() -> None:
    """A driver hang that blocks the process source must not widen the judgement to all GPUs."""
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.daemon.loop import Daemon
    from watchdog.sources.base import SourceTick

    daemon = Daemon(Config(metrics_addr="off", cdn_default=False), load_signatures(), [])
    daemon.host_pids = True
    assert _idx(daemon._server_gpus(NODE, SourceTick(5, (222,), {}))) == [1]  # server processes
    assert _idx(daemon._server_gpus(NODE, SourceTick(None, (), None))) == [1]  # procs stuck: kept
    assert _idx(daemon._server_gpus(NODE, SourceTick(5, (), None))) == [1]  # same server, not alive
    assert _idx(daemon._server_gpus(NODE, SourceTick(6, (), {}))) == [0, 1, 2]  # a new server
    daemon.close()
