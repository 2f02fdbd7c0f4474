"""Faults at the log path, against a live watchdog: rotation of every kind, a FIFO, hostile
lines. The loop keeps its tick, /healthz stays truthful, and the engine's death line is
still found after each fault (nothing the operator needs is lost)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import DEATH, FOUND, finish, wait_for, watch
from tests.shipped import PATTERNS

pytestmark = pytest.mark.slow


@pytest.fixture
def target() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "612"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_rename_rotation_loses_nothing(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO start\n")
    wd = watch(tmp_path, log, target)
    with log.open("a") as fh:
        fh.write("INFO before rotation\n")
    os.rename(log, tmp_path / "server.log.1")
    log.write_text(DEATH)
    wd.wait_line(FOUND)
    finish(wd)


def test_copytruncate_is_followed(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO start\n" * 200)
    wd = watch(tmp_path, log, target)
    os.truncate(log, 0)
    time.sleep(0.5)
    with log.open("a") as fh:
        fh.write(DEATH)
    wd.wait_line(FOUND)
    finish(wd)


def test_deleted_then_recreated(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO start\n")
    wd = watch(tmp_path, log, target)
    log.unlink()
    time.sleep(0.6)
    log.write_text(DEATH)
    wd.wait_line(FOUND)
    finish(wd)


def test_a_log_file_that_appears_late(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    wd = watch(tmp_path, log, target)
    wd.wait_line("does not exist")
    log.write_text(DEATH)
    wd.wait_line(FOUND)
    finish(wd)


def test_a_fifo_at_the_log_path_does_not_block(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    os.mkfifo(log)
    wd = watch(tmp_path, log, target)
    wd.wait_line("not a regular file")
    began = time.monotonic()
    finish(wd)  # SIGTERM ends it
    assert time.monotonic() - began < 10


def test_a_megabyte_line_without_newline_then_the_death(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    with log.open("a") as fh:
        fh.write("prompt: " + "word " * 200_000 + "\n")
        fh.write(DEATH)
    wd.wait_line(FOUND)
    finish(wd)


def test_binary_garbage_then_the_death(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    with log.open("ab") as fh:
        fh.write(bytes(range(256)) * 64 + b"\x00\xff\xfe\n\x1b[31m\x1b[0m\r\r\n")
        fh.write(DEATH.encode())
    wd.wait_line(FOUND)
    finish(wd)


def test_a_flood_of_lines_keeps_the_tick(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    stop = threading.Event()

    def flood() -> None:
        with log.open("a") as fh:
            while not stop.is_set():
                fh.write("INFO 12-01 10:00:00 [x.py:1] GET /v1/models 200 OK\n" * 2000)
                fh.flush()
                time.sleep(0.01)

    t = threading.Thread(target=flood)
    t.start()
    try:
        time.sleep(2)
        with log.open("a") as fh:
            fh.write(DEATH)
        wd.wait_line(FOUND, timeout=30)
    finally:
        stop.set()
        t.join()
    finish(wd)


def test_a_blocking_reader_is_cut_off_by_the_deadline() -> None:
    """A read that never returns (a hung network mount) costs one deadline, then the loop
    skips the log source; what the read returns later is still delivered."""
    from watchdog.config import Config
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.daemon.loop import Daemon
    from watchdog.sources.logs.source import LogSource
    from watchdog.sources.logs.split import Block

    release = threading.Event()

    class HungMount:
        name, error = "/mnt/nfs/server.log", None

        def read_blocks(self) -> list[Block]:
            release.wait(30)
            line = b"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
            return [Block(line)]

        def close(self) -> None:
            release.set()

    sigs = load_signatures([])
    logs = LogSource([HungMount()], keep=sigs.log_keep_pattern(), patterns=PATTERNS)
    cfg = Config(tick_s=0.1, gpu_source="none", cdn_default=False)
    d = Daemon(cfg, sigs, [logs])
    try:
        took = []
        for _ in range(5):
            began = time.monotonic()
            d.tick()
            took.append(time.monotonic() - began)
        assert max(took) < d.worst_tick_s() + 0.5 and sum(took[1:]) < 1.0
        assert not logs.health.up and "hung network mount" in (logs.health.last_error or "")
        release.set()
        wait_for(lambda: d.tick().signature == "engine_dead", timeout=5)
    finally:
        d.close()
