"""Remediation of a multi-node deployment is decided once, for the root cause.

Cause mode (the Prometheus answer every watchdog reads), leader mode and the deployment-wide
limits are described in docs/fleet.md, "Remediation once per deployment".
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.core.model import Verdict
from watchdog.remediation.settings import RemediationConfig

Query = Callable[[str], list[dict[str, Any]]]  # PromQL -> the API's `data.result`
CAUSE = "hang_watchdog_rank_cause_priority"
LAST = "hang_watchdog_rank_last_progress_timestamp_seconds"
RESTARTS = "hang_watchdog_remediation_restarts_total"
LAST_RESTART = "hang_watchdog_remediation_last_restart_timestamp_seconds"


@dataclass(frozen=True)
class Candidate:
    """A rank some watchdog of the deployment names as the cause."""

    node: str
    rank: int
    priority: float
    last_progress: float  # unix time; +inf when unknown (sorts last among equals)
    signature: str = ""


def pick(candidates: Sequence[Candidate]) -> Candidate | None:
    """The one cause every node agrees on: highest priority, first to stop, lowest (node, rank)."""
    return min(
        candidates,
        key=lambda c: (-c.priority, c.last_progress, c.node, c.rank),
        default=None,
    )


def candidates(causes: list[dict[str, Any]], progress: list[dict[str, Any]]) -> list[Candidate]:
    """Prometheus instant-query results (metric labels, [t, "value"]) as candidates."""
    last: dict[tuple[str, str], float] = {}
    for s in progress:
        key = (s["metric"].get("node", ""), s["metric"].get("rank", ""))
        last[key] = min(float(s["value"][1]), last.get(key, math.inf))
    out = []
    for s in causes:
        m = s["metric"]
        try:
            rank = int(m.get("rank", ""))
        except ValueError:
            continue
        node = m.get("node", "")
        out.append(Candidate(node, rank, float(s["value"][1]), last.get((node, str(rank)),
                                                                       math.inf),
                             m.get("signature", "")))  # fmt: skip
    return out


MAX_ANSWER = 8 << 20  # a deployment's instant vector is kilobytes


def http_query(url: str, timeout_s: float = 3.0) -> Query:
    """Prometheus's /api/v1/query (GET) under one deadline for the whole answer (httpx's own
    timeout is per read: a byte a second never trips it); raises what the decider reports."""
    import httpx

    def query(expr: str) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout_s
        data = bytearray()
        with httpx.stream("GET", f"{url.rstrip('/')}/api/v1/query", params={"query": expr},
                          timeout=timeout_s) as resp:  # fmt: skip
            for chunk in resp.iter_bytes():
                data += chunk
                if time.monotonic() > end:
                    raise TimeoutError(f"no whole answer within {timeout_s:g} s")
                if len(data) > MAX_ANSWER:
                    raise ValueError(f"an answer over {MAX_ANSWER >> 20} MiB")
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError(f"not a Prometheus API answer: {bytes(data[:80])!r}")
        if resp.status_code != 200 or body.get("status") != "success":
            raise ValueError(f"Prometheus answered {resp.status_code}: {body.get('error', '')}")
        return list(body["data"]["result"])

    return query


Answer = tuple[Candidate | None, str | None, str | None]  # (winner, limits, error)
ASK_EVERY_S = 2.0  # background mode: one round of queries at most this often
FRESH_S = 15.0  # an answer older than this (Prometheus slow to reply) is no answer


class FleetDecider:
    """Whether this node's watchdog may restart the deployment now (cause mode).

    With the HTTP query (the daemon), Prometheus is asked in a background thread and each tick
    reads the latest answer, so a slow Prometheus never holds the loop; an injected `query`
    runs inline unless `background` says otherwise.
    """

    def __init__(
        self,
        cfg: RemediationConfig,
        node: str,
        query: Query | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        *,
        background: bool | None = None,
    ) -> None:
        self.cfg, self.node, self.clock, self.wall = cfg, node, clock, wall
        url = cfg.fleet_prometheus_url
        self.query = query if query is not None else (http_query(url) if url else None)
        self.background = query is None if background is None else background
        self._winner_since: float | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._asked = -math.inf
        self._answer: tuple[float, Answer] | None = None

    def block(self, verdict: Verdict) -> str | None:
        """Why not (a sentence), or None when this node holds the deployment's cause."""
        where = f"deployment {self.cfg.deployment!r}"
        if self.query is None:
            return (f"{where}: set fleet_prometheus_url (the Prometheus every node's watchdog "
                    "reads) so one node decides, or use fleet_remediation = 'leader'")  # fmt: skip
        answer = self._latest() if self.background else self._ask()
        if answer is None:
            self._winner_since = None
            return f"{where}: waiting for Prometheus at {self.cfg.fleet_prometheus_url} to answer"
        win, limited, error = answer
        if error:
            self._winner_since = None
            return (
                f"{where}: Prometheus at {self.cfg.fleet_prometheus_url} did not answer ({error})"
            )
        return self._decide(where, win, limited)

    def _ask(self) -> Answer:
        """One round of queries: the winner and the deployment's limits, or the error."""
        dep = _quote(self.cfg.deployment)
        assert self.query is not None
        try:
            found = candidates(self.query(f'{CAUSE}{{deployment="{dep}"}}'),
                               self.query(f'{LAST}{{deployment="{dep}"}}'))  # fmt: skip
            return pick(found), self._limits(dep), None
        except Exception as exc:  # noqa: BLE001 - any failure to read Prometheus means: wait
            return None, None, str(exc) or type(exc).__name__

    def _latest(self) -> Answer | None:
        """The freshest background answer; starts the next round when one is due."""
        now = self.clock()
        with self._lock:
            idle = self._thread is None or not self._thread.is_alive()
            if idle and now - self._asked >= ASK_EVERY_S:
                self._asked = now
                self._thread = threading.Thread(target=self._run, name="fleet-decider",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            got = self._answer
        if got is None or now - got[0] > FRESH_S:
            return None
        return got[1]

    def _run(self) -> None:
        answer = self._ask()
        with self._lock:
            self._answer = (self.clock(), answer)

    def wait(self, timeout: float) -> None:
        """Block until the running round ends (tests)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _decide(self, where: str, win: Candidate | None, limited: str | None) -> str | None:
        if limited:
            self._winner_since = None
            return f"{where}: {limited}"
        if win is None or win.node != self.node:
            self._winner_since = None
            if win is None:
                return f"{where}: Prometheus has no cause rank for it yet"
            return (f"{where}: the root cause is rank {win.rank} on node {win.node} "
                    f"({win.signature}); that node's watchdog decides")  # fmt: skip
        now = self.clock()
        if self._winner_since is None:
            self._winner_since = now
        if now - self._winner_since < self.cfg.fleet_settle_s:
            return (f"{where}: this node holds the root cause; acting once Prometheus has named "
                    f"it for fleet_settle_s ({self.cfg.fleet_settle_s:g} s)")  # fmt: skip
        return None

    def _limits(self, dep: str) -> str | None:
        """The deployment's cooldown and cap, over every watchdog of it (None: within them)."""
        cfg, join = (
            self.cfg,
            (
                " * on (instance, job) group_left (deployment) "
                f'hang_watchdog_deployment_info{{deployment="{dep}"}}'
            ),
        )
        last = self._scalar(f"max({LAST_RESTART}{join})")
        if last is not None and cfg.cooldown_s > 0:
            ago = self.wall() - last
            if ago < cfg.cooldown_s:
                return (f"restarted by one of its watchdogs {max(ago, 0):.0f} s ago, within "
                        f"cooldown_s ({cfg.cooldown_s:g} s)")  # fmt: skip
        window = f"{max(1, int(cfg.restart_window_s))}s"
        count = self._scalar(f"sum(increase({RESTARTS}[{window}]){join})")
        if count is not None and round(count) >= cfg.max_restarts:
            return (f"{round(count)} restarts by its watchdogs within restart_window_s "
                    f"(max_restarts {cfg.max_restarts})")  # fmt: skip
        return None

    def _scalar(self, expr: str) -> float | None:
        result = self.query(expr) if self.query is not None else []
        return float(result[0]["value"][1]) if result else None


def decider_for(cfg: RemediationConfig, node: str) -> FleetDecider | None:
    """The cause mode's decider for this node of a deployment (None outside cause mode)."""
    if not cfg.deployment or cfg.fleet_remediation != "cause":
        return None
    return FleetDecider(cfg, node)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def fleet_block(
    cfg: RemediationConfig, verdict: Verdict, decider: FleetDecider | None = None
) -> str | None:
    """Why this instance must not act for its deployment, or None when it may (or no fleet)."""
    if not cfg.deployment:
        return None
    where = f"deployment {cfg.deployment!r}"
    if cfg.fleet_remediation == "leader":
        if cfg.fleet_leader:
            return None
        return f"{where}: only the leader's watchdog (fleet_leader = true) restarts it"
    if verdict.cause_rank is None:
        ranks = ", ".join(map(str, verdict.waiting_ranks))
        waiting = f" (ranks {ranks} wait)" if ranks else ""
        return (
            f"{where}: no rank on this node is the cause{waiting}; "
            "the node that holds the root cause decides"
        )
    if decider is None:
        return f"{where}: no fleet decider (fleet_prometheus_url unset)"
    return decider.block(verdict)
