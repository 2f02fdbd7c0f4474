"""ServerSource against vLLM-shaped /metrics text served by a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from watchdog.engines.detect import EngineInForce
from watchdog.engines.loader import load_engines
from watchdog.sources.base import SourceTick
from watchdog.sources.httpget import HttpGet
from watchdog.sources.server import ServerSource, parse_server_metrics, samples_of

ENGINES = load_engines()  # the profiles; the engine in force comes in each poll's tick
SAMPLES = samples_of(ENGINES)  # what a server of an engine not yet recognised is read with

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
    s = parse_server_metrics(_text(name), SAMPLES)
    assert s.up
    assert (s.iterations, s.prompt_tokens, s.generation_tokens, s.running, s.waiting) == expected


def test_parse_step_counter_is_the_histogram_count_not_sum_or_bucket() -> None:
    text = _text("vllm_metrics_serving.txt")
    count_line = next(
        ln for ln in text.splitlines() if ln.startswith("vllm:iteration_tokens_total_count")
    )
    assert parse_server_metrics(text, SAMPLES).iterations == float(count_line.rsplit(" ", 1)[1])


def test_parse_missing_metrics_are_none() -> None:
    s = parse_server_metrics("# TYPE other gauge\nother 1.0\n", SAMPLES)
    assert s.up and s.iterations is None and s.running is None


def test_parse_garbage_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_server_metrics("vllm:num_requests_running{engine=0 model} oops\n", SAMPLES)


def test_bad_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an http"):
        ServerSource("127.0.0.1:8000", engines=ENGINES)


def test_poll_reads_metrics_and_health(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, _text("vllm_metrics_dp2.txt"))
    server.routes["/health"] = (200, "")
    src = ServerSource(server.url + "/", engines=ENGINES)
    try:
        s = src.poll()
    finally:
        src.close()
    assert s.up and s.health_status == 200 and s.iterations == 62 and s.error is None
    assert src.health.up


def test_engine_dead_health_503_is_recorded(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, _text("vllm_metrics_serving.txt"))
    server.routes["/health"] = (503, "")
    client = HttpGet(urlsplit(server.url))
    try:
        s = ServerSource(server.url, client=client, engines=ENGINES).poll()
    finally:
        client.close()
    assert s.up and s.health_status == 503


def test_metrics_404_marks_down_but_keeps_health(server: FakeVllm) -> None:
    server.routes["/health"] = (200, "")
    src = ServerSource(server.url, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "HTTP 404" in (s.error or "") and s.health_status == 200
    assert not src.health.up and "404" in (src.health.last_error or "")


def test_garbage_body_marks_down(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, "<html>{{ not metrics\n")
    src = ServerSource(server.url, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "Prometheus" in (s.error or "")


def test_recovers_after_failure(server: FakeVllm) -> None:
    src = ServerSource(server.url, engines=ENGINES)
    assert not src.poll().up
    server.routes["/metrics"] = (200, _text("vllm_metrics_fresh.txt"))
    assert src.poll().up and src.health.up
    src.close()


def test_connection_refused_gives_no_health_status() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    src = ServerSource(f"http://127.0.0.1:{port}", timeout_s=1.0, engines=ENGINES)
    sample = src.poll()
    src.close()
    assert not sample.up and sample.health_status is None and sample.error
    assert not src.health.up


def test_server_that_never_answers_fails_within_timeout(silent_port: int) -> None:
    src = ServerSource(f"http://127.0.0.1:{silent_port}", timeout_s=0.3, engines=ENGINES)
    start = time.monotonic()
    sample = src.poll()
    elapsed = time.monotonic() - start
    src.close()
    assert not sample.up and "timed out" in (sample.error or "")
    assert sample.health_status is None
    # httpx's own default is 5 s; a generous bound that still proves our timeout was applied.
    assert elapsed < 4.0


SGLANG_PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",tp_rank="0"} 2.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 1200.0
sglang:generation_tokens_total{model_name="m"} 345.0
vllm:prompt_tokens_total{model_name="m"} 99.0
"""


def _forced(name: str) -> SourceTick:
    """A tick whose engine in force is `name`, as --engine makes it."""
    return SourceTick(engine=EngineInForce.at_start(ENGINES, name))


