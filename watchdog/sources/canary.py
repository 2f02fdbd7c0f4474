"""The idle canary (`--canary`): when the server has been idle a while, send one
`max_tokens: 1` completion; no answer within the timeout means it is wedged while idle.

Never under load: only while the last verdict was `idle` (no work pending). TGI and NVIDIA
Dynamo do the same internally (rwlove/home-ops #14030). The answer is the Observation's
`canary` field (core/model.py CanaryResult), read by the window as work pending or progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from watchdog.core.model import CanaryResult
from watchdog.core.state.tick import EventSink
from watchdog.sources.base import Deadline, SourceHealth, SourceTick

log = logging.getLogger("hang_watchdog.sources")


def _quiet(kind: str, message: str, **fields: Any) -> None:
    """No operator events (a source tested on its own)."""


class CanarySource:
    """Probes an idle server with one tiny completion in the background; each poll hands back
    the answer that came in since the last one (None while none did)."""

    name = "canary"
    part = "canary"

    def __init__(
        self,
        base_url: str,
        *,
        idle_s: float,
        timeout_s: float,
        event: EventSink = _quiet,
        clock: Callable[[], float] = time.monotonic,
        client_factory: Callable[[float], httpx.Client] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.idle_s, self.timeout_s = idle_s, timeout_s
        self._event = event
        self._clock = clock
        self._client_factory = client_factory or (
            lambda t: httpx.Client(timeout=t, trust_env=False)
        )
        self.health = SourceHealth(self.name, log)
        # Its requests failing is evidence about the server, not the source being down: no
        # `source_up{source="canary"}` series.
        self.health.reported = False
        self.idle_since: float | None = None
        self.last_sent: float | None = None
        self.results: list[str] = []  # "ok", "timeout", "error: ..." in order
        self._thread: threading.Thread | None = None
        self._result: str | None = None

    def deadline(self, tick_s: float) -> Deadline:
        """Inline: a poll only starts a request or collects one; the request has its thread."""
        return Deadline(0.0, inline=True)

    def poll(self, tick: SourceTick | None = None) -> CanaryResult | None:
        """The answer that came in since the last poll; sends a request when the server has
        been idle (the tick's last verdict) for idle_s and none was sent for as long."""
        self.health.ok()
        answer = self._collect()
        now = self._clock()
        if tick is None or tick.last_state != "idle":
            self.idle_since = None
            return answer
        if self.idle_since is None:
            self.idle_since = now
        quiet = self.last_sent is None or now - self.last_sent >= self.idle_s
        if self._thread is None and now - self.idle_since >= self.idle_s and quiet:
            self.last_sent = now
            self._thread = threading.Thread(
                target=self._send, name="hang-watchdog-canary", daemon=True
            )
            self._thread.start()
        return answer

    def _send(self) -> None:
        body: dict[str, Any] = {"prompt": "ok", "max_tokens": 1, "temperature": 0}
        try:
            with self._client_factory(self.timeout_s) as client:
                model = _served_model(client, self.url.rsplit("/", 1)[0] + "/models")
                if model:
                    body["model"] = model  # older vLLM requires it
                resp = client.post(self.url, json=body)
            self._result = "ok" if resp.status_code == 200 else f"error: HTTP {resp.status_code}"
        except httpx.TimeoutException:
            self._result = "timeout"
        except httpx.HTTPError as exc:
            self._result = f"error: {type(exc).__name__}: {exc}"

    def _collect(self) -> CanaryResult | None:
        if self._thread is None or self._thread.is_alive():
            return None
        result, self._thread, self._result = self._result or "error: no result", None, None
        self.results.append(result)
        if result == "timeout":
            msg = (
                f"idle server did not answer a max_tokens=1 completion within "
                f"{self.timeout_s:.0f} s: treat it as stalled (wedged while idle)"
            )
            log.warning("canary: %s", msg)
            self._event("canary", msg, outcome="stalled", url=self.url)
        elif result != "ok":
            self._event("canary", f"canary request failed: {result}", outcome="error")
        return CanaryResult(timed_out=result == "timeout", waited_s=self.timeout_s, result=result)

    def close(self) -> None:
        """The request thread is a daemon thread bounded by its timeout: nothing to wait for."""


def _served_model(client: httpx.Client, url: str) -> str | None:
    """The first model id from /v1/models; None when the listing is unavailable."""
    try:
        data = client.get(url).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    first = data[0] if data and isinstance(data[0], dict) else {}
    return first.get("id") if isinstance(first.get("id"), str) else None
