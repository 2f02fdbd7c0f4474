"""Two simulated nodes, one deployment, one answer: real watchdogs, Prometheus and Alertmanager.

Node a runs a TP=2 simulated vLLM whose rank 1 is stuck in the FlashInfer cubin download (rank
0 waits in all_reduce); node b runs a TP=2 server whose ranks both wait in all_reduce (on node
a). Each node has its own `hang-watchdog run` with its node label. One real Prometheus scrapes
both with the shipped alerts.yml and fleet.yml and sends to one real Alertmanager
(`prometheus-alertmanager`) with the shipped alertmanager.yml. Exactly one alert is active:
InferenceDeploymentHung naming node a and rank 1; every per-node alert is inhibited.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import simfixtures
from tests.fakes import fleet_dashboard_exprs
from tests.simfixtures import SimHandle, sim_env, stop_process

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RULES = [ROOT / "prometheus" / "alerts.yml", ROOT / "prometheus" / "fleet.yml"]
AM_CONFIG = ROOT / "prometheus" / "alertmanager.yml"
DEPLOYMENT = "llama-70b"
SHORT = ["--stall-after-s", "5", "--suspect-after-s", "2", "--stack-second-after-s", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"{names[0]} not found: apt-get install prometheus prometheus-alertmanager")


def _ready(proc: subprocess.Popen[Any], url: str, log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"{url} exited {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Service:
    """A real binary on loopback, stopped by the test."""

    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.url, self.log = url, log
        with log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: _ready(self.proc, url, log), 60, f"{argv[0]} ready")

    def stop(self) -> None:
        stop_process(self.proc, grace_s=10.0)


def start_alertmanager(tmp: Path) -> Service:
    port = free_port()
    argv = [_binary("prometheus-alertmanager", "alertmanager"), f"--config.file={AM_CONFIG}"]
    argv += [f"--storage.path={tmp / 'am'}", f"--web.listen-address=127.0.0.1:{port}"]
    argv += ["--cluster.listen-address=", "--log.level=warn"]
    return Service(argv, f"http://127.0.0.1:{port}", tmp / "alertmanager.log")


def start_prometheus(tmp: Path, targets: list[str], am_url: str | None) -> Service:
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(r) for r in RULES],
        "scrape_configs": [{"job_name": "hang-watchdog", "static_configs": [{"targets": targets}]}],
    }
    if am_url is not None:
        am = am_url.split("//", 1)[1]
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [_binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}"]
    argv += [f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
    argv += ["--log.level=warn"]
    return Service(argv, f"http://127.0.0.1:{port}", tmp / "prometheus.log")


class NodeWatchdog:
    """`hang-watchdog run` for one simulated node, with its own node label and metrics port."""

    def __init__(
        self,
        tmp: Path,
        sim: SimHandle,
        node: str,
        cdn_port: int,
        *,
        target: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.target = target or f"127.0.0.1:{free_port()}"
        self.log = tmp / f"watchdog-{node}.log"
        argv = [sys.executable, "-m", "watchdog", "run", "--pid", str(sim.pid)]
        argv += ["--server-url", f"http://127.0.0.1:{sim.port}", "--log-file", str(sim.log_file)]
        argv += ["--gpu-source", f"file:{sim.gpu_file}", "--metrics-addr", self.target]
        argv += ["--deployment", DEPLOYMENT, "--node", node, *SHORT]
        argv += ["--cdn-host", f"127.0.0.1:{cdn_port}", "--no-cdn-default", *extra]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=sim_env(), cwd=tmp
            )

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20.0)


def _alerts(am: Service) -> list[dict[str, Any]]:
    return httpx.get(f"{am.url}/api/v2/alerts", timeout=5).json()


def _settled(am: Service) -> bool:
    """The root cause, both nodes' fleet alerts and both plain alerts.yml alerts have arrived."""
    alerts = _alerts(am)
    names = {(a["labels"]["alertname"], a["labels"].get("node")) for a in alerts}
    want = {("InferenceDeploymentHung", "node-a"), ("InferenceNodeHung", "node-a")}
    want.add(("InferenceNodeHung", "node-b"))
    plain = [a for a in alerts if a["labels"]["alertname"] == "InferenceServerHung"]
    return want <= names and len(plain) >= 2


