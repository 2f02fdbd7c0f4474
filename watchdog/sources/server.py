"""Scrapes a vLLM server's /metrics and /health: progress counters that keep moving only while
the engine really steps, and the one signal (/health 503) that says the engine is dead."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from watchdog.core.model import ServerSample
from watchdog.sources.base import SourceHealth

# Sample names (not family names) -> ServerSample field. Matching on sample names sidesteps the
# parser's naming: it strips `_total` from the counter families (`vllm:prompt_tokens`) but keeps
# it on the histogram `vllm:iteration_tokens_total`, whose step count is `..._total_count`.
# Names from vllm/v1/metrics/loggers.py (PrometheusStatLogger; see tests/data/README-vllm.md).
_SAMPLES: dict[str, str] = {
    "vllm:iteration_tokens_total_count": "iterations",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


def parse_server_metrics(text: str) -> ServerSample:
    """Reduce one /metrics page to the progress counters, summed over `engine`/`model_name`.

    A metric the page lacks stays None. Raises ValueError when the text is not Prometheus text.
    """
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _SAMPLES.get(sample.name)
                if key is not None:
                    sums[key] = sums.get(key, 0.0) + float(sample.value)
    except (ValueError, IndexError, TypeError) as e:
        raise ValueError(
            f"the /metrics body is not Prometheus text exposition ({e}); "
            "check that --vllm-url points at the vLLM API server"
        ) from e
    return ServerSample(up=True, **sums)


def _check_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"vLLM URL {base_url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000"
        )
    return base_url.rstrip("/")


# vLLM's own /metrics is well under a megabyte (a few hundred series, plus histograms); a body
# this large is something else, and parsing it would stall the loop and eat memory.
MAX_METRICS_BYTES = 32 << 20


class ServerSource:
    """Polls one vLLM API server; never raises, marks itself down when /metrics fails."""

    name = "vllm"

    def __init__(
        self, base_url: str, *, client: httpx.Client | None = None, timeout_s: float = 2.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"vLLM scrape timeout must be > 0 seconds, got {timeout_s}")
        self.base_url = _check_base_url(base_url)
        self.timeout_s = timeout_s
        self.health = SourceHealth(self.name)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout_s)

    def poll(self) -> ServerSample:
        """One scrape of /metrics then /health (skipped when the server is unreachable)."""
        sample, reachable = self._scrape_metrics()
        health_status = self._health_status() if reachable else None
        if sample.up:
            self.health.ok()
        else:
            self.health.down(sample.error or "scrape failed")
        return ServerSample(
            up=sample.up,
            health_status=health_status,
            iterations=sample.iterations,
            prompt_tokens=sample.prompt_tokens,
            generation_tokens=sample.generation_tokens,
            running=sample.running,
            waiting=sample.waiting,
            error=sample.error,
        )

    def _scrape_metrics(self) -> tuple[ServerSample, bool]:
        url = f"{self.base_url}/metrics"
        try:
            with self._client.stream("GET", url, timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    error = f"{url} answered HTTP {resp.status_code}"
                    return ServerSample(up=False, error=error), True
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        limit = MAX_METRICS_BYTES >> 20
                        error = f"{url}: more than {limit} MiB; is this vLLM's /metrics endpoint?"
                        return ServerSample(up=False, error=error), True
                text = body.decode(resp.encoding or "utf-8", errors="replace")
        except httpx.TimeoutException:
            return ServerSample(
                up=False, error=f"{url} timed out after {self.timeout_s:g} s"
            ), False
        except httpx.HTTPError as e:
            return ServerSample(up=False, error=f"{url}: {type(e).__name__}: {e}"), False
        try:
            return parse_server_metrics(text), True
        except ValueError as e:
            return ServerSample(up=False, error=f"{url}: {e}"), True

    def _health_status(self) -> int | None:
        # /health answers 200 while the engine is wedged (vllm #40926); only 503 (EngineDeadError)
        # means something, so the status is recorded as-is and judged by classify().
        try:
            return self._client.get(f"{self.base_url}/health", timeout=self.timeout_s).status_code
        except httpx.HTTPError:
            return None

    def close(self) -> None:
        """Close the HTTP client if this source created it."""
        if self._owns_client:
            self._client.close()
