"""Verdicts under faults: a stopped server is named as such, and a /health that
flaps is not a dead engine each time it answers 503."""

from __future__ import annotations

from dataclasses import replace

from tests.obsbuilder import Timeline, procs, verdicts
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import ServerSample

SIGS = load_signatures([])


def stopped_tree() -> object:
    tree = procs()
    engine = replace(tree.procs[1], status="stopped")
    return replace(tree, procs=(tree.procs[0], engine))


def test_a_stopped_engine_is_named_not_a_generic_stall() -> None:
    tl = Timeline(procs=procs())
    tl.ticks(5)
    tl.ticks(3, procs=stopped_tree())
    v = verdicts(tl.obs, SIGS)[-1][1]
    assert v.state == "stalled"
    assert "is stopped (state T)" in v.reason and "VLLM::EngineCore" in v.reason
    assert "kill -CONT" in v.fix


def test_one_tick_stopped_is_not_reported() -> None:
    tl = Timeline(procs=procs())
    tl.ticks(5)
    tl.tick(procs=stopped_tree())
    assert "stopped" not in verdicts(tl.obs, SIGS)[-1][1].reason


def test_a_flapping_health_is_never_dead() -> None:
    ok = ServerSample(up=True, health_status=200)
    bad = ServerSample(up=True, health_status=503)
    tl = Timeline(procs=procs())
    for i in range(24):
        tl.tick(server=bad if i % 2 else ok)
    states = [v.state for _, v in verdicts(tl.obs, SIGS)]
    assert "dead" not in states


def test_a_health_that_stays_503_is_dead() -> None:
    bad = ServerSample(up=True, health_status=503)
    tl = Timeline(procs=procs())
    tl.ticks(2, server=ServerSample(up=True, health_status=200))
    tl.ticks(4, server=bad)
    v = verdicts(tl.obs, SIGS)[-1][1]
    assert v.state == "dead" and v.signature == "engine_dead"


def test_the_stopped_line_does_not_show_a_secret() -> None:
    tree = procs()
    engine = replace(tree.procs[0], status="stopped", title="vllm serve m --api-key s3cr3tvalue")
    tl = Timeline(procs=replace(tree, procs=(engine, tree.procs[1])))
    tl.ticks(3)
    v = verdicts(tl.obs, SIGS)[-1][1]
    assert "is stopped" in v.reason and "s3cr3tvalue" not in v.reason