def _query(prom: Service, expr: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert resp["status"] == "success", (expr, resp)
    return resp["data"]["result"]


def _check_dashboard(prom: Service) -> None:
    """Every fleet-dashboard query runs on the real Prometheus; the operator's panels show data."""
    shown = {title: bool(_query(prom, expr)) for title, expr in fleet_dashboard_exprs()}
    wanted = ("Root cause per deployment", "First rank to stop", "Hung nodes",
              "Ranks waiting on another (timeline)", "Cause rank (timeline)",
              "Seconds since each rank progressed", "Watchdogs per deployment")  # fmt: skip
    assert [t for t in wanted if not shown[t]] == [], shown
    (root,) = _query(prom, "hang_watchdog:deployment_root_cause:priority")
    assert (root["metric"]["node"], root["metric"]["rank"]) == ("node-a", "1")


def test_two_nodes_one_root_cause_alert_and_the_rest_inhibited(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    cdn = cdn_factory("blackhole")
    tp = ["--tp", "2", "--gpus", "2"]
    sim_a = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*tp, "--hang-rank", "1", "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    sim_b = sim_factory("collective_wait", mode="serve", extra_args=tp)
    started = time.monotonic()
    am = start_alertmanager(tmp_path)
    nodes = [
        NodeWatchdog(tmp_path, sim_a, "node-a", cdn),
        NodeWatchdog(tmp_path, sim_b, "node-b", cdn),
    ]
    prom = start_prometheus(tmp_path, [n.target for n in nodes], am.url)
    try:
        wait_for(lambda: _settled(am), 150, f"alerts in Alertmanager (see {tmp_path})")
        alerts = _alerts(am)
        print(f"root cause and per-node alerts in Alertmanager {time.monotonic() - started:.1f} s "
              "after the simulators started")  # fmt: skip
        active = [a for a in alerts if a["status"]["state"] == "active"]
        assert len(active) == 1, [(a["labels"], a["status"]) for a in active]
        root = active[0]["labels"]
        assert root["alertname"] == "InferenceDeploymentHung"
        assert (root["deployment"], root["node"], root["rank"]) == (DEPLOYMENT, "node-a", "1")
        assert root["signature"] == "cubin_download_stall"
        assert "rank 1 on node node-a" in active[0]["annotations"]["summary"]
        suppressed = [a for a in alerts if a["status"]["state"] == "suppressed"]
        assert {a["labels"]["alertname"] for a in suppressed} >= {
            "InferenceNodeHung",
            "InferenceServerHung",
        }
        assert all(a["status"]["inhibitedBy"] for a in suppressed)
        _check_dashboard(prom)
        plain = {
            a["labels"]["instance"]
            for a in suppressed
            if a["labels"]["alertname"] == "InferenceServerHung"
        }
        assert plain == {n.target for n in nodes}, suppressed
        waits = [a for a in suppressed if a["labels"].get("node") == "node-b"]
        assert [a["labels"]["signature"] for a in waits] == ["collective_hang"]
    finally:
        prom.stop()
        for node in nodes:
            node.stop()
        am.stop()


def _remediation_config(tmp: Path, node: str, prom_url: str) -> Path:
    """Remediation on, the command restarter appending this node's name to a shared file."""
    marker = tmp / "restarts.txt"
    script = f"open({str(marker)!r}, 'a').write({node!r} + '\\n')"
    path = tmp / f"{node}.toml"
    path.write_text(
        "remediate = true\n"
        'restarter = "command"\n'
        f'restart_command = [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}]\n'
        f"state_dir = {json.dumps(str(tmp / ('state-' + node)))}\n"
        'fleet_remediation = "cause"\n'
        f"fleet_prometheus_url = {json.dumps(prom_url)}\n"
        "fleet_settle_s = 5\n"
        "smoke_test = false\n"
    )
    return path


def test_two_nodes_each_holding_a_cause_restart_once(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """Both nodes hold a cause (each a rank stuck in the cubin download): every watchdog reads
    the same Prometheus, and only the node whose cause rank stopped first restarts."""
    cdn = cdn_factory("blackhole")
    url = ["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"]
    # A vLLM version the fallback can be spelled for (an unknown one gets no restart at all).
    tp = ["--tp", "2", "--gpus", "2", "--fake-versions", "vllm=0.19.0"]
    sims = {
        "node-a": sim_factory("cubin_download_stall", mode="serve",
                              extra_args=[*tp, "--hang-rank", "1", *url]),
        "node-b": sim_factory("cubin_download_stall", mode="serve",
                              extra_args=[*tp, "--hang-rank", "0", *url]),
    }  # fmt: skip
    targets = {node: f"127.0.0.1:{free_port()}" for node in sims}
    prom = start_prometheus(tmp_path, list(targets.values()), None)
    nodes = [
        NodeWatchdog(tmp_path, sim, node, cdn, target=targets[node],
                     extra=("--config", str(_remediation_config(tmp_path, node, prom.url))))
        for node, sim in sims.items()
    ]  # fmt: skip
    marker = tmp_path / "restarts.txt"
    try:
        wait_for(marker.exists, 150, f"a restart (see {tmp_path})")
        time.sleep(15)  # the other node has every chance to restart too: it must not
        (root,) = _query(prom, "hang_watchdog:deployment_root_cause:priority")
        named = root["metric"]["node"]
        restarts = marker.read_text().split()
        print(f"restarts: {restarts}; root cause in Prometheus: rank {root['metric']['rank']} "
              f"on {named}")  # fmt: skip
        assert restarts == [named], restarts
        causes = _query(prom, "hang_watchdog_rank_cause_priority")
        assert {c["metric"]["node"] for c in causes} == {"node-a", "node-b"}, causes
        other = next(n for n in nodes if n.target != targets[named])
        assert "that node's watchdog decides" in other.log.read_text()
    finally:
        prom.stop()
        for node in nodes:
            node.stop()
