"""Remediation of a multi-node deployment: decided once, by the instance holding the cause."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from tests.fakes import SIGS, FakeDaemon, hang, make_hook, metric, obs, remedy_config
from watchdog.remediation.deployment import Candidate, FleetDecider, fleet_block, pick
from watchdog.remediation.machine import Phase


def _cause(rank: int | None, waiting: tuple[int, ...] = ()):
    return replace(hang(), cause_rank=rank, cause_role="Worker" if rank is not None else "",
                   waiting_ranks=waiting)  # fmt: skip


def test_standalone_servers_are_unaffected() -> None:
    assert fleet_block(remedy_config({}), _cause(None)) is None


def test_only_the_node_with_the_cause_rank_may_act() -> None:
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 0})  # fmt: skip
    one = _answer([("node-a", 5, 50.0, "cubin_download_stall")], {("node-a", 5): 1000.0})
    assert fleet_block(cfg, _cause(5, (0, 1, 2)), FleetDecider(cfg, "node-a", query=one)) is None
    why = fleet_block(cfg, _cause(None, (0, 1, 2, 3)))
    assert why is not None and "no rank on this node is the cause (ranks 0, 1, 2, 3 wait)" in why
    assert "llama-405b" in why


def test_leader_mode_acts_only_on_the_leader() -> None:
    leader = remedy_config({"deployment": "d", "fleet_remediation": "leader", "fleet_leader": True})
    other = remedy_config({"deployment": "d", "fleet_remediation": "leader"})
    assert fleet_block(leader, _cause(None)) is None
    assert "only the leader" in (fleet_block(other, _cause(3)) or "")


def test_waiting_node_hook_reports_and_never_restarts(tmp_path: Path) -> None:
    hook, restarter, _ = make_hook(tmp_path, deployment="llama-405b", dry_run=False)
    daemon = FakeDaemon({"vllm": "0.14.0"})
    for t in range(3):
        hook.on_tick(daemon.tick(obs(float(t)), _cause(None, (0, 1))))
    time.sleep(0.2)
    assert restarter.calls == [] and hook.machine.phase is Phase.WATCHING
    out = daemon.out.getvalue()
    assert out.count("the node that holds the root cause decides") == 1, out  # said once


def _answer(
    causes: list[tuple[str, int, float, str]],
    last: dict[tuple[str, int], float],
    restarts: float | None = None,
    last_restart: float | None = None,
):
    """Prometheus's /api/v1/query `data.result` for the decider's queries."""

    def query(expr: str) -> list[dict]:
        if expr.startswith("hang_watchdog_rank_cause_priority"):
            return [
                {"metric": {"node": n, "rank": str(r), "signature": sig}, "value": [0, str(p)]}
                for n, r, p, sig in causes
            ]
        if expr.startswith("hang_watchdog_rank_last_progress"):
            return [
                {"metric": {"node": n, "rank": str(r)}, "value": [0, str(t)]}
                for (n, r), t in last.items()
            ]
        assert 'deployment="llama-405b"' in expr, expr
        value = last_restart if "last_restart_timestamp" in expr else restarts
        assert "last_restart_timestamp" in expr or "increase(" in expr, expr
        return [] if value is None else [{"metric": {}, "value": [0, str(value)]}]

    return query  # fmt: skip


TWO_CAUSES = (
    [("node-a", 1, 50.0, "cubin_download_stall"), ("node-b", 0, 50.0, "cubin_download_stall")],
    {("node-a", 0): 1010.0, ("node-a", 1): 1003.0, ("node-b", 0): 1005.0, ("node-b", 1): 1009.0},
)


def test_two_nodes_each_holding_a_cause_agree_on_one() -> None:
    """Each node reads the same answer; only the one whose cause rank stopped first acts."""
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 0})  # fmt: skip
    said = {}
    for node in ("node-a", "node-b"):
        decider = FleetDecider(cfg, node, query=_answer(*TWO_CAUSES))
        said[node] = fleet_block(cfg, _cause(0 if node == "node-b" else 1), decider)
    assert said["node-a"] is None, said
    assert "the root cause is rank 1 on node node-a" in (said["node-b"] or ""), said


def test_priority_first_then_first_stop_then_lowest_node_and_rank() -> None:
    a = Candidate("node-b", 3, 50.0, 1000.0)
    assert pick([Candidate("node-a", 0, 10.0, 900.0), a]) == a  # priority wins over time
    assert pick([Candidate("node-a", 0, 50.0, 1001.0), a]) == a  # then the first to stop
    tie = [Candidate("node-b", 0, 50.0, 1000.0), Candidate("node-a", 7, 50.0, 1000.0),
           Candidate("node-a", 2, 50.0, 1000.0)]  # fmt: skip
    assert pick(tie) == tie[2] and pick(list(reversed(tie))) == tie[2]
    assert pick([]) is None


def test_no_prometheus_means_nobody_acts_and_says_how_to_fix() -> None:
    cfg = remedy_config({"deployment": "llama-405b"})
    why = fleet_block(cfg, _cause(1), FleetDecider(cfg, "node-a"))
    assert why is not None and "set fleet_prometheus_url" in why

    def down(expr: str) -> list[dict]:
        raise OSError("connection refused")

    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x"})
    why = fleet_block(cfg, _cause(1), FleetDecider(cfg, "node-a", query=down))
    assert why is not None and "did not answer (connection refused)" in why


def test_a_restart_by_another_node_starts_the_deployments_cooldown() -> None:
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 0, "cooldown_s": 600})  # fmt: skip
    answer = _answer(*TWO_CAUSES, restarts=1.0, last_restart=1.7e9 - 100)
    decider = FleetDecider(cfg, "node-a", query=answer, wall=lambda: 1.7e9)
    why = fleet_block(cfg, _cause(1), decider) or ""
    assert "restarted by one of its watchdogs 100 s ago, within cooldown_s (600 s)" in why, why
    later = FleetDecider(cfg, "node-a", query=answer, wall=lambda: 1.7e9 + 600)
    assert fleet_block(cfg, _cause(1), later) is None


def test_restarts_by_every_node_count_toward_one_cap() -> None:
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 0, "max_restarts": 3})  # fmt: skip
    for count, blocked in ((1.9, False), (2.96, True)):  # increase() extrapolates
        answer = _answer(*TWO_CAUSES, restarts=count)
        why = fleet_block(cfg, _cause(1), FleetDecider(cfg, "node-a", query=answer))
        assert (why is not None) == blocked, why
    assert "3 restarts by its watchdogs within restart_window_s (max_restarts 3)" in (why or "")


def test_the_winner_waits_fleet_settle_s_before_acting() -> None:
    now = [0.0]
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 10})  # fmt: skip
    decider = FleetDecider(cfg, "node-a", query=_answer(*TWO_CAUSES), clock=lambda: now[0])
    assert "fleet_settle_s" in (fleet_block(cfg, _cause(1), decider) or "")
    now[0] = 10.0
    assert fleet_block(cfg, _cause(1), decider) is None


def test_cause_node_hook_restarts_once(tmp_path: Path) -> None:
    fleet = {"deployment": "llama-405b", "fleet_prometheus_url": "http://x", "fleet_settle_s": 0}
    hook, restarter, sink = make_hook(tmp_path, **fleet)
    assert metric(sink, "hang_watchdog_remediation_restarts_total") == 0.0  # there from the start
    assert metric(sink, "hang_watchdog_remediation_last_restart_timestamp_seconds") is None
    hook.fleet = FleetDecider(hook.cfg, "node-a", query=_answer(*TWO_CAUSES))
    daemon = FakeDaemon({"vllm": "0.14.0"})
    hook.on_tick(daemon.tick(obs(1.0), _cause(None, (0, 1))))  # stacks not in yet: no cause named
    assert restarter.calls == []
    hook.on_tick(daemon.tick(obs(2.0), _cause(1, (0,))))  # now the cause rank is on this node
    deadline = time.monotonic() + 10
    while not restarter.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(restarter.calls) == 1, restarter.calls
    assert SIGS.get("trtllm_attention_deadlock") is not None
    # What the other nodes' deciders read for the deployment's cooldown and cap.
    assert metric(sink, "hang_watchdog_remediation_restarts_total") == 1.0
    last = metric(sink, "hang_watchdog_remediation_last_restart_timestamp_seconds")
    assert last is not None and abs(last - time.time()) < 60, last


def test_a_slow_prometheus_never_holds_the_loop() -> None:
    """The daemon's decider asks in the background: a tick reads the latest answer at once."""
    cfg = remedy_config({"deployment": "llama-405b", "fleet_prometheus_url": "http://x",
                        "fleet_settle_s": 0})  # fmt: skip
    answer = _answer(*TWO_CAUSES)

    def slow(expr: str) -> list[dict]:
        time.sleep(0.5)
        return answer(expr)

    decider = FleetDecider(cfg, "node-a", query=slow, background=True)
    started = time.monotonic()
    first = fleet_block(cfg, _cause(1), decider)
    took = time.monotonic() - started
    # Run inline, the queries would have answered (node-a wins); the tick got "waiting".
    assert first is not None and "waiting for Prometheus at http://x to answer" in first
    decider.wait(10)
    assert fleet_block(cfg, _cause(1), decider) is None
    print(f"first tick with a slow Prometheus took {took * 1000:.1f} ms")
