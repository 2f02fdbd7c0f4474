"""Remediation of a multi-node deployment: decided once, by the instance holding the cause."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from tests.test_remediation import SIGS, FakeDaemon, hang, make_hook, obs
from watchdog.config import build_config
from watchdog.remediation.fleet import fleet_block


def _cause(rank: int | None, waiting: tuple[int, ...] = ()):
    return replace(hang(), cause_rank=rank, cause_role="Worker" if rank is not None else "",
                   waiting_ranks=waiting)  # fmt: skip


def test_standalone_servers_are_unaffected() -> None:
    assert fleet_block(build_config({}), _cause(None)) is None


def test_only_the_node_with_the_cause_rank_may_act() -> None:
    cfg = build_config({"deployment": "llama-405b"})
    assert fleet_block(cfg, _cause(5, (0, 1, 2))) is None
    why = fleet_block(cfg, _cause(None, (0, 1, 2, 3)))
    assert why is not None and "no rank on this node is the cause (ranks 0, 1, 2, 3 wait)" in why
    assert "llama-405b" in why


def test_leader_mode_acts_only_on_the_leader() -> None:
    leader = build_config({"deployment": "d", "fleet_remediation": "leader", "fleet_leader": True})
    other = build_config({"deployment": "d", "fleet_remediation": "leader"})
    assert fleet_block(leader, _cause(None)) is None
    assert "only the leader" in (fleet_block(other, _cause(3)) or "")


def test_waiting_node_hook_reports_and_never_restarts(tmp_path: Path) -> None:
    hook, restarter, _ = make_hook(tmp_path, deployment="llama-405b", dry_run=False)
    daemon = FakeDaemon({"vllm": "0.14.0"})
    for t in range(3):
        hook.on_tick(obs(float(t)), _cause(None, (0, 1)), daemon)
    time.sleep(0.2)
    assert restarter.calls == [] and hook._job is None
    out = daemon.out.getvalue()
    assert out.count("the node that holds the root cause decides") == 1, out  # said once


def test_cause_node_hook_restarts_once(tmp_path: Path) -> None:
    hook, restarter, _ = make_hook(tmp_path, deployment="llama-405b")
    daemon = FakeDaemon({"vllm": "0.14.0"})
    hook.on_tick(obs(1.0), _cause(None, (0, 1)), daemon)  # stacks not in yet: no cause named
    assert restarter.calls == []
    hook.on_tick(obs(2.0), _cause(1, (0,)), daemon)  # now the cause rank is on this node
    deadline = time.monotonic() + 10
    while not restarter.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(restarter.calls) == 1, restarter.calls
    assert SIGS.get("trtllm_attention_deadlock") is not None
