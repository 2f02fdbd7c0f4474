"""Scrapes an inference server's /metrics and /health, as its engine profile spells them:
progress counters that move only while the engine really steps, pending-work gauges, and what
a /health status means for that engine (a vLLM 503 is a dead engine; an SGLang 503 is a
one-token generation that got no answer)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import SplitResult, urlsplit

from watchdog.core.model import ServerSample
from watchdog.engines.loader import EngineSet
from watchdog.engines.profile import EngineProfile, MetricSample
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, scrape_deadline
from watchdog.sources.httpget import BadStatusLine, BodyTooLarge, HttpError, HttpGet
from watchdog.sources.starvation import StarvationJudge
from watchdog.sources.tcpdiag import DiagUnavailable, PendingRequest, PortDiag, own_ports, pending

# A server's own /metrics is well under a megabyte (a few hundred series, plus histograms); a
# body this large is something else, and reading it would stall the loop and eat memory.
MAX_METRICS_BYTES = 32 << 20
# /health answers an empty body or a short JSON (vllm entrypoints/openai/api_server.py,
# sglang srt/entrypoints/http_server.py); only its status is read.
MAX_HEALTH_BYTES = 64 << 10
# Series summed per sample name; more than this is not one server's page.
MAX_SERIES = 4096
log = logging.getLogger(__name__)
# A failing /health that took at least this share of its deadline, while our /metrics scrape
# was in flight, may be one our scrape starved (sources/starvation.py).
STARVED_AFTER = 0.5
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")


def samples_of(engines: EngineSet) -> tuple[MetricSample, ...]:
    """Every profile's samples: what an engine not yet recognised is read with."""
    return tuple(s for p in engines.profiles for s in p.samples)


class MetricsParser:
    """Reads Prometheus text line by line, keeping only the wanted samples (summed over labels).

    Lines of other families cost one check of their first character and a find, so a page of
    300k unrelated series does not hold the loop; values that are not finite numbers (a 400-digit
    value, NaN) are skipped, never raised.
    """

    def __init__(self, samples: Iterable[MetricSample]) -> None:
        self._fields: Mapping[str, str] = {s.name: s.field for s in samples}
        self.sums: dict[str, float] = {}
        self._series: dict[str, int] = {}
        self._rest = ""
        self._line_no = 0

    def feed(self, chunk: str) -> None:
        """More text; complete lines are parsed now, the tail waits for the next chunk."""
        lines = (self._rest + chunk).split("\n")
        self._rest = lines.pop()
        for line in lines:
            self._line(line)

    def close(self) -> ServerSample:
        """The sample read so far; ValueError when the body is not Prometheus text."""
        if self._rest:
            self._line(self._rest)
            self._rest = ""
        fields: dict[str, Any] = dict(self.sums)  # the profile names which fields these are
        return ServerSample(up=True, **fields)

    def _line(self, raw: str) -> None:
        self._line_no += 1
        line = raw.strip()
        if not line or line[0] == "#":
            return
        if line[0] not in _NAME_START:
            raise ValueError(
                f"the /metrics body is not Prometheus text exposition (line {self._line_no} "
                f"starts {line[:20]!r}); check that the URL points at the server's API port"
            )
        cut = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if cut < 0:
            raise ValueError(
                f"the /metrics body is not Prometheus text exposition (line {self._line_no} "
                "has no value)"
            )
        field = self._fields.get(line[:cut])
        if field is None:
            return
        name = line[:cut]
        rest = line[line.rfind("}") + 1 :] if line[cut] == "{" else line[cut:]
        parts = rest.split()
        if not parts or self._series.get(name, 0) >= MAX_SERIES:
            return
        try:
            value = float(parts[0])
        except ValueError:
            raise ValueError(
                f"the /metrics body is not Prometheus text exposition (line {self._line_no}: "
                f"{name} has value {parts[0][:20]!r}); check that the URL points at the "
                "server's API port"
            ) from None
        if not math.isfinite(value):  # NaN, +Inf, or a 400-digit number
            return
        self._series[name] = self._series.get(name, 0) + 1
        self.sums[field] = self.sums.get(field, 0.0) + value


def parse_server_metrics(text: str, samples: Iterable[MetricSample]) -> ServerSample:
    """Reduce one /metrics page to the progress counters, summed over `engine`/`model_name`.

    A metric the page lacks stays None. Raises ValueError when the text is not Prometheus text.
    """
    parser = MetricsParser(samples)
    parser.feed(text)
    return parser.close()


