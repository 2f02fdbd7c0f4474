"""Serve mode: the simulated vLLM API server (/health, /metrics, /v1/models, /v1/completions).

/health mirrors vLLM: 200 while the API process is up, including during engine hangs, and
503 once the engine is dead (vllm/entrypoints/serve/instrumentator/health.py). /metrics carries
vLLM's names and labels (`model_name`, `engine`; vllm/v1/metrics/loggers.py
PrometheusStatLogger), built fresh on every scrape from the engine's report.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from watchdog.sim.config import SimConfig
from watchdog.sim.link import EngineLink
from watchdog.sim.output import Console
from watchdog.sim.sglang import decode_line, health_failed_line
from watchdog.sim.trtllm import ROUTES as TRTLLM_ROUTES

PROC = "APIServer"
COMPLETION_WAIT_S = 600.0  # a hung engine never answers; the client's timeout ends the wait
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# e_ascend5117 sample (API side of an engine death), reproduced line for line.
DEAD_TRACE = (
    "AsyncLLM output_handler failed.",
    "Traceback (most recent call last):",
    '  File "/vllm-workspace/vllm/vllm/v1/engine/async_llm.py", line 439, in output_handler',
    "    outputs = await engine_core.get_output_async()",
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/vllm-workspace/vllm/vllm/v1/engine/core_client.py", line 846, in get_output_async',
    "    raise self._format_exception(outputs) from None",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause.",
)


class VllmCollector:
    """Builds vLLM's metric families from the engine's latest report on every scrape."""

    def __init__(self, api: ApiServer) -> None:
        self._api = api

    def collect(self) -> Any:
        """prometheus_client Collector protocol."""
        st = self._api.link.state
        labels = ["model_name", "engine"]
        values = [self._api.cfg.model, "0"]
        running = st.running + self._api.inflight
        families: list[Any] = []
        gauges = (
            ("vllm:num_requests_running", "Requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", st.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100 %.", min(running / 64, 1.0)),
        )
        for name, doc, value in gauges:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            families.append(fam)
        for name, doc, value in (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", st.gen_tokens),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, value)
            families.append(counter)
        families.append(self._iteration_histogram(labels, values))
        return families

    def _iteration_histogram(self, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        """`vllm:iteration_tokens_total`: one observation per engine step (`_count` = steps)."""
        st = self._api.link.state
        total = float(st.prompt_tokens + st.gen_tokens)
        mean = total / st.iterations if st.iterations else 0.0
        buckets = [(str(b), st.iterations if b >= mean else 0) for b in ITERATION_BUCKETS]
        buckets.append(("+Inf", st.iterations))
        fam = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            labels=labels,
        )  # fmt: skip
        fam.add_metric(values, buckets, total)
        return fam


class ApiServer:
    """The API process in serve mode: HTTP on 127.0.0.1, the stats logger, engine-death lines."""

    def __init__(self, cfg: SimConfig, console: Console, link: EngineLink) -> None:
        self.cfg = cfg
        self.con = console
        self.link = link
        self.pid = os.getpid()
        self.inflight = 0
        self.gen_tps = 0.0
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        if cfg.engine == "sglang":
            from watchdog.sim.sglang import SglangCollector

            self.registry.register(SglangCollector(self))
        elif cfg.engine == "trtllm":
            from watchdog.sim.trtllm import TrtllmCollector

            self.registry.register(TrtllmCollector(self))
        else:
            self.registry.register(VllmCollector(self))
        handler = type("Handler", (SimHandler,), {"api": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", cfg.port), handler, bind_and_activate=False)
        self.httpd.daemon_threads = True
        self.httpd.server_bind()  # the port is known now; connections are refused until listen
        self.port = int(self.httpd.server_address[1])

    def log(self, msg: str, level: str = "INFO", where: str = "loggers.py:123") -> None:
        """A line with the APIServer prefix."""
        self.con.vllm(PROC, self.pid, level, where, msg)

    def uvicorn(self, msg: str) -> None:
        """Uvicorn's own lines under vLLM's prefix, e.g. `(APIServer pid=48) INFO:     ...`
        (under SGLang's `[time] INFO:     ...`, as in sgl-project/sglang PR #22166's log)."""
        if self.cfg.engine == "sglang":
            self.con.sglang(f"INFO:     {msg}")
            return
        if self.cfg.engine == "trtllm":  # trtllm-serve runs uvicorn with its own log format
            self.con.line(f"INFO:     {msg}")
            return
        self.con.line(f"({PROC} pid={self.pid}) INFO:     {msg}")

    def serve(self) -> None:
        """Listen once the engine is ready, then serve until the process is stopped."""
        self.link.wait_for("ready")
        self.httpd.server_activate()
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        self.uvicorn("Application startup complete.")
        threading.Thread(target=self.watch_engine, name="engine-watch", daemon=True).start()
        if self.cfg.engine == "sglang":
            # srt/entrypoints/http_server.py _wait_and_warmup, after the warm-up request
            self.con.sglang("The server is fired up and ready to roll!")
            self.sglang_stats_loop()
        elif self.cfg.engine == "trtllm":
            threading.Event().wait()  # the executor worker logs its own iterations
        else:
            self.stats_loop()

    def watch_engine(self) -> None:
        """Print the API side of an engine death (EngineDeadError) when the engine goes away."""
        if not self.link.wait_for("dead"):
            return
        if self.cfg.engine == "sglang":
            # The launcher is SIGQUIT by the dying scheduler and kills the whole tree.
            from watchdog.sim.sglang import SIGQUIT_LINE

            self.con.sglang(SIGQUIT_LINE)
            self.link.stop()
            os._exit(1)
        if self.cfg.engine == "trtllm":
            return  # trtllm-serve stays up; /health answers 503 from now on
        for line in DEAD_TRACE:
            self.log(line, "ERROR", "async_llm.py:480")

    def sglang_stats_loop(self) -> None:
        """`Decode batch, ...` after decode steps (never for a batch that does not return)."""
        prev = self.link.state.gen_tokens
        while True:
            time.sleep(self.cfg.stats_interval)
            st = self.link.state
            self.gen_tps = (st.gen_tokens - prev) / self.cfg.stats_interval
            if st.gen_tokens > prev:
                running = st.running + self.inflight
                line = decode_line(running, st.waiting, self.gen_tps, st.prompt_tokens)
                self.con.sglang(line)
            prev = st.gen_tokens

    def sglang_health(self) -> int:
        """health_generate: 200 once any output arrives within the timeout, else 503."""
        st = self.link.state
        if st.dead or not st.ready:
            return 503
        tic, start = time.time(), st.iterations
        with self.link.changed:
            moved = self.link.changed.wait_for(
                lambda: self.link.state.iterations > start or self.link.state.dead,
                self.cfg.health_timeout_s,
            )
        if moved and not self.link.state.dead:
            return 200
        self.con.sglang(health_failed_line(self.cfg.health_timeout_s, tic, tic))
        return 503

    def stats_loop(self) -> None:
        """`Engine 000:` every interval; demoted (silent) after two zero intervals, like vLLM."""
        last = (0.0, 0.0)
        prev = (self.link.state.prompt_tokens, self.link.state.gen_tokens)
        while True:
            time.sleep(self.cfg.stats_interval)
            st = self.link.state
            now = (st.prompt_tokens, st.gen_tokens)
            tput = tuple((n - p) / self.cfg.stats_interval for n, p in zip(now, prev, strict=True))
            prev = now
            # vllm/v1/metrics/loggers.py: engine_is_idle = not any((prompt, gen, last_prompt,
            # last_gen)) -> logged at DEBUG, i.e. silent at the default level.
            if any((*tput, *last)):
                self.log(self.stats_line(tput[0], tput[1]))
            last = (tput[0], tput[1])

    def stats_line(self, prompt_tp: float, gen_tp: float) -> str:
        """vLLM's LoggingStatLogger line (vllm/v1/metrics/loggers.py, the older form)."""
        st = self.link.state
        running = st.running + self.inflight
        return (
            f"Engine 000: Avg prompt throughput: {prompt_tp:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tp:.1f} tokens/s, Running: {running} reqs, "
            f"Waiting: {st.waiting} reqs, GPU KV cache usage: {min(running / 64, 1.0) * 100:.1f}%, "
            f"Prefix cache hit rate: 0.0%"
        )

    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer a completion once the engine has stepped twice; a hung engine never does."""
        with self._lock:
            self.inflight += 1
        try:
            target = self.link.state.iterations + 2
            with self.link.changed:
                self.link.changed.wait_for(
                    lambda: self.link.state.iterations >= target or self.link.state.dead,
                    COMPLETION_WAIT_S,
                )
        finally:
            with self._lock:
                self.inflight -= 1
        if self.link.state.dead:
            return 500, {"object": "error", "message": "EngineCore encountered an issue.",
                         "type": "InternalServerError", "code": 500}  # fmt: skip
        return 200, completion_body(self.cfg.model, body)


def completion_body(model: str, request: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style completion response with non-empty text."""
    max_tokens = int(request.get("max_tokens") or 16)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": " simulated output",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],  # fmt: skip
        "usage": {
            "prompt_tokens": 8,
            "completion_tokens": max_tokens,
            "total_tokens": 8 + max_tokens,
        },  # fmt: skip
    }


