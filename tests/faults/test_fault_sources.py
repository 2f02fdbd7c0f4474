"""Faults in the GPU file, the server's HTTP endpoints and the process, against a live
watchdog: each is said once per outage, recovery is said, and the loop keeps ticking."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.faults.harness import Watchdog, wait_for

pytestmark = pytest.mark.slow

BASE = ("--no-cdn-default", "--tick-s", "0.2", "--metrics-addr", "127.0.0.1:0", "--no-stacks")
METRICS = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
)


@pytest.fixture
def target() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "612"])
    yield proc
    proc.kill()
    proc.wait()


# -- the GPU file lies ----------------------------------------------------------------------


def test_gpu_file_lies_are_skipped_and_said(tmp_path: Path, target) -> None:
    gpu = tmp_path / "gpu.jsonl"
    gpu.write_text("")
    wd = Watchdog(tmp_path, *BASE, "--gpu-source", f"file:{gpu}", "--pid", str(target.pid))
    wd.port()
    with gpu.open("a") as fh:
        fh.write('{"gpu": 99999999999999999999999, "sm": 0.5, "dram": 0.5}\n')
        fh.write('{"gpu": 0, "sm": 50, "dram": 0.5}\n')
        fh.write("not json\n")
        fh.write('{"gpu": 0, "sm": 0.5, "dram": 0.5, "ts": 99999999999}\n')
    wd.wait_line(r"line 1 skipped: .*integer 0-1023")
    wd.wait_line(r"line 2 skipped: .*outside 0-1")
    wd.wait_line(r"line 3 skipped: not valid JSON")
    # The writer stops; its last line claimed a time far in the future: still goes stale.
    wd.wait_line(r"source gpu is down: no GPU samples", timeout=20)
    wait_for(lambda: 'hang_watchdog_source_up{source="gpu"} 0.0' in wd.get("/metrics")[1])
    assert wd.get("/healthz")[0] == 200
    wd.stop()
    wd.assert_clean()


# -- the server's HTTP endpoints ------------------------------------------------------------


class Stub:
    """A loopback /metrics + /health whose behaviour a test switches while it runs."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.health = [200]
        self.calls = 0
        self.health_calls = 0  # /health answers cycle through `health` per /health request
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                stub.calls += 1
                if stub.mode == "hang":
                    time.sleep(30)
                    return
                if self.path.startswith("/health"):
                    # Counted apart from /metrics: the two are probed at once, in either order.
                    stub.health_calls += 1
                    code = stub.health[stub.health_calls % len(stub.health)]
                    self._send(code, b"")
                elif stub.mode == "garbage":
                    self._send(200, b"\x00\xff{{{ not prometheus\n" * 100)
                elif stub.mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    for _ in range(300):
                        self.wfile.write(b"#")
                        self.wfile.flush()
                        time.sleep(0.1)
                elif stub.mode == "oversize":  # past the 32 MiB limit, then cut off by us
                    self.send_response(200)
                    self.send_header("Content-Length", str(40 << 20))
                    self.end_headers()
                    with contextlib.suppress(OSError):
                        for _ in range(40):
                            self.wfile.write(METRICS.encode().ljust(1 << 20, b"#"))
                elif stub.mode == "busy":  # a 503 with a body
                    self._send(503, b'{"error":"overloaded, try later"}' * 500)
                elif stub.mode == "short":  # closes before the promised length
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    self.wfile.write(METRICS.encode())
                    self.close_connection = True
                else:
                    self._send(200, METRICS.encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def server_watchdog(tmp_path: Path, stub: Stub, pid: int) -> Watchdog:
    wd = Watchdog(
        tmp_path, *BASE, "--gpu-source", "none", "--pid", str(pid),
        "--server-url", f"http://127.0.0.1:{stub.port}",
    )  # fmt: skip
    wd.port()
    return wd


def test_a_metrics_endpoint_that_never_answers_is_down_each_outage(
    tmp_path: Path, stub: Stub, target
) -> None:
    wd = server_watchdog(tmp_path, stub, target.pid)
    wait_for(lambda: 'hang_watchdog_source_up{source="server"} 1.0' in wd.get("/metrics")[1])
    # the old label value follows the new one for a release (docs/metrics-and-alerts.md)
    assert 'hang_watchdog_source_up{source="vllm"} 1.0' in wd.get("/metrics")[1]
    stub.mode = "hang"
    wd.wait_line(r"source server is down", timeout=20)
    stub.mode = "ok"
    wd.wait_line(r"source server is up again", timeout=40)
    stub.mode = "hang"
    wait_for(lambda: wd.stderr.count("source server is down") >= 2, timeout=20)
    assert wd.get("/healthz")[0] == 200
    wd.stop()
    wd.assert_clean()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("garbage", r"not Prometheus text"),
        ("trickle", r"timed out after 2 s"),
        ("oversize", r"more than 32 MiB; is this the server's /metrics\?"),
        ("busy", r"answered HTTP 503"),
        ("short", r"IncompleteRead"),
    ],
)
def test_a_hostile_metrics_body_marks_the_source_down(
    tmp_path: Path, stub: Stub, target, mode: str, why: str
) -> None:
    stub.mode = mode
    wd = server_watchdog(tmp_path, stub, target.pid)
    wd.wait_line(r"source server is down: .*" + why, timeout=20)
    assert wd.get("/healthz")[0] == 200
    wd.stop()
    wd.assert_clean()


def test_a_flapping_health_is_not_a_dead_engine(tmp_path: Path, stub: Stub, target) -> None:
    stub.health = [200, 503]
    wd = server_watchdog(tmp_path, stub, target.pid)
    time.sleep(4)  # about 20 ticks of 200, 503, 200, 503...
    assert "dead" not in wd.stderr
    stub.health = [503]
    wd.wait_line(r"-> dead: engine_dead", timeout=20)
    wd.stop()
    wd.assert_clean()


# -- the process --------------------------------------------------------------------------


def test_a_stopped_server_is_named_and_its_resume_seen(tmp_path: Path, target) -> None:
    wd = Watchdog(tmp_path, *BASE, "--gpu-source", "none", "--pid", str(target.pid))
    wd.port()
    wd.wait_line(r"state: - -> ")
    target.send_signal(signal.SIGSTOP)
    wd.wait_line(rf"-> stalled: pid {target.pid} \(.*\) is stopped \(state T\)")
    target.send_signal(signal.SIGCONT)
    wd.wait_line(r"stalled -> ", timeout=20)
    wd.stop()
    wd.assert_clean()


def test_a_vanished_server_is_dead_and_the_watchdog_keeps_watching(tmp_path: Path, target) -> None:
    wd = Watchdog(tmp_path, *BASE, "--gpu-source", "none", "--pid", str(target.pid))
    wd.port()
    wd.wait_line(r"state: - -> ")
    target.kill()
    target.wait()
    wd.wait_line(r"-> dead", timeout=20)
    time.sleep(0.5)
    assert wd.proc.poll() is None and wd.get("/healthz")[0] == 200
    wd.stop()
    wd.assert_clean()
