"""A source call that never returns (a /proc read stuck behind a process in the driver) must
cost the loop one deadline, then nothing, until it returns."""

from __future__ import annotations

import threading
import time

from watchdog.config import Config
from watchdog.daemon import Daemon, Sources
from watchdog.model import ProcSnapshot
from watchdog.signatures import load_signatures
from watchdog.sources.base import SourceHealth
from watchdog.sources.deadline import DeadlineCall


def test_a_stuck_call_marks_the_source_down_once_and_is_not_stacked() -> None:
    health = SourceHealth("procs")
    call = DeadlineCall("procs", health, deadline_s=0.2)
    release = threading.Event()
    calls: list[int] = []

    def stuck() -> int:
        calls.append(1)
        release.wait(30)
        return 7

    t0 = time.monotonic()
    assert call(stuck) is None
    assert 0.15 < time.monotonic() - t0 < 5
    assert not health.up and "did not return within 0.2 s" in (health.last_error or "")
    t1 = time.monotonic()
    assert call(stuck) is None  # skipped at once while the first is still stuck
    assert time.monotonic() - t1 < 0.1 and len(calls) == 1
    release.set()
    deadline = time.monotonic() + 5
    while call(lambda: 5) != 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    call.close()


class _StuckProcs:
    """A process source whose poll blocks like a /proc read of a process stuck in the driver."""

    name = "procs"

    def __init__(self) -> None:
        self.health = SourceHealth(self.name)
        self.release = threading.Event()

    def poll(self) -> ProcSnapshot:
        self.release.wait(60)
        self.health.ok()
        return ProcSnapshot(1, True, ())

    def pids(self) -> list[int]:
        return [1]


def test_the_loop_keeps_ticking_while_the_process_source_is_stuck() -> None:
    procs = _StuckProcs()
    cfg = Config(tick_s=0.2, metrics_addr="off", stacks=False, cdn_default=False)
    daemon = Daemon(cfg, load_signatures(), Sources(procs=procs))
    try:
        t0 = time.monotonic()
        for _ in range(5):
            daemon.tick()
        assert time.monotonic() - t0 < 1.0 + 2.0  # one deadline (1 s), then no waiting
        assert daemon.window.latest is not None and daemon.window.latest.procs is None
        assert daemon.window.latest.sources["procs"] is False
        procs.release.set()
        time.sleep(0.1)
        daemon.tick()
        assert daemon.window.latest.procs is not None
    finally:
        procs.release.set()
        daemon.close()
