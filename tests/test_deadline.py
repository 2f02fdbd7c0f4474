"""A source call that never returns (a /proc read stuck behind a process in the driver) must
cost the loop one deadline, then nothing, until it returns."""

from __future__ import annotations

import threading
import time

from watchdog.config import Config
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import ProcSnapshot
from watchdog.daemon.loop import Daemon
from watchdog.engines.loader import load_engines
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, proc_deadline
from watchdog.sources.deadline import DeadlineCall

ENGINES = load_engines()


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
    part = "procs"

    def __init__(self) -> None:
        self.health = SourceHealth(self.name)
        self.release = threading.Event()

    def deadline(self, tick_s: float) -> Deadline:
        return proc_deadline(tick_s)

    def poll(self, tick: SourceTick) -> ProcSnapshot:
        self.release.wait(60)
        self.health.ok()
        return ProcSnapshot(1, True, ())

    def close(self) -> None:
        self.release.set()


def test_the_loop_keeps_ticking_while_the_process_source_is_stuck() -> None:
    procs = _StuckProcs()
    cfg = Config(tick_s=0.2, metrics_addr="off", stacks=False, cdn_default=False)
    daemon = Daemon(cfg, load_signatures(), [procs])
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


class _Trickle:
    """A loopback HTTP server that answers /metrics one byte at a time, for ever: each read
    meets httpx's timeout, the response never ends."""

    def __init__(self) -> None:
        import socket

        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.is_set():
                try:
                    conn.sendall(b"#")
                except OSError:
                    return
                time.sleep(0.3)

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def test_a_trickling_server_cannot_hold_the_loop() -> None:
    from watchdog.sources.server import ServerSource

    trickle = _Trickle()
    vllm = ServerSource(f"http://127.0.0.1:{trickle.port}", timeout_s=1.0, engines=ENGINES)
    cfg = Config(tick_s=0.2, metrics_addr="off", stacks=False, cdn_default=False)
    daemon = Daemon(cfg, load_signatures(), [vllm])
    try:
        t0 = time.monotonic()
        # In a thread: without the deadline the first tick would never return, and the test
        # must fail, not hang.
        loop = threading.Thread(target=lambda: [daemon.tick() for _ in range(4)], daemon=True)
        loop.start()
        loop.join(timeout=30)
        assert not loop.is_alive(), "a tick is stuck in the trickling scrape"
        # One scrape deadline (2 requests x 1 s + 1 s), then the stuck scrape is skipped.
        assert time.monotonic() - t0 < 3.0 + 2.0
        assert daemon.window.latest.sources["server"] is False
    finally:
        trickle.close()
        daemon.close()
