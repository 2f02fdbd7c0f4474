"""Optional canary (`--canary`): when the server has been idle a while, send one
`max_tokens: 1` completion; no answer within the timeout means it is wedged while idle.

Never under load: only in the `idle` state (no work pending). TGI and NVIDIA Dynamo do the
same internally (rwlove/home-ops #14030).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from watchdog.core.model import LogEvent, Observation, Verdict

log = logging.getLogger("hang_watchdog.remediation")


class CanaryHook:
    """Probes an idle server with one tiny completion and reports a timeout as a stall."""

    def __init__(
        self,
        base_url: str,
        *,
        idle_s: float,
        timeout_s: float,
        client_factory: Callable[[float], httpx.Client] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.idle_s, self.timeout_s = idle_s, timeout_s
        self._client_factory = client_factory or (
            lambda t: httpx.Client(timeout=t, trust_env=False)
        )
        self.idle_since: float | None = None
        self.last_sent: float | None = None
        self.results: list[str] = []  # "ok", "timeout", "error: ..." in order
        self._thread: threading.Thread | None = None
        self._result: str | None = None

    def on_tick(self, obs: Observation, verdict: Verdict, daemon: Any) -> None:
        self._collect(daemon)
        if verdict.state != "idle":
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = obs.t
        quiet = self.last_sent is None or obs.t - self.last_sent >= self.idle_s
        if self._thread is None and obs.t - self.idle_since >= self.idle_s and quiet:
            self.last_sent = obs.t
            self._thread = threading.Thread(
                target=self._send, name="hang-watchdog-canary", daemon=True
            )
            self._thread.start()

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

    def _collect(self, daemon: Any) -> None:
        if self._thread is None or self._thread.is_alive():
            return
        result, self._thread, self._result = self._result or "error: no result", None, None
        self.results.append(result)
        daemon.inject(
            LogEvent(
                kind="canary",
                line=f"canary completion: {result}",
                source="canary",
                fields={"timed_out": result == "timeout", "waited_s": self.timeout_s},
            )
        )
        if result == "timeout":
            msg = (
                f"idle server did not answer a max_tokens=1 completion within "
                f"{self.timeout_s:.0f} s: treat it as stalled (wedged while idle)"
            )
            log.warning("canary: %s", msg)
            daemon.emitter.event("canary", msg, outcome="stalled", url=self.url)
        elif result != "ok":
            daemon.emitter.event("canary", f"canary request failed: {result}", outcome="error")


def _served_model(client: httpx.Client, url: str) -> str | None:
    """The first model id from /v1/models; None when the listing is unavailable."""
    try:
        data = client.get(url).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    first = data[0] if data and isinstance(data[0], dict) else {}
    return first.get("id") if isinstance(first.get("id"), str) else None
