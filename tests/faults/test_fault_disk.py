"""Faults: the incident disk is full. The watchdog backs off, prunes old bundles to make room,
and a full disk never blocks a restart."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from watchdog.config import build_config
from watchdog.daemon.wiring import build
from watchdog.outputs import incident as incident_mod

DEATH = (
    "ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
)


def daemon_on(tmp_path: Path, **extra: Any) -> Any:
    log = tmp_path / "server.log"
    log.write_text("")
    cfg = build_config(
        {
            "log_files": [str(log)],
            "gpu_source": "none",
            "cdn_default": False,
            "metrics_addr": "off",
            "tick_s": 0.05,
            "incident_dir": str(tmp_path / "incidents"),
            "pid": os.getpid(),
            "stacks": False,
            **extra,
        }
    )
    built = build(cfg)
    built.daemon.tick()  # joins the file at its end
    with log.open("a") as fh:
        fh.write(DEATH)
    return built


def full_disk(monkeypatch: pytest.MonkeyPatch, fails: list[int]) -> None:
    """Every bundle write fails with ENOSPC while `fails[0]` > 0."""
    real = incident_mod.write_timeline

    def write_timeline(path: Path, obs: Any) -> None:
        if fails[0] > 0:
            fails[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, obs)

    monkeypatch.setattr(incident_mod, "write_timeline", write_timeline)


def test_a_full_disk_is_retried_with_backoff_not_every_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    full_disk(monkeypatch, [10**6])
    built = daemon_on(tmp_path)
    try:
        for _ in range(200):  # 10 s of ticks at 0.05 s
            built.daemon.tick()
    finally:
        built.close()
    assert built.daemon.verdict is not None and built.daemon.verdict.signature == "engine_dead"
    errors = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert 1 <= len(errors) <= 2, errors
    assert "No space left on device" in errors[0] and "retrying in" in errors[0]


def test_a_full_disk_costs_the_oldest_bundle_not_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "incidents"
    root.mkdir()
    old = root / "20200101T000000Z-engine_dead"
    old.mkdir()
    (old / "incident.json").write_text("{}")
    full_disk(monkeypatch, [1])  # the first try fails, the one after pruning succeeds
    built = daemon_on(tmp_path)
    try:
        for _ in range(10):
            built.daemon.tick()
    finally:
        built.close()
    assert not old.exists()
    assert built.episodes.incidents and built.episodes.incidents[0].exists()


def test_retention_runs_before_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "incidents"
    root.mkdir()
    for i in range(3):
        (root / f"2020010{i + 1}T000000Z-stalled").mkdir()
    full_disk(monkeypatch, [10**6])
    built = daemon_on(tmp_path, max_incidents=2)
    try:
        for _ in range(5):
            built.daemon.tick()
    finally:
        built.close()
    left = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    assert len(left) <= 1, left  # room made for the new bundle even though it then failed


def test_a_full_disk_does_not_block_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from watchdog.daemon.episodes import Episode, EpisodeHook

    episodes = EpisodeHook(writer=object())
    episodes.episode = Episode(started_t=1.0, started_wall=2.0, write_failures=1)
    assert episodes.evidence_key() == ("episode", 1.0)  # what remediation waits for
    episodes.episode.write_failures = 0
    assert episodes.evidence_key() is None  # still waiting for the bundle


def test_logging_stays_quiet_when_the_disk_stays_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    full_disk(monkeypatch, [10**6])
    built = daemon_on(tmp_path)
    try:
        for _ in range(400):
            built.daemon.tick()
    finally:
        built.close()
    assert len(caplog.records) < 20
