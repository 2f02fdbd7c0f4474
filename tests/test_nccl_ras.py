"""The NCCL RAS source against a stand-in RAS service on loopback (tests/rasstandin.py, built from
NCCL v2.29.7-1's client protocol and JSON report): healthy, an unresponsive rank, a dead rank, a
rank behind its peers, the service absent, and a service that trickles bytes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from rasstandin import RasStandIn, absent_addr, report

from watchdog.sources.nccl_ras import (
    RasClient,
    RasError,
    RasSource,
    analyse,
    parse_address,
    parse_report,
)


@pytest.fixture
def standin() -> Iterator[list[RasStandIn]]:
    made: list[RasStandIn] = []
    yield made
    for s in made:
        s.stop()


def _serve(standin: list[RasStandIn], mode: str) -> RasStandIn:
    s = RasStandIn(mode)
    standin.append(s)
    return s


def test_healthy_job_has_no_evidence_and_the_client_only_reads(standin) -> None:
    srv = _serve(standin, "healthy")
    rep = RasClient(srv.addr, deadline_s=5).query()
    assert rep.nccl_version == "2.28.9" and len(rep.comms) == 1
    (comm,) = rep.comms
    assert comm.size == 16 and len(comm.ranks) == 16 and comm.missing == ()
    assert {r.total for r in comm.ranks} == {1235}
    assert analyse(rep) == []
    # The whole conversation: handshake, a timeout, the format, one read-only STATUS.
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]


@pytest.mark.parametrize(
    ("mode", "line"),
    [
        ("unresponsive", "rank 11 on 10.0.0.2 is unresponsive"),
        ("dead", "rank 11 on 10.0.0.2 is considered dead"),
        ("behind", "rank 11 on 10.0.0.2 stopped at collective #1234; its peers are at #1235"),
    ],
)
def test_a_rank_that_holds_the_others_is_named(standin, mode: str, line: str) -> None:
    srv = _serve(standin, mode)
    evidence = analyse(RasClient(srv.addr, deadline_s=5).query())
    assert evidence == [f"NCCL communicator 0x5e7a9c1f2b3d4e5f (16 ranks): {line}"]


def test_absent_service_is_said_once_and_never_an_error_loop(caplog) -> None:
    now = [0.0]
    source = RasSource(RasClient(absent_addr(), deadline_s=2), interval_s=1.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="hang_watchdog.sources.nccl_ras")
    for _ in range(30):
        source.poll()
        source.wait(5)
        now[0] += 1.0
    latest = source.poll()
    assert latest["up"] is False and "does not answer" in latest["error"]
    said = [r for r in caplog.records if "not available" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # auto mode backs off: 30 s of polls with a 1 s interval made only a few attempts.
    attempts = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(attempts) == 1


def test_trickling_service_is_cut_off_at_the_deadline(standin) -> None:
    srv = _serve(standin, "trickle")
    started = time.monotonic()
    with pytest.raises(RasError, match="did not finish within 1.5 s"):
        RasClient(srv.addr, deadline_s=1.5).query()
    took = time.monotonic() - started
    assert took < 3.0, took
    print(f"trickling RAS service: query cut off after {took:.2f} s (deadline 1.5 s)")


def test_source_reports_evidence_in_the_background(standin) -> None:
    srv = _serve(standin, "dead")
    source = RasSource(RasClient(srv.addr, deadline_s=5), mode="on", interval_s=60)
    first = source.poll()  # never blocks: the query runs in the background
    assert first["up"] is False and first["evidence"] == []
    source.wait(10)
    latest = source.poll()
    assert latest["up"] is True and source.health.up
    assert latest["evidence"] and "considered dead" in latest["evidence"][0]


def test_not_a_ras_service_and_bad_reports_are_clear_errors() -> None:
    with pytest.raises(RasError, match="JSON reports need NCCL"):
        parse_report("RAS text report\n")
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("localhost")
    assert parse_address("[::1]:28028") == ("::1", 28028)


def test_nccl_228_missing_rank_without_comma_still_parses() -> None:
    """NCCL 2.28.9 wrote `"nvml_dev": 3` with no comma before `"status"` for a missing rank."""
    text = report("dead").replace(
        '"nvml_dev": 3,\n          "status"', '"nvml_dev": 3\n          "status"'
    )
    assert text != report("dead")
    (comm,) = parse_report(text).comms
    assert comm.missing[0].dead is True


@pytest.mark.slow
def test_diagnose_shows_nccl_ras_evidence(standin, tmp_path) -> None:
    """A real watchdog against a TP=2 sim whose ranks wait in all_reduce, with RAS saying which
    rank is dead: the verdict carries NCCL's view as evidence."""
    import json
    import subprocess
    import sys

    from tests.simfixtures import sim_env, start_sim

    srv = _serve(standin, "dead")
    sim = start_sim(
        tmp_path, "collective_wait", mode="serve", extra_args=["--tp", "2", "--gpus", "2"]
    )
    try:
        argv = [sys.executable, "-m", "watchdog", "diagnose", "--pid", str(sim.pid)]
        argv += ["--server-url", f"http://127.0.0.1:{sim.port}", "--log-file", str(sim.log_file)]
        argv += ["--gpu-source", f"file:{sim.gpu_file}", "--stall-after-s", "5"]
        argv += ["--suspect-after-s", "2", "--stack-second-after-s", "1", "--duration", "15"]
        argv += ["--nccl-ras", "on", "--nccl-ras-addr", srv.addr, "--json", "--no-cdn-default"]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=sim_env(), cwd=tmp_path
        )
    finally:
        sim.stop()
    verdict = json.loads(done.stdout)
    assert verdict["signature"] == "collective_hang", done.stderr[-2000:]
    ras = [e["detail"] for e in verdict["evidence"] if e["source"] == "nccl_ras"]
    assert ras == ["NCCL communicator 0x5e7a9c1f2b3d4e5f (16 ranks): rank 11 on 10.0.0.2 is "
                   "considered dead"], verdict["evidence"]  # fmt: skip
    assert "STATUS" in srv.commands and set(srv.commands) <= {
        "CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"}  # fmt: skip