def _check_base_url(base_url: str) -> SplitResult:
    try:
        parts = urlsplit(base_url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # e.g. "http://[::1" or a port out of range
        ok = False
    if not ok:
        raise ValueError(
            f"server URL {base_url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000"
        )
    return parts


def _shown_url(parts: SplitResult) -> str:
    """The base URL as messages show it: credentials in it are not repeated in logs."""
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}".rstrip("/")


class InflightRequests:
    """The server's unanswered requests, when it listens on this host (sources/tcpdiag.py).

    Its own scrape connections are left out: a /metrics that hangs must not read as a
    client's request. None when the server is remote or the kernel does not answer."""

    LOCAL = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "ip6-localhost"})

    def __init__(self, host: str, port: int) -> None:
        local = host in self.LOCAL or host.startswith("127.")
        self.port = port if local else None
        self._diag = PortDiag(port) if local else None

    def poll(self) -> list[PendingRequest] | None:
        if self.port is None or self._diag is None:
            return None
        try:
            sockets = self._diag.sockets()  # both ends of the port's connections on this host
        except DiagUnavailable:
            self.port = None  # the same on every tick: stop asking
            return None
        found = pending(sockets, self.port)
        if found:  # the dump holds the client ends too: our own are told by their inodes
            mine = own_ports(sockets, self.port)
            found = [p for p in found if p.peer_port not in mine]
        return found