class SimHandler(BaseHTTPRequestHandler):
    """Routes for the simulated API server."""

    api: ApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        """Suppress http.server's own log; access lines are written in uvicorn's format."""

    def send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        """Send a complete response and the uvicorn-style access line."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        phrase = self.responses.get(code, ("",))[0]
        host, port = self.client_address[:2]
        self.api.uvicorn(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}')

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        """GET /health, /metrics, /v1/models."""
        api = self.api
        if self.path in ("/health", "/health_generate") and api.cfg.engine == "sglang":
            self.send(api.sglang_health(), b"")
        elif api.cfg.engine == "trtllm" and self.path in TRTLLM_ROUTES:
            self.send(*TRTLLM_ROUTES[self.path](api))
        elif self.path == "/health":
            self.send(503 if api.link.state.dead else 200, b"")
        elif self.path == "/metrics":
            self.send(200, generate_latest(api.registry), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            model = {"id": api.cfg.model, "object": "model", "owned_by": "vllm",
                     "root": api.cfg.model, "created": int(time.time())}  # fmt: skip
            self.send(200, json.dumps({"object": "list", "data": [model]}).encode())
        else:
            self.send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        """POST /v1/completions."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/completions":
            self.send(404, b'{"detail":"Not Found"}')
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send(400, b'{"object":"error","message":"request body is not JSON"}')
            return
        code, payload = self.api.complete(body if isinstance(body, dict) else {})
        self.send(code, json.dumps(payload).encode())