def _exported(ras: RasSource) -> dict[tuple[str, tuple[str, ...]], float]:
    """What /metrics carries for one loop of a daemon whose only source is `ras`."""
    from prometheus_client.parser import text_string_to_metric_families

    from watchdog.config import Config
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.core.model import Verdict
    from watchdog.daemon.loop import Daemon
    from watchdog.outputs.export import MetricsSink
    from watchdog.outputs.exposition import render_text

    sink = MetricsSink([], version="test")
    daemon = Daemon(Config(metrics_addr="off", cdn_default=False), load_signatures(), [ras])
    try:
        obs = daemon.observe()
    finally:
        daemon.close()
    sink.observe(obs, Verdict(state="idle"), None)
    text = render_text(sink.collect()).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "nccl_ras" in s.name or s.name == "hang_watchdog_source_up"
    }


def _with_ras(addr: str, *, configured: bool, mode: str = "auto") -> RasSource:
    ras = RasSource(RasClient(addr, deadline_s=2), mode=mode, interval_s=60, configured=configured)
    ras.poll()
    ras.wait(10)
    return ras


def test_not_configured_and_absent_is_no_source_at_all(caplog) -> None:
    caplog.set_level(logging.INFO, logger="hang_watchdog")
    metrics = _exported(_with_ras(absent_addr(), configured=False))
    assert not [k for k in metrics if ("source", "nccl_ras") in k[1]], metrics
    assert not [k for k in metrics if k[0].startswith("hang_watchdog_nccl_ras")], metrics
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_configured_but_not_answering_is_a_source_that_is_down(caplog) -> None:
    caplog.set_level(logging.INFO, logger="hang_watchdog")
    ras = _with_ras(absent_addr(), configured=True)
    for _ in range(3):  # a down source, said once per outage, not once per query
        ras._next = 0.0
        ras.poll()
        ras.wait(10)
    metrics = _exported(ras)
    assert metrics[("hang_watchdog_source_up", (("source", "nccl_ras"),))] == 0.0
    downs = [r for r in caplog.records if "source nccl_ras is down" in r.getMessage()]
    assert len(downs) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("healthy", {"dead": 0, "unresponsive": 0, "behind": 0, "async_error": 0}),
        ("dead", {"dead": 1, "unresponsive": 0, "behind": 0, "async_error": 0}),
        ("unresponsive", {"dead": 0, "unresponsive": 1, "behind": 0, "async_error": 0}),
        ("behind", {"dead": 0, "unresponsive": 0, "behind": 1, "async_error": 0}),
    ],
)
def test_findings_are_exported_with_bounded_labels(standin, mode: str, want: dict) -> None:
    ras = _with_ras(_serve(standin, mode).addr, configured=False)  # answered once: a source
    metrics = _exported(ras)
    assert metrics[("hang_watchdog_source_up", (("source", "nccl_ras"),))] == 1.0
    assert metrics[("hang_watchdog_nccl_ras_communicators", ())] == 1.0
    got = {
        dict(k[1])["state"]: int(v)
        for k, v in metrics.items()
        if k[0] == "hang_watchdog_nccl_ras_ranks"
    }
    assert got == want
    behind = {dict(k[1])["rank"]: v for k, v in metrics.items() if "behind" in k[0]}
    assert behind == ({"11": 1.0} if mode == "behind" else {}), behind