def test_sglang_metrics_and_health_read_through_its_profile(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, SGLANG_PAGE)
    server.routes["/health"] = (503, "")
    src = ServerSource(server.url, engines=ENGINES)
    s = src.poll(_forced("sglang"))
    src.close()
    assert (s.prompt_tokens, s.generation_tokens, s.running, s.waiting) == (1200, 345, 3, 2)
    assert s.iterations is None  # SGLang has no per-step counter
    assert s.health_status == 503 and s.health_meaning == "not_generating"


def test_vllm_503_stays_dead(server: FakeVllm) -> None:
    server.routes["/metrics"] = (200, _text("vllm_metrics_serving.txt"))
    server.routes["/health"] = (503, "")
    src = ServerSource(server.url, engines=ENGINES)
    s = src.poll(_forced("vllm"))
    src.close()
    assert s.health_meaning == "dead" and s.prompt_tokens == 12480


def test_trtllm_prometheus_path(server: FakeVllm) -> None:
    # tensorrt_llm/metrics/collector.py names, served at /prometheus/metrics (openai_server.py)
    server.routes["/prometheus/metrics"] = (
        200,
        'trtllm_generation_tokens_total{model_name="m",engine_type="trtllm"} 77.0\n'
        'trtllm_num_requests_running{model_name="m",engine_type="trtllm"} 4.0\n',
    )
    server.routes["/health"] = (200, "")
    src = ServerSource(server.url, engines=ENGINES)
    s = src.poll(_forced("trtllm"))
    src.close()
    assert s.up and (s.generation_tokens, s.running, s.health_meaning) == (77, 4, "ok")


def test_huge_value_and_nan_are_skipped_not_raised() -> None:
    # A 400-digit value raised OverflowError out of the parse.
    page = (
        "vllm:num_requests_running " + "9" * 400 + "\n"
        "vllm:num_requests_waiting NaN\n"
        'vllm:prompt_tokens_total{model_name="m"} 5\n'
    )
    s = parse_server_metrics(page, SAMPLES)
    assert s.up and s.running is None and s.waiting is None and s.prompt_tokens == 5


def test_page_of_unrelated_series_is_read_fast_and_bounded() -> None:
    # 300k unrelated series cost seconds of GIL-held parsing per scrape.
    noise = "".join(f'other_metric{{id="{i}"}} {i}\n' for i in range(300_000))
    many = "".join(f'vllm:prompt_tokens_total{{id="{i}"}} 1\n' for i in range(10_000))
    start = time.perf_counter()
    s = parse_server_metrics(noise + many, SAMPLES)
    took = time.perf_counter() - start
    print(f"300k unrelated + 10k wanted series parsed in {took:.3f} s")
    from watchdog.sources.server import MAX_SERIES

    assert s.prompt_tokens == MAX_SERIES  # series beyond the bound are not summed


DEFAULT_RUN = """
import sys
from watchdog.config import build_config
from watchdog.daemon.wiring import build
cfg = build_config({
    "pid": int(sys.argv[1]), "server_url": sys.argv[2], "gpu_source": "file:" + sys.argv[3],
    "cdn_default": False, "metrics_addr": "127.0.0.1:0", "stacks": True,
})
built = build(cfg)
for _ in range(2):
    built.daemon.tick()
built.close()
print(sorted(m for m in sys.modules if m.split(".")[0] in ("httpx", "httpcore", "h11", "anyio")))
"""


def test_the_default_daemon_never_loads_httpx(server: FakeVllm, tmp_path: Path) -> None:
    # httpx's first request imports httpcore, h11, anyio and more (3 MiB RSS in a
    # clean venv, 9 MiB here); only the canary, the smoke test, dcgm: and fleet queries use it.
    import subprocess
    import sys

    from tests.simfixtures import sim_env

    server.routes["/metrics"] = (200, _text("vllm_metrics_serving.txt"))
    server.routes["/health"] = (200, "")
    gpu = tmp_path / "gpu.jsonl"
    gpu.write_text("")
    argv = [sys.executable, "-c", DEFAULT_RUN, str(os.getpid()), server.url, str(gpu)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=sim_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
