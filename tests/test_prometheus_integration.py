"""A real Prometheus (loopback only) scrapes the watchdog and evaluates the shipped rules and
every dashboard and Grafana-alert query."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.simfixtures import cdn_factory, sim_env, sim_factory, stop_process  # noqa: F401 (fixtures)
from watchdog.core.model import Connection, GpuSample, Observation, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.metrics_http import MetricsServer

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "grafana" / "hang-watchdog-dashboard.json"
GRAFANA_ALERTS = ROOT / "grafana" / "alerting" / "hang-watchdog-alerts.yaml"
SIGNATURES = ("cubin_download_stall", "gpu_kernel_spin", "engine_dead")
# What Grafana substitutes for the dashboard's variables before a query reaches Prometheus.
GRAFANA_VARS = {"$instance": ".*", "$__range": "5m", "$__rate_interval": "15s"}

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """The real `prometheus` binary on 127.0.0.1 with the shipped rules, for one test."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: install it (apt-get install prometheus) and rerun")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "hang-watchdog", "static_configs": [{"targets": targets}]}
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: self._ready(), 60, "prometheus /-/ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited {self.proc.returncode}; see {self.log.name}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; fails the test on any PromQL error."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        return list(body["data"]["alerts"])

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20.0)
        self.log.close()


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `cond` until true; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def firing(prom: Prometheus, name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.alerts()
        if a["state"] == "firing"
        and a["labels"]["alertname"] == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expr) for every panel query and annotation in the dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    out += [(a["name"], a["expr"]) for a in dash["annotations"]["list"] if "expr" in a]
    return out


def substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


class FedSink:
    """A MetricsSink fed a hung download stall every 0.5 s from a thread, served over HTTP."""

    def __init__(self) -> None:
        self.sink = MetricsSink(SIGNATURES, version="0.0.test")
        self.server = MetricsServer(self.sink, "127.0.0.1:0")
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        gpu = GpuSample(0, "GPU-int", sm=0.02, dram=0.0, power_w=90.0)
        conn = Connection(1, "edge.example", "127.0.0.1", 443, "ESTABLISHED", 5.0)
        verdict = Verdict(
            state="hung",
            signature="cubin_download_stall",
            confidence=0.95,
            seconds_since_progress=120.0,
            progress_ratio=0.4,
        )
        while not self.stop_event.is_set():
            obs = Observation(
                t=time.monotonic(),
                wall=time.time(),
                gpus=(gpu,),
                conns=(conn,),
                sources={"gpu": True, "logs": True},
            )
            self.sink.observe(obs, verdict, 0.2)
            self.stop_event.wait(0.5)

    def start(self) -> str:
        host, port = self.server.start()
        self.sink.stack_capture("ok")
        self.sink.remediation("disable_trtllm_attention", "planned")
        self.sink.set_fallback_active("disable_trtllm_attention", False)
        self.thread.start()
        return f"{host}:{port}"

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)
        self.server.stop()


@pytest.fixture
def fed_prometheus(tmp_path: Path) -> Iterator[tuple[Prometheus, FedSink]]:
    fed = FedSink()
    target = fed.start()
    prom = Prometheus(tmp_path, [target])
    try:
        yield prom, fed
    finally:
        prom.stop()
        fed.stop()


def test_dashboard_grafana_queries_and_hung_alert(fed_prometheus: tuple[Prometheus, FedSink]):
    prom, fed = fed_prometheus
    wait_for(
        lambda: bool(prom.query("count_over_time(hang_watchdog_state[1m]) >= 5")),
        90,
        "Prometheus to hold a few scrapes of the watchdog",
    )
    fed.sink.incident("cubin_download_stall")  # after scraping began, as in production
    wait_for(
        lambda: bool(prom.query("count_over_time(hang_watchdog_state[1m]) >= 20")),
        90,
        "Prometheus to scrape the incident and enough samples for rate()",
    )
    # Every dashboard query and annotation runs without error and returns data.
    for title, expr in dashboard_targets():
        assert prom.query(substitute(expr)), f"dashboard panel {title!r} is empty: {expr}"
    assert prom.query("hang_watchdog_build_info")  # what the instance variable lists
    # Every Grafana-managed alert query runs without error.
    grafana = yaml.safe_load(GRAFANA_ALERTS.read_text())
    results = {
        rule["title"]: prom.query(rule["data"][0]["model"]["expr"])
        for group in grafana["groups"]
        for rule in group["rules"]
    }
    assert [r["metric"]["signature"] for r in results["InferenceServerHung"]] == [
        "cubin_download_stall"
    ]
    assert results["HangWatchdogDown"] == []
    # The shipped rules fire on the hang (after their for:) and on nothing else.
    wait_for(
        lambda: bool(firing(prom, "InferenceServerHung", signature="cubin_download_stall")),
        120,
        "InferenceServerHung to fire",
    )
    names = {a["labels"]["alertname"] for a in prom.alerts()}
    assert names == {"InferenceServerHung", "InferenceCubinDownloadStall"}


