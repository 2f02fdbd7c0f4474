"""Remediation of a multi-node deployment is decided once, for the root cause.

Every node of a deployment has its own watchdog and each sees the hang: the ranks on the other
nodes wait in a collective for the one that is stuck. If each restarted its own server, a
deployment would be torn down N times and the cause restarted last. With `deployment` set:

- `fleet_remediation = "cause"`: only the watchdog whose own verdict names the cause rank (a
  download, a spinning kernel, the rank its peers wait on) acts; the others report and wait.
- `fleet_remediation = "leader"`: only the instance with `fleet_leader = true` acts (the one
  whose restarter restarts the whole deployment, e.g. the LeaderWorkerSet leader pod).

Limits (cooldown, max_restarts) and dry-run live with the one instance that acts, so they count
per deployment.
"""

from __future__ import annotations

from watchdog.config import Config
from watchdog.core.model import Verdict


def fleet_block(cfg: Config, verdict: Verdict) -> str | None:
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
    return None
