"""The series that join many watchdogs into one deployment: labels and per-rank progress.

Each watchdog watches one server; a model that spans nodes has one watchdog per node. These
series carry `deployment`, `node`, `engine` and a bounded `rank` (never a pid), so the shipped
Prometheus rules (prometheus/fleet.yml) can pick, per deployment, the first rank to stop and
the highest-priority cause across nodes.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from watchdog.core.model import Observation, ProcInfo, Verdict
from watchdog.core.state.rankroles import MAX_RANK, ranked_procs

MAX_RANK_SERIES = 256  # per watchdog: a node has at most a few dozen ranks; bound the series
Series = list[tuple[tuple[str, ...], float]]

INFO = "hang_watchdog_deployment_info"
LAST_PROGRESS = "hang_watchdog_rank_last_progress_timestamp_seconds"
CAUSE = "hang_watchdog_rank_cause_priority"
WAITING = "hang_watchdog_rank_waiting"
NAMES = (INFO, LAST_PROGRESS, CAUSE, WAITING)


@dataclass(frozen=True)
class FleetLabels:
    """This watchdog's place in a fleet."""

    deployment: str = ""
    node: str = ""

    @classmethod
    def resolve(cls, deployment: str, node: str) -> FleetLabels:
        """The configured labels; the node defaults to the host name."""
        return cls(deployment, node or socket.gethostname().split(".", 1)[0])


def engine_of(obs: Observation) -> str:
    """The engine: the engine profile's fact when set, else what the process titles say."""
    engine = obs.facts.get("engine")
    if isinstance(engine, str) and engine:
        return engine
    titles = " ".join(p.title for p in obs.procs.procs) if obs.procs is not None else ""
    for name, marks in (("sglang", ("sglang",)), ("trtllm", ("trtllm",)), ("vllm", ("vllm",))):
        if any(m in titles.lower() for m in marks):
            return name
    return "unknown"


def _ranked(procs: tuple[ProcInfo, ...]) -> list[tuple[int, str]]:
    """(rank, role) of the processes that have a rank; TP=1: the engine core is rank 0."""
    return sorted({(rank, role) for _, role, rank in ranked_procs(procs)})[:MAX_RANK_SERIES]


def _last_progress(obs: Observation, verdict: Verdict) -> dict[int, float]:
    """Per rank, the wall time of its own last progress (core/state/rankprogress.py); the oldest
    when two processes claim one rank."""
    out: dict[int, float] = {}
    for rp in verdict.rank_progress:
        t = obs.wall - rp.seconds
        out[rp.rank] = min(t, out.get(rp.rank, t))
    return out


def fleet_series(obs: Observation, verdict: Verdict, labels: FleetLabels) -> dict[str, Series]:
    """The fleet series of one loop."""
    engine = engine_of(obs)
    base = (labels.deployment, labels.node, engine)
    out: dict[str, Series] = {n: [] for n in NAMES}
    out[INFO] = [(base, 1.0)]
    ranks = [(v.rank, v.role) for v in verdict.ranks if v.rank is not None]
    if not ranks and obs.procs is not None:
        ranks = _ranked(obs.procs.procs)
    ranks = sorted({(r, role) for r, role in ranks if 0 <= r < MAX_RANK})[:MAX_RANK_SERIES]
    since = verdict.seconds_since_progress
    last = obs.wall - since if since is not None else obs.wall
    per_rank = _last_progress(obs, verdict)
    hang = verdict.is_hang or verdict.state == "stalled"
    for rank, role in ranks:
        key = (*base, str(rank), role)
        out[LAST_PROGRESS].append((key, per_rank.get(rank, last)))
        out[WAITING].append((key, float(hang and rank in verdict.waiting_ranks)))
        if verdict.is_hang and rank == verdict.cause_rank and verdict.signature:
            out[CAUSE].append(((*key, verdict.signature), float(max(verdict.priority, 1))))
    return out
