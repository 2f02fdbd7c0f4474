"""After a restart: did the server recover? Progress resumes, the GPU moves memory while work
runs, and (with an OpenAI-compatible endpoint) 4 short completions answer 200 with text.

The GB300 report recommends the completion smoke test: a server can look healthy (/health 200)
while its engine is wedged (vllm #46811), so only a real completion proves it serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from watchdog.core.model import Observation, Verdict
from watchdog.core.state.window import Progress

SMOKE_PROMPT = "Reply with one word: ok"
UP_STATES = frozenset({"starting", "loading", "compiling", "idle", "serving", "crawling"})
# "Ready and idle" counts only once idle has held this long: a restarted server goes idle for a
# tick between its ready line and its clients' first requests, and a verdict of `recovered` then
# would be said while the load it has to serve is just arriving.
IDLE_HOLD_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """The verification result: `recovered` or `not_recovered`, with the reason."""

    outcome: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


class SmokeTest:
    """`count` short completions via POST {base_url}/v1/completions; (ok, detail)."""

    def __init__(
        self,
        base_url: str,
        *,
        count: int = 4,
        timeout_s: float = 30.0,
        client_factory: Callable[[float], httpx.Client] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.count, self.timeout_s = count, timeout_s
        self._client_factory = client_factory or (
            lambda t: httpx.Client(timeout=t, trust_env=False)
        )

    def run(self) -> tuple[bool, str]:
        """Send the completions one after another; the first failure ends the test."""
        try:
            with self._client_factory(self.timeout_s) as client:
                model = self._model(client)
                for i in range(self.count):
                    ok, detail = self._one(client, model, i)
                    if not ok:
                        return False, detail
        except httpx.HTTPError as exc:
            return False, f"smoke test: {type(exc).__name__}: {exc}"
        return True, f"{self.count} completions answered 200 with text"

    def _model(self, client: httpx.Client) -> str | None:
        # vLLM lists its served model names at /v1/models; without one the request omits it.
        try:
            data = client.get(f"{self.base_url}/v1/models").json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return str(data[0].get("id")) if data and isinstance(data[0], dict) else None

    def _one(self, client: httpx.Client, model: str | None, i: int) -> tuple[bool, str]:
        body: dict[str, Any] = {"prompt": SMOKE_PROMPT, "max_tokens": 4, "temperature": 0}
        if model:
            body["model"] = model
        resp = client.post(f"{self.base_url}/v1/completions", json=body)
        if resp.status_code != 200:
            return False, f"completion {i + 1}/{self.count}: HTTP {resp.status_code}"
        try:
            text = resp.json()["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            return False, f"completion {i + 1}/{self.count}: no choices[0].text in the answer"
        if not isinstance(text, str) or not text:
            return False, f"completion {i + 1}/{self.count}: empty text"
        return True, ""


class Verifier:
    """Follows the ticks after one restart until it can say recovered or not_recovered."""

    def __init__(
        self,
        started_t: float,
        recover_within_s: float,
        *,
        spin_dram: float,
        smoke: SmokeTest | None = None,
        idle_hold_s: float = IDLE_HOLD_S,
    ) -> None:
        self.started_t, self.recover_within_s = started_t, recover_within_s
        self.idle_hold_s = idle_hold_s
        self.idle_since: float | None = None
        self.spin_dram, self.smoke = spin_dram, smoke
        self.progress_times: set[float] = set()
        self.max_dram: float | None = None
        self._smoke_thread: threading.Thread | None = None
        self._smoke_result: tuple[bool, str] | None = None
        self._basis = ""
        # A hang verdict before the new server came up is the old one's echo (e.g. /health
        # refused while it boots reads as engine_dead); only the deadline judges that stretch.
        self.came_up = False

    def step(self, obs: Observation, verdict: Verdict, progress: Progress) -> Outcome | None:
        """None while undecided; an Outcome once decided."""
        if verdict.state in UP_STATES:
            self.came_up = True
        if verdict.is_hang and self.came_up:
            return self._done("not_recovered", f"hung again: {verdict.signature}")
        if self._smoke_thread is not None:
            return self._smoke_outcome()
        self._note(obs, verdict, progress)
        basis = self._ready(obs.t, verdict, progress)
        if basis:
            self._basis = basis
            if self.smoke is None:
                return self._done("recovered", basis)
            self._start_smoke()
            return None
        if obs.t - self.started_t > self.recover_within_s:
            why = f"no progress within {self.recover_within_s:.0f} s of the restart"
            if self.progress_times and not self._dram_ok():
                why = f"progress but DRAM bandwidth stayed near zero ({self.max_dram:.2f})"
            return self._done("not_recovered", why)
        return None

    def _note(self, obs: Observation, verdict: Verdict, progress: Progress) -> None:
        last, what = progress.last_progress_t, progress.last_progress_what
        serving = verdict.state == "serving"
        ready_idle = verdict.state == "idle" and progress.phase == "ready"
        if not ready_idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = obs.t
        if serving and last is not None and last > self.started_t and what != "server restarted":
            self.progress_times.add(last)
        drams = [g.dram for g in obs.gpus if g.dram is not None]
        if serving and drams:
            self.max_dram = max([*drams, self.max_dram or 0.0])

    def _dram_ok(self) -> bool:
        return self.max_dram is None or self.max_dram > self.spin_dram

    def _ready(self, t: float, verdict: Verdict, progress: Progress) -> str:
        if len(self.progress_times) >= 2 and self._dram_ok():
            dram = "" if self.max_dram is None else f", DRAM up to {self.max_dram:.2f}"
            return f"serving: progress advanced {len(self.progress_times)} times{dram}"
        if self.idle_since is not None and t - self.idle_since >= self.idle_hold_s:
            held = t - self.idle_since
            return f"ready and idle (no work pending for {held:.0f} s)"
        return ""

    def _start_smoke(self) -> None:
        assert self.smoke is not None
        smoke = self.smoke

        def work() -> None:
            self._smoke_result = smoke.run()

        self._smoke_thread = threading.Thread(target=work, name="hang-watchdog-smoke", daemon=True)
        self._smoke_thread.start()

    def _smoke_outcome(self) -> Outcome | None:
        if self._smoke_result is None:
            return None
        ok, detail = self._smoke_result
        if ok:
            return self._done("recovered", f"{self._basis}; {detail}")
        return self._done("not_recovered", f"{self._basis}, but the smoke test failed: {detail}")

    def _done(self, outcome: str, reason: str) -> Outcome:
        details: dict[str, Any] = {"progress_advances": len(self.progress_times)}
        if self.max_dram is not None:
            details["max_dram"] = self.max_dram
        if self._smoke_result is not None:
            details["smoke_test"] = {"ok": self._smoke_result[0], "detail": self._smoke_result[1]}
        return Outcome(outcome, reason, details)