def test_ranks_on_this_host_are_mapped_by_pid_for_per_rank_progress() -> None:
    from watchdog.sources.rasreport import findings

    found = findings(parse_report(report("behind")), {"10.0.0.2"})
    # The stand-in's ranks 8-15 run on 10.0.0.2 with pids 4008-4015; rank 11 is one behind.
    assert found["local"] == {str(4000 + r): 1235 - (r == 11) for r in range(8, 16)}
    assert found["behind"] == [[11, 1]]


def test_zero_counts_of_a_single_node_communicator_are_not_read_as_never_launched() -> None:
    """NCCL >= 2.27 leaves opCount at 0 on single-node communicators (NVIDIA/nccl#2021)."""
    from watchdog.sources.rasreport import findings

    one_node = (
        report("healthy", size=8)
        .replace('"AllReduce": 1235', '"AllReduce": 0')
        .replace('"10.0.0.2"', '"10.0.0.1"')
    )
    assert '"10.0.0.2"' not in one_node and '"AllReduce": 1235' not in one_node
    rep = parse_report(one_node)
    (line,) = analyse(rep)
    assert "single-node communicator" in line and "NVIDIA/nccl#2021" in line
    got = findings(rep, local_hosts={"10.0.0.1"})
    assert got["counts"]["behind"] == 0 and got["local"] == {}
    # Before 2.27 the counts were kept there: a 0 is a real count.
    old = parse_report(one_node.replace('"nccl_version": "2.28.9"', '"nccl_version": "2.26.2"'))
    assert analyse(old) == []
    assert findings(old, local_hosts={"10.0.0.1"})["local"]["4000"] == 0
    # Two nodes, all at 0: counted (multi-node communicators count), nothing behind.
    assert (
        analyse(parse_report(report("healthy").replace('"AllReduce": 1235', '"AllReduce": 0')))
        == []
    )


def test_a_timeline_that_kept_ras_among_the_facts_replays_into_the_field() -> None:
    """Recordings made while NCCL's view travelled as the fact `nccl_ras` still replay."""
    from watchdog.core.model import Observation, from_dict, to_dict

    ras = {"up": True, "evidence": ["rank 3 on 10.0.0.2 is considered dead"], "error": None}
    old = from_dict(Observation, {"t": 1.0, "wall": 2.0, "facts": {"nccl_ras": ras, "vllm": "0.9"}})
    assert old.nccl_ras == ras and old.facts == {"vllm": "0.9"}
    again = from_dict(Observation, to_dict(old))
    assert again == old and to_dict(again)["nccl_ras"] == ras
