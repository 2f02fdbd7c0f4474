"""Faults of an NCCL RAS peer (tests/rasstandin.py on 127.0.0.1, NCCL v2.29.7-1's protocol):
one that accepts and never answers, answers garbage, cuts its report short, trickles a byte a
second, nests its report 100 000 deep or sends `"size": 1e400`. For each the source marks
itself down with one warning, its thread never dies with a traceback, and it keeps trying:
the same peer answering properly later is up again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from tests.rasstandin import RasStandIn
from watchdog.sources.nccl_ras import RasClient, RasSource

pytestmark = pytest.mark.slow

HOSTILE = {
    "silent": "did not finish within",
    "garbage": "not an NCCL RAS service",
    "truncated": "unexpected RAS report",
    "slow": "did not finish within",
    "deep": "nested too deeply",
    "huge_size": "out of range",
}


@pytest.fixture
def thread_errors() -> Iterator[list[BaseException]]:
    """Exceptions that ended a thread (they would print `Exception in thread nccl-ras`)."""
    seen: list[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)  # type: ignore[assignment,misc,arg-type]
    yield seen
    threading.excepthook = old


@pytest.mark.parametrize("mode", sorted(HOSTILE))
def test_a_hostile_ras_peer_marks_the_source_down_once_and_it_keeps_trying(
    mode: str, thread_errors: list[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    srv = RasStandIn(mode)
    try:
        clock = [0.0]
        source = RasSource(RasClient(srv.addr, deadline_s=1.5), mode="on", interval_s=30,
                           configured=True, clock=lambda: clock[0])  # fmt: skip
        caplog.set_level(logging.INFO, logger="hang_watchdog.sources.nccl_ras")
        began = time.monotonic()
        for _ in range(3):  # three queries of the same fault: one warning
            source.poll()
            source.wait(10)
            clock[0] += 31
        assert time.monotonic() - began < 3 * 1.5 + 6  # each query under its deadline
        assert not thread_errors, thread_errors
        latest = source.poll()
        source.wait(10)
        assert latest["up"] is False and HOSTILE[mode] in (latest["error"] or ""), latest
        assert not source.health.up
        downs = [r for r in caplog.records if "is down" in r.getMessage()]
        assert len(downs) == 1, [r.getMessage() for r in caplog.records]
        srv.mode = "healthy"  # the peer recovers: the next query finds it
        clock[0] += 31
        source.poll()
        source.wait(10)
        assert source.poll()["up"] is True and source.health.up
        assert any("up again" in r.getMessage() for r in caplog.records)
    finally:
        srv.stop()
