"""Faults: hostile clients of the exporter (slowloris, early hang-ups, a scrape flood) against
a live watchdog. /healthz keeps answering, threads stay bounded, no traceback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.faults.harness import QUIET, Watchdog

pytestmark = pytest.mark.slow


@pytest.fixture
def wd(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text("")
    w = Watchdog(
        tmp_path, *QUIET, "--log-file", str(log), "--metrics-addr", "127.0.0.1:0", "--tick-s", "0.2"
    )
    w.port()
    yield w
    w.stop()


def test_slowloris_connections_are_bounded_and_healthz_answers(wd: Watchdog) -> None:
    socks = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", wd.port()), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            socks.append(s)
        proc = psutil.Process(wd.proc.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(1.0)
        busy = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        assert busy < 0.5, f"300 idle connections keep the watchdog {busy:.0%} busy"
        threads = proc.num_threads()
        assert threads < 120, f"{threads} threads for 300 idle connections"
        assert wd.get("/healthz")[0] == 200
    finally:
        for s in socks:
            s.close()
    wd.assert_clean()


def test_clients_that_hang_up_early_leave_no_traceback(wd: Watchdog) -> None:
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", wd.port()), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[: 10 + i % 20])
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # RST mid-request
    for _ in range(20):  # and whole requests whose reply is never read
        s = socket.create_connection(("127.0.0.1", wd.port()), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    time.sleep(0.5)
    assert wd.get("/healthz")[0] == 200
    wd.assert_clean()
    assert "Exception occurred during processing" not in wd.stderr


def test_a_scrape_flood_is_served(wd: Watchdog) -> None:
    errors: list[str] = []
    lock = threading.Lock()

    def scrape(_: int) -> float:
        began = time.monotonic()
        try:
            status, body = wd.get("/metrics", timeout=20)
            assert status == 200 and "hang_watchdog_" in body
        except Exception as exc:  # collected: the assertion below says how many failed
            with lock:
                errors.append(repr(exc))
        return time.monotonic() - began

    with ThreadPoolExecutor(max_workers=50) as pool:
        took = sorted(pool.map(scrape, range(200)))
    assert len(errors) <= 200 * 0.02, errors[:3]
    print(f"200 scrapes, 50 at a time: p50 {took[100]:.3f} s, p99 {took[197]:.3f} s")
    assert wd.get("/healthz")[0] == 200
    wd.assert_clean()


def test_idle_connections_time_out(wd: Watchdog, monkeypatch: pytest.MonkeyPatch) -> None:
    from watchdog.outputs import metrics_http

    s = socket.create_connection(("127.0.0.1", wd.port()), timeout=30)
    began = time.monotonic()
    with contextlib.suppress(OSError):
        data = s.recv(10)  # the server closes it: recv returns b"" at its timeout
        assert data == b""
    waited = time.monotonic() - began
    assert waited < metrics_http.CONNECTION_TIMEOUT_S * 2
    s.close()