class ServerSource:
    """Polls one server's HTTP API; never raises, marks itself down when /metrics fails."""

    name = "server"  # the source's name in logs and `source_up` (also exported as `vllm`)
    part = "server"

    def __init__(
        self,
        base_url: str,
        *,
        client: HttpGet | None = None,
        health_client: HttpGet | None = None,
        timeout_s: float = 2.0,
        engines: EngineSet,
    ) -> None:
        """`engines`: the profiles whose samples are looked for until the engine in force (the
        tick's, from the process source or --engine) is known."""
        if timeout_s <= 0:
            raise ValueError(f"server scrape timeout must be > 0 seconds, got {timeout_s}")
        parts = _check_base_url(base_url)
        self.base_url = _shown_url(parts)
        self.timeout_s = timeout_s
        self.health = SourceHealth(self.name)
        self._owns_client = client is None
        self._client = client if client is not None else HttpGet(parts)
        # /health has its own connection, thread and deadline: our probes never share a loop
        # or a deadline, so one that is slow cannot make the other fail (sources/starvation.py).
        self._owns_health = health_client is None
        self._health_client = health_client if health_client is not None else HttpGet(parts)
        self._pool: ThreadPoolExecutor | None = None  # started at the first poll, not here
        self._health_end = 0.0
        self._metrics_timed_out = False
        self.starvation = StarvationJudge()
        self._last_up = False
        # Until the engine is known, every profile's samples are looked for.
        self._unknown_samples = samples_of(engines)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._inflight = InflightRequests(parts.hostname or "", port)

    @staticmethod
    def _profile(tick: SourceTick) -> EngineProfile | None:
        profile = tick.engine.profile
        return profile if profile.samples else None

    def deadline(self, tick_s: float) -> Deadline:
        return scrape_deadline(self.timeout_s, 2)  # /metrics, then /health

    def poll(self, tick: SourceTick | None = None) -> ServerSample:
        """/metrics and /health, each on its own connection under its own deadline, at once,
        read as the tick's engine in force spells them."""
        profile = self._profile(tick if tick is not None else SourceTick())
        scrape = self.starvation.scrape_now()
        health_start = time.monotonic()
        health = self._start_health(profile)
        if scrape:
            sample, reachable = self._scrape_metrics(profile)
            metrics_end = time.monotonic()
            self._last_up = sample.up
        else:  # backed off (or checking a suspect): no counters this tick, not a failure
            sample, reachable, metrics_end = ServerSample(up=self._last_up), True, 0.0
        health_status, timed_out, health_end = self._await_health(health)
        if scrape and not reachable and not timed_out:
            health_status = None  # refused or reset: the server is not there to answer
        failed = timed_out or (health_status is not None and health_status != 200)
        # Starvation is slow: /health got no answer, or a failing one only after waiting at
        # least STARVED_AFTER of its deadline, while our scrape was still in flight (a scrape
        # past its own deadline was in flight the whole time). A quick 503 is the server's word.
        slow = timed_out or health_end - health_start >= STARVED_AFTER * self.timeout_s
        overlapped = scrape and slow and (self._metrics_timed_out or metrics_end >= health_end)
        decision = self.starvation.judge(failed, overlapped, scrape)
        if decision == "suspect":
            health_status, timed_out = None, False  # held back: probed alone next tick
        elif decision == "starved":
            log.warning(
                "%s/health failed only while our own /metrics scrape ran and answered alone: "
                "probe starvation, not a hang; scraping every %d ticks",
                self.base_url,
                self.starvation.scrape_every,
            )
        if scrape:
            if sample.up:
                self.health.ok()
            else:
                self.health.down(sample.error or "scrape failed")
        meaning = profile.health_meaning(health_status) if profile is not None else None
        if timed_out and profile is not None:
            meaning = profile.health_no_answer
        pending = self._inflight.poll() if reachable else None
        return ServerSample(
            up=sample.up,
            health_status=health_status,
            health_meaning=meaning,
            iterations=sample.iterations,
            prompt_tokens=sample.prompt_tokens,
            generation_tokens=sample.generation_tokens,
            running=sample.running,
            waiting=sample.waiting,
            unanswered=len(pending) if pending is not None else None,
            unanswered_oldest_s=max((p.waiting_s for p in pending), default=None)
            if pending
            else None,
            error=sample.error,
            probe_starvation=decision == "starved" or self.starvation.backing_off,
        )

    def _start_health(self, profile: EngineProfile | None) -> Future[tuple[int | None, bool]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-probe")
        return self._pool.submit(self._health_status, profile)

    def _await_health(self, fut: Future[tuple[int | None, bool]]) -> tuple[int | None, bool, float]:
        """(status, timed_out, when it ended); HttpGet's own deadline bounds the wait."""
        try:
            status, timed_out = fut.result(timeout=self.timeout_s + 1.0)
        except FutureTimeout:
            status, timed_out = None, True
        return status, timed_out, time.monotonic() if timed_out else self._health_end

    def _scrape_metrics(self, profile: EngineProfile | None) -> tuple[ServerSample, bool]:
        path = profile.metrics_path if profile is not None else "/metrics"
        url = f"{self.base_url}{path}"
        parser = MetricsParser(profile.samples if profile is not None else self._unknown_samples)
        self._metrics_timed_out = False
        try:
            status = self._client.get(path, self.timeout_s, MAX_METRICS_BYTES, parser.feed)
            if status != 200:
                return ServerSample(up=False, error=f"{url} answered HTTP {status}"), True
            return parser.close(), True
        except TimeoutError:
            self._metrics_timed_out = True
            return ServerSample(
                up=False, error=f"{url} timed out after {self.timeout_s:g} s"
            ), False
        except BodyTooLarge:
            limit = MAX_METRICS_BYTES >> 20
            error = f"{url}: more than {limit} MiB; is this the server's /metrics?"
            return ServerSample(up=False, error=error), True
        except (OSError, HttpError) as e:
            return ServerSample(up=False, error=f"{url}: {_why(e)}"), False
        except ValueError as e:
            return ServerSample(up=False, error=f"{url}: {e}"), True

    def _health_status(self, profile: EngineProfile | None) -> tuple[int | None, bool]:
        """(status, timed_out) of /health; status None when it did not answer."""
        # vLLM's /health answers 200 while the engine is wedged (vllm #40926); what each status
        # means is the profile's (recorded as health_meaning) and judged by classify().
        path = profile.health_path if profile is not None else "/health"
        try:
            return self._health_client.get(path, self.timeout_s, MAX_HEALTH_BYTES), False
        except TimeoutError:
            return None, True
        except (OSError, HttpError, BodyTooLarge):
            return None, False
        finally:
            self._health_end = time.monotonic()

    def close(self) -> None:
        """Close the HTTP clients this source created, and the health probe's thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        if self._owns_client:
            self._client.close()
        if self._owns_health:
            self._health_client.close()


def _why(exc: BaseException) -> str:
    """What went wrong, named: `ConnectionRefusedError: [Errno 111] Connection refused`."""
    detail = str(exc) or "no detail"
    if isinstance(exc, BadStatusLine):
        detail = f"not an HTTP answer (first line {str(exc)[:40]!r}); is this an HTTP port?"
    return f"{type(exc).__name__}: {detail}"
