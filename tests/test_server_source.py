"""ServerSource against vLLM-shaped /metrics text served by a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from watchdog.sources.server import ServerSource, parse_server_metrics

DATA = Path(__file__).parent / "data"


def _text(name: str) -> str:
    return (DATA / name).read_text()


class FakeVllm:
    """A simulated vLLM API server: routes -> (status, body), changeable while it runs."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, str]] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                status, body = routes.get(self.path, (404, "not found"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[FakeVllm]:
    fake = FakeVllm()
    yield fake
    fake.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener that accepts connections and never answers."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    yield lsock.getsockname()[1]
    lsock.close()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vllm_metrics_serving.txt", (127, 12480, 3375, 3, 1)),
        ("vllm_metrics_dp2.txt", (62, 1600, 370, 3, 4)),
        ("vllm_metrics_fresh.txt", (0, 0, 0, 0, 0)),
    ],
)
def test_parse_sums_over_engines(name: str, expected: tuple[float, ...]) -> None:
    s = parse_server_metrics(_text(name))
    assert s.up
    assert (s.iterations, s.prompt_tokens, s.generation_tokens, s.running, s.waiting) == expected


def test_parse_step_counter_is_the_histogram_count_not_sum_or_bucket() -> None:
    text = _text("vllm_metrics_serving.txt")
    count_line = next(
        ln for ln in text.splitlines() if ln.startswith("vllm:iteration_tokens_total_count")
    )
    assert parse_server_metrics(text).iterations == float(count_line.rsplit(" ", 1)[1])


def test_parse_missing_metrics_are_none() -> None:
    s = parse_server_metrics("# TYPE other gauge\nother 1.0\n")
    assert s.up and s.iterations is None and s.running is None


def test_parse_garbage_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_server_metrics("vllm:num_requests_running{engine=0 model} oops\n")


def test_bad_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an http"):
        ServerSource("127.0.0.1:8000")


def test_poll_reads_metrics_and_health(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, _text("vllm_metrics_dp2.txt"))
    server.routes["/health"] = (200, "")
    src = ServerSource(server.url + "/")
    try:
        s = src.poll()
    finally:
        src.close()
    assert s.up and s.health_status == 200 and s.iterations == 62 and s.error is None
    assert src.health.up


def test_engine_dead_health_503_is_recorded(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, _text("vllm_metrics_serving.txt"))
    server.routes["/health"] = (503, "")
    with httpx.Client() as client:
        s = ServerSource(server.url, client=client).poll()
    assert s.up and s.health_status == 503


def test_metrics_404_marks_down_but_keeps_health(server: FakeVllm) -> None:
    server.routes["/health"] = (200, "")
    src = ServerSource(server.url)
    s = src.poll()
    src.close()
    assert not s.up and "HTTP 404" in (s.error or "") and s.health_status == 200
    assert not src.health.up and "404" in (src.health.last_error or "")


def test_garbage_body_marks_down(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, "<html>{{ not metrics\n")
    src = ServerSource(server.url)
    s = src.poll()
    src.close()
    assert not s.up and "Prometheus" in (s.error or "")


def test_recovers_after_failure(server: FakeVllm) -> None:
    src = ServerSource(server.url)
    assert not src.poll().up
    server.routes["/metrics"] = (200, _text("vllm_metrics_fresh.txt"))
    assert src.poll().up and src.health.up
    src.close()


def test_connection_refused_gives_no_health_status() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    src = ServerSource(f"http://127.0.0.1:{port}", timeout_s=1.0)
    sample = src.poll()
    src.close()
    assert not sample.up and sample.health_status is None and sample.error
    assert not src.health.up


def test_server_that_never_answers_fails_within_timeout(silent_port: int) -> None:
    src = ServerSource(f"http://127.0.0.1:{silent_port}", timeout_s=0.3)
    start = time.monotonic()
    sample = src.poll()
    elapsed = time.monotonic() - start
    src.close()
    assert not sample.up and "timed out" in (sample.error or "")
    assert sample.health_status is None
    # httpx's own default is 5 s; a generous bound that still proves our timeout was applied.
    assert elapsed < 4.0
