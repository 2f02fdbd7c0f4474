"""The fleet series: deployment/node/engine labels, per-rank progress, the cause, no pid labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from watchdog.core.model import Observation, ProcInfo, ProcSnapshot, RankView, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.exposition import render_text
from watchdog.outputs.fleet import FleetLabels

WORKERS = tuple(
    ProcInfo(4000 + r, 10, "python", f"VLLM::Worker_TP{r}", role="worker", rank=r) for r in range(4)
)
API = ProcInfo(10, 1, "python", "vllm serve meta-llama/Llama-3.1-405B")


def _scrape(sink: MetricsSink) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    text = render_text(sink.collect()).decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _sink() -> MetricsSink:
    fleet = FleetLabels("llama-405b", "node-b")
    return MetricsSink(["cubin_download_stall"], version="t", wall=lambda: 1000.0, fleet=fleet)


def _obs() -> Observation:
    return Observation(t=50.0, wall=2000.0, procs=ProcSnapshot(10, True, (API, *WORKERS)))


def test_healthy_server_exports_every_rank_with_fleet_labels() -> None:
    sink = _sink()
    sink.observe(_obs(), Verdict(state="serving", seconds_since_progress=1.5), None)
    got = _scrape(sink)
    (info,) = got["hang_watchdog_deployment_info"]
    assert info == ({"deployment": "llama-405b", "node": "node-b", "engine": "vllm"}, 1.0)
    last = got["hang_watchdog_rank_last_progress_timestamp_seconds"]
    assert sorted(labels["rank"] for labels, _ in last) == ["0", "1", "2", "3"]
    assert all(v == 1998.5 and labels["role"] == "worker" for labels, v in last)
    assert all(v == 0.0 for _, v in got["hang_watchdog_rank_waiting"])
    assert "hang_watchdog_rank_cause_priority" not in got
    for samples in got.values():
        for labels, _ in samples:
            assert "pid" not in labels and not any(str(p.pid) in labels.values() for p in WORKERS)


def test_hang_names_the_cause_rank_with_its_priority_and_the_waiting_ranks() -> None:
    views = tuple(
        RankView(p.pid, "worker", p.rank, p.title, part="cause" if p.rank == 2 else "waiting")
        for p in WORKERS
    )
    verdict = Verdict(
        state="hung",
        signature="cubin_download_stall",
        seconds_since_progress=40.0,
        priority=50,
        ranks=views,
        cause_rank=2,
        waiting_ranks=(0, 1, 3),
    )
    sink = _sink()
    sink.observe(_obs(), verdict, None)
    got = _scrape(sink)
    (cause,) = got["hang_watchdog_rank_cause_priority"]
    assert cause[0]["rank"] == "2" and cause[0]["signature"] == "cubin_download_stall"
    assert cause[0]["node"] == "node-b" and cause[1] == 50.0
    waiting = {labels["rank"]: v for labels, v in got["hang_watchdog_rank_waiting"]}
    assert waiting == {"0": 1.0, "1": 1.0, "2": 0.0, "3": 1.0}
    stamps = {v for _, v in got["hang_watchdog_rank_last_progress_timestamp_seconds"]}
    assert stamps == {1960.0}
    sink.observe(_obs(), Verdict(state="serving", seconds_since_progress=0.5), None)
    assert "hang_watchdog_rank_cause_priority" not in _scrape(sink)  # no stale cause


def test_tp1_engine_core_is_rank_0_and_node_defaults_to_the_host_name() -> None:
    labels = FleetLabels.resolve("", "")
    assert labels.node and "." not in labels.node
    engine = ProcInfo(11, 10, "python", "VLLM::EngineCore")
    sink = MetricsSink([], version="t", fleet=labels)
    sink.observe(
        Observation(t=1, wall=5.0, procs=ProcSnapshot(10, True, (API, engine))),
        Verdict(state="idle"),
        None,
    )
    (last,) = _scrape(sink)["hang_watchdog_rank_last_progress_timestamp_seconds"]
    assert last[0]["rank"] == "0" and last[0]["role"] == "EngineCore" and last[1] == 5.0