class Watchdog:
    """`python -m watchdog run` against one simulated vLLM, serving metrics on loopback."""

    def __init__(self, tmp: Path, sim: Any, cdn_port: int, name: str) -> None:
        self.target = f"127.0.0.1:{free_port()}"
        self.log = (tmp / f"watchdog-{name}.log").open("w")
        argv = [sys.executable, "-m", "watchdog", "run", "--pid", str(sim.pid)]
        argv += ["--gpu-source", f"file:{sim.gpu_file}", "--log-file", str(sim.log_file)]
        argv += ["--server-url", f"http://127.0.0.1:{sim.port}"]
        argv += ["--cdn-host", f"127.0.0.1:{cdn_port}", "--no-cdn-default"]
        argv += ["--metrics-addr", self.target]
        argv += ["--incident-dir", str(tmp / f"incidents-{name}")]
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=sim_env(), cwd=tmp
        )

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20.0)
        self.log.close()


def test_real_watchdog_hung_sim_fires_and_healthy_sim_does_not(
    tmp_path: Path,
    sim_factory: Callable[..., Any],  # noqa: F811 (pytest fixture from simfixtures)
    cdn_factory: Callable[[str], int],  # noqa: F811
):
    """One Prometheus scrapes two real watchdogs: one on a download stall, one on a healthy sim."""
    cdn_port = cdn_factory("blackhole")
    cdn_url = ["--cdn-url", f"http://127.0.0.1:{cdn_port}/"]
    hung_sim = sim_factory("cubin_download_stall", mode="serve", extra_args=cdn_url)
    healthy_sim = sim_factory("healthy", mode="serve", extra_args=cdn_url)
    hung = Watchdog(tmp_path, hung_sim, cdn_port, "hung")
    healthy = Watchdog(tmp_path, healthy_sim, cdn_port, "healthy")
    prom = Prometheus(tmp_path, [hung.target, healthy.target])
    try:
        wait_for(
            lambda: bool(
                firing(
                    prom,
                    "InferenceServerHung",
                    instance=hung.target,
                    signature="cubin_download_stall",
                )
            ),
            150,
            f"InferenceServerHung{{signature=cubin_download_stall}} (see {hung.log.name})",
        )
        # The dashboard on a real watchdog: every query runs, and the panels an operator reads
        # first show the hung instance's figures.
        vars_hung = {**GRAFANA_VARS, "$instance": hung.target.replace(".", "\\\\.")}
        shown = {}
        for title, expr in dashboard_targets():
            for var, value in vars_hung.items():
                expr = expr.replace(var, value)
            shown[title] = shown.get(title, False) or bool(prom.query(expr))
        wanted = ("Server state per instance", "SM utilisation vs DRAM bandwidth per GPU",
                  "Seconds since progress", "Hang signatures", "CDN connections",
                  "Source health", "Watchdog loop age and duration", "GPU power")  # fmt: skip
        assert [t for t in wanted if not shown.get(t)] == [], shown
        # The healthy watchdog ran as long as the hung one, well past every hang rule's for:.
        assert prom.query(
            f'hang_watchdog_state{{instance="{healthy.target}",state="serving"}} == 1'
        )
        noisy = [
            a["labels"] for a in prom.alerts() if a["labels"].get("instance") == healthy.target
        ]
        assert noisy == [], f"alerts on the healthy sim: {noisy}"
    finally:
        prom.stop()
        hung.stop()
        healthy.stop()
