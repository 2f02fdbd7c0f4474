"""The loop treats every source alike: a source added to the list is polled, held to its own
deadline and marked down, with nothing in the loop naming it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from watchdog.config import Config
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.daemon.loop import Daemon
from watchdog.sources.base import Deadline, SourceHealth, SourceTick


class _Probe:
    """A source no part of the loop knows by name; its poll can be made to block or raise."""

    name = "probe"
    part = "nccl_ras"

    def __init__(self, *, seconds: float = 0.3, inline: bool = False) -> None:
        self.health = SourceHealth(self.name)
        self.spec = Deadline(seconds, inline=inline, hint="a test probe held on purpose")
        self.release = threading.Event()
        self.release.set()
        self.raises: Exception | None = None
        self.polls = 0
        self.threads: list[str] = []
        self.seen: list[SourceTick] = []

    def deadline(self, tick_s: float) -> Deadline:
        return self.spec

    def poll(self, tick: SourceTick) -> Any:
        self.polls += 1
        self.threads.append(threading.current_thread().name)
        self.seen.append(tick)
        if self.raises is not None:
            raise self.raises
        self.release.wait(30)
        self.health.ok()
        return {"up": True, "polls": self.polls}

    def close(self) -> None:
        self.release.set()


class _Target:
    """A first source that hands a target on through the tick, as the procs source does."""

    name = "first"
    part = "procs"

    def __init__(self) -> None:
        self.health = SourceHealth(self.name)

    def deadline(self, tick_s: float) -> Deadline:
        return Deadline(1.0)

    def poll(self, tick: SourceTick) -> None:
        tick.target_pid, tick.tree_pids = 4242, (4242, 4243)
        self.health.ok()
        return None

    def close(self) -> None:
        return None


def _daemon(*sources: Any) -> Daemon:
    cfg = Config(tick_s=0.1, metrics_addr="off", stacks=False, cdn_default=False)
    return Daemon(cfg, load_signatures(), list(sources))


def test_a_listed_source_is_polled_deadlined_and_marked_down() -> None:
    probe = _Probe(seconds=0.3)
    daemon = _daemon(probe)
    try:
        obs = daemon.observe()
        assert obs.nccl_ras == {"up": True, "polls": 1} and obs.sources == {"probe": True}
        assert daemon.worst_tick_s() == pytest.approx(0.1 + 0.3)

        probe.release.clear()
        t0 = time.monotonic()
        obs = daemon.observe()
        assert 0.25 < time.monotonic() - t0 < 2.0  # one deadline, not the stuck poll
        assert obs.nccl_ras is None and obs.sources == {"probe": False}
        assert "probe poll did not return within 0.3 s" in (probe.health.last_error or "")
        assert "a test probe held on purpose" in (probe.health.last_error or "")

        t1 = time.monotonic()
        assert daemon.observe().sources == {"probe": False}
        assert time.monotonic() - t1 < 0.2 and probe.polls == 2  # skipped, not stacked

        probe.release.set()
        deadline = time.monotonic() + 5
        while (obs := daemon.observe()).nccl_ras is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert obs.sources == {"probe": True}
    finally:
        daemon.close()


def test_a_source_that_raises_is_marked_down_and_the_tick_goes_on() -> None:
    probe = _Probe()
    probe.raises = RuntimeError("a bug in the source")
    daemon = _daemon(probe)
    try:
        obs = daemon.observe()
        assert obs.nccl_ras is None and obs.sources == {"probe": False}
        assert "unexpected error" in (probe.health.last_error or "")
        assert "a bug in the source" in (probe.health.last_error or "")
    finally:
        daemon.close()


def test_an_inline_source_runs_on_the_loops_own_thread() -> None:
    """A source that bounds its own waits (the GPU source's worker) gets no second thread."""
    probe = _Probe(seconds=2.0, inline=True)
    daemon = _daemon(probe)
    try:
        daemon.observe()
        assert probe.threads == [threading.current_thread().name]
        assert daemon.worst_tick_s() == pytest.approx(0.1 + 2.0)
    finally:
        daemon.close()


def test_sources_run_in_list_order_and_share_the_tick() -> None:
    first, probe = _Target(), _Probe()
    daemon = _daemon(first, probe)
    try:
        daemon.observe()
        assert probe.seen[0].target_pid == 4242 and probe.seen[0].tree_pids == (4242, 4243)
        daemon.observe()
        assert probe.seen[1] is not probe.seen[0]  # a fresh tick each time
    finally:
        daemon.close()


def test_a_source_must_name_an_observation_field_of_its_own() -> None:
    stray = _Probe()
    stray.part = "not_a_field"
    with pytest.raises(ValueError, match="not an Observation field"):
        _daemon(stray)
    with pytest.raises(ValueError, match="both fill 'nccl_ras'"):
        _daemon(_Probe(), _Probe())
