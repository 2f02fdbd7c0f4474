"""The exporter's own HTTP server (outputs/metrics_http.py) on 127.0.0.1: what it answers, where
it listens by default, that hostile clients hold neither a scrape nor the daemon's loop, and that
the default daemon loads none of the HTTP and TLS stack it replaced."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_families,
)
from prometheus_client.parser import text_string_to_metric_families

from watchdog.config import Config
from watchdog.core.model import Observation, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.metrics_http import DEFAULT_ADDR, MetricsServer, parse_addr

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def sink() -> MetricsSink:
    return MetricsSink(("engine_dead",), version="1")


@pytest.fixture
def addr(sink: MetricsSink) -> Iterator[tuple[str, int]]:
    server = MetricsServer(sink, "127.0.0.1:0")
    yield server.start()
    server.stop()


def _raw(addr: tuple[str, int], request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until the server closes (or resets: it closed with bytes of ours
    unread, which discards what it sent too)."""
    chunks = []
    with socket.create_connection(addr, timeout=timeout) as s:
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            chunks.append(b"<reset>")
    return b"".join(chunks)


def test_text_format_with_its_content_type(addr: tuple[str, int]) -> None:
    resp = httpx.get(f"http://{addr[0]}:{addr[1]}/metrics", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    names = {f.name for f in text_string_to_metric_families(resp.text)}
    assert {"hang_watchdog_hang", "hang_watchdog_incidents"} <= names


def test_openmetrics_with_its_content_type(addr: tuple[str, int]) -> None:
    accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2"
    url = f"http://{addr[0]}:{addr[1]}/metrics?x=1"
    resp = httpx.get(url, headers={"Accept": accept}, timeout=10)
    want = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert resp.headers["content-type"] == want
    assert "hang_watchdog_state" in {f.name for f in om_families(resp.text)}


def test_other_paths_methods_and_garbage(addr: tuple[str, int]) -> None:
    base = f"http://{addr[0]}:{addr[1]}"
    assert httpx.get(f"{base}/", timeout=10).status_code == 404
    assert httpx.get(f"{base}/metricsx", timeout=10).status_code == 404
    resp = httpx.post(f"{base}/metrics", content=b"x", timeout=10)
    assert (resp.status_code, resp.headers["allow"]) == (405, "GET")
    assert _raw(addr, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.0 400 ")
    assert _raw(addr, b"GET /healthz HTTP/1.0\n\n").startswith(b"HTTP/1.0 200 OK\r\n")
    huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 70000  # a head past 64 KiB is refused
    assert _raw(addr, huge).startswith((b"HTTP/1.0 400 ", b"<reset>"))
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200


def test_binds_loopback_by_default(sink: MetricsSink) -> None:
    assert parse_addr(Config().metrics_addr) == parse_addr(DEFAULT_ADDR) == ("127.0.0.1", 9433)
    server = MetricsServer(sink, DEFAULT_ADDR.replace(":9433", ":0"))
    host, port = server.start()
    try:
        assert host == "127.0.0.1"
        with socket.create_connection((host, port), timeout=5):
            pass
    finally:
        server.stop()


def test_a_failing_sink_gets_500_and_the_server_serves_on(sink: MetricsSink) -> None:
    class Broken(MetricsSink):
        def collect(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    server = MetricsServer(Broken(("x",), version="1"), "127.0.0.1:0")
    host, port = server.start()
    try:
        assert httpx.get(f"http://{host}:{port}/metrics", timeout=10).status_code == 500
        assert httpx.get(f"http://{host}:{port}/healthz", timeout=10).status_code == 200
    finally:
        server.stop()


def test_slow_and_silent_clients_hold_neither_a_scrape_nor_the_loop(tmp_path: Path) -> None:
    """A real daemon (build(), tick 0.1 s) with its exporter: 200 connections that send half a
    request or nothing, and one whose reply is never read; scrapes still answer at once and
    the loop keeps ticking (each tick updates the sink, so /healthz stays 200)."""
    from watchdog.daemon.wiring import build

    log = tmp_path / "server.log"
    log.write_text("")
    cfg = Config(
        gpu_source="none",
        log_files=[str(log)],
        metrics_addr="127.0.0.1:0",
        metrics_stale_s=2.0,
        tick_s=0.1,
        stacks=False,
        cdn_default=False,
    )
    built = build(cfg)
    assert built.server is not None and built.metrics is not None
    host, port = built.server.start()
    stop = threading.Event()
    loop = threading.Thread(target=built.daemon.run, args=(stop,), daemon=True)
    loop.start()
    socks: list[socket.socket] = []
    try:
        for i in range(200):
            s = socket.create_connection((host, port), timeout=5)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            socks.append(s)
        unread = socket.create_connection((host, port), timeout=5)
        unread.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # the reply is never read
        socks.append(unread)
        before = built.metrics.seconds_since_loop()
        for _ in range(10):
            began = time.monotonic()
            resp = httpx.get(f"http://{host}:{port}/healthz", timeout=5)
            assert resp.status_code == 200, resp.text
            assert time.monotonic() - began < 2.0
            time.sleep(0.2)
        assert built.metrics.seconds_since_loop() < 1.0, (before, "the loop stopped ticking")
        assert "hang_watchdog_state" in httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
    finally:
        for s in socks:
            s.close()
        stop.set()
        loop.join(timeout=10)
        built.close()


IMPORTS = """
import sys, threading
from watchdog.config import Config
from watchdog.daemon.wiring import build
log = sys.argv[1]
cfg = Config(gpu_source="none", log_files=[log], metrics_addr="127.0.0.1:0", stacks=False,
             cdn_default=False, pid=int(sys.argv[2]))
built = build(cfg)
built.server.start()
built.daemon.tick()
built.close()
heavy = ("prometheus_client", "http.server", "http.client", "ssl", "email", "hashlib",
         "urllib.request")
print(" ".join(m for m in heavy if m in sys.modules) or "none")
"""


def test_the_default_daemon_loads_no_http_or_tls_stack(tmp_path: Path) -> None:
    """Memory: prometheus_client's exposition and http.server bring http.client, ssl (libssl,
    libcrypto) and email, hashlib brings libcrypto; a daemon with its exporter, log source and
    process tree loads none of them (a fresh interpreter, so other tests' imports do not count)."""
    log = tmp_path / "server.log"
    log.write_text("")
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS, str(log), str(__import__("os").getpid())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["none"], out.stderr[-2000:]


def test_observe_then_scrape_follows_the_verdict(sink: MetricsSink, addr: tuple[str, int]) -> None:
    sink.observe(Observation(t=1.0, wall=2.0), Verdict(state="serving"), 0.1)
    text = httpx.get(f"http://{addr[0]}:{addr[1]}/metrics", timeout=10).text
    states = next(
        f for f in text_string_to_metric_families(text) if f.name == "hang_watchdog_state"
    )
    assert [s.labels["state"] for s in states.samples if s.value == 1.0] == ["serving"]
