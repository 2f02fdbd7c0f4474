"""Timelines round-trip through JSON Lines, and bad input names the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.core.model import (
    Connection,
    Frame,
    GpuSample,
    LogEvent,
    Observation,
    ProcInfo,
    ProcSnapshot,
    ServerSample,
    StackSample,
    ThreadStack,
)
from watchdog.core.state.timeline import read_timeline, write_timeline


def _obs(i: int, line: str = "Engine 000: Avg prompt throughput: 0.0 tokens/s") -> Observation:
    return Observation(
        t=100.0 + i,
        wall=1_700_000_000.0 + i,
        gpus=(GpuSample(index=0, name="NVIDIA GB300", cc="10.3", sm=0.99, dram=0.0, pids=(7,)),),
        logs=(LogEvent(kind="stats", line=line, source="stderr", fields={"running": 3}),),
        server=ServerSample(up=True, health_status=200, iterations=float(i), running=3.0),
        procs=ProcSnapshot(
            target_pid=7, alive=True, procs=(ProcInfo(7, 1, "python", "VLLM::EngineCore"),)
        ),
        conns=(Connection(7, "edge.urm.nvidia.com", "127.0.0.1", 443, "ESTABLISHED", 12.0),),
        stacks=(
            StackSample(
                pid=7,
                title="VLLM::EngineCore",
                threads=(ThreadStack(1, "MainThread", (Frame("download_file", "c.py", 3),), True),),
            ),
        ),
        facts={"flashinfer-python": "0.6.7"},
        sources={"gpu": True, "logs": False},
    )


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    observations = [_obs(i) for i in range(3)]
    path = tmp_path / "timeline.jsonl"
    write_timeline(path, observations)
    assert len(path.read_text().splitlines()) == 3
    assert read_timeline(path) == observations


def test_secrets_are_redacted_on_the_way_out(tmp_path: Path) -> None:
    secret = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    path = tmp_path / "timeline.jsonl"
    write_timeline(path, [_obs(0, line=f"token {secret}")])
    assert secret not in path.read_text()
    raw = tmp_path / "raw.jsonl"
    write_timeline(raw, [_obs(0, line=f"token {secret}")], redact=None)
    assert secret in raw.read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json}\n", ":2: not valid JSON"),
        ("[1, 2]\n", ":2: a JSON list"),
        ('{"t": 1.0}\n', ":2: missing wall"),
        ('{"t": 1.0, "wall": 2.0, "gpus": [{"name": "x"}]}\n', ":2: not an Observation"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "timeline.jsonl"
    write_timeline(path, [_obs(0)])
    with open(path, "a") as f:
        f.write(content)
    with pytest.raises(ValueError, match=needle):
        read_timeline(path)


def test_blank_lines_are_skipped_and_binary_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    write_timeline(path, [_obs(0)])
    path.write_text(path.read_text() + "\n\n")
    assert len(read_timeline(path)) == 1
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not a text file"):
        read_timeline(path)
