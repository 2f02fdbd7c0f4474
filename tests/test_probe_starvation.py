"""A /health that fails only while our own /metrics scrape runs is probe starvation, not a hang
(SGLang renders /metrics on the loop that answers /health: sgl-project/sglang#28157)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from watchdog.core.model import ServerSample
from watchdog.engines.detect import EngineInForce
from watchdog.knowledge import load_knowledge
from watchdog.sources.base import SourceTick
from watchdog.sources.server import ServerSource
from watchdog.sources.starvation import MAX_SCRAPE_EVERY, StarvationJudge

METRICS = b"sglang:num_running_reqs 1\nsglang:generation_tokens_total 42\n"
RENDER_S = 1.2  # how long the server's loop is busy rendering one /metrics page
TIMEOUT_S = 0.6  # the watchdog's per-probe deadline: shorter than one render


class Server:
    """One event loop, as SGLang's: /metrics holds it while rendering, /health waits for it."""

    def __init__(self, health_fails: bool) -> None:
        self.loop = threading.Lock()
        self.health_fails = health_fails
        self.rendering = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's spelling
                if self.path == "/metrics":
                    with outer.loop:
                        outer.rendering.set()
                        time.sleep(RENDER_S)
                        outer.rendering.clear()
                    self._answer(200, METRICS)
                else:
                    # The two probes leave at once; let the scrape reach the loop first, as it
                    # does when the loop is rendering (else this test races its own requests).
                    outer.rendering.wait(0.3)
                    with outer.loop:  # the health check runs on the same loop
                        pass
                    self._answer(503 if outer.health_fails else 200, b"")

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the watchdog gave up on this request already

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def idle(self) -> None:
        """Wait, as the daemon's next tick would, until the loop is free again (bounded)."""
        deadline = time.monotonic() + 5 * RENDER_S
        while time.monotonic() < deadline and (self.rendering.is_set() or self.loop.locked()):
            time.sleep(0.02)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(params=[False, True], ids=["health_ok_alone", "health_fails_always"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    srv = Server(health_fails=request.param)
    yield srv
    srv.close()


ENGINES = load_knowledge().engines
SGLANG = EngineInForce.at_start(ENGINES, "sglang")  # as `--engine sglang` makes it


class _Sglang(ServerSource):
    """A server source whose every poll has SGLang in force, as the loop's tick would say."""

    def poll(self, tick: SourceTick | None = None) -> ServerSample:
        return super().poll(SourceTick(engine=SGLANG))


def _source(url: str) -> ServerSource:
    return _Sglang(url, timeout_s=TIMEOUT_S, engines=ENGINES)


def _failing(s: ServerSample) -> bool:
    return s.health_status not in (None, 200) or s.health_meaning not in (None, "ok")


def test_health_starved_by_our_scrape_is_probe_starvation_never_a_failure(
    server: Server,
) -> None:
    src = _source(server.url)
    samples = []
    try:
        for _ in range(4):
            samples.append(src.poll())
            server.idle()
    finally:
        src.close()
    first, second = samples[0], samples[1]
    # Tick 1: /health timed out while our scrape held the loop: held back, not reported.
    assert first.health_status is None and first.health_meaning is None
    if not server.health_fails:
        # Tick 2: /health alone answers: the failure was ours. The scrape backs off.
        assert second.probe_starvation and second.health_status == 200
        assert src.starvation.starved >= 1 and src.starvation.scrape_every >= 2
        assert not any(_failing(s) for s in samples)
    else:
        # Near miss: it fails alone too, so it counts as failing and nothing backs off.
        assert second.health_status == 503 and _failing(second)
        assert not second.probe_starvation
        assert src.starvation.starved == 0 and src.starvation.scrape_every == 1


def test_health_failing_with_a_fast_scrape_is_reported_at_once() -> None:
    judge = StarvationJudge()
    assert judge.scrape_now()
    assert judge.judge(health_failed=True, overlapped=False, scraped=True) == "report"
    assert judge.starved == 0


def test_the_back_off_is_bounded_and_recovers() -> None:
    judge = StarvationJudge()
    for _ in range(10):  # starved again and again
        while not judge.scrape_now():
            pass
        assert judge.judge(health_failed=True, overlapped=True, scraped=True) == "suspect"
        assert not judge.scrape_now()  # the suspect is checked alone
        assert judge.judge(health_failed=False, overlapped=False, scraped=False) == "starved"
    assert judge.scrape_every == MAX_SCRAPE_EVERY
    for _ in range(40):  # clean scrapes bring the cadence back
        if judge.scrape_now():
            judge.judge(health_failed=False, overlapped=True, scraped=True)
    assert judge.scrape_every < MAX_SCRAPE_EVERY
