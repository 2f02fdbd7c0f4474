"""The loop's hooks each on their own, fed a Tick (no daemon): metrics, notify; the idle canary
(a source); the wiring's hook list; and the layer rule that remediation imports neither daemon/
nor outputs/."""

from __future__ import annotations

import ast
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.tickkit import TickKit
from watchdog.config import build_config
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import Observation, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.metrics_hook import MetricsHook
from watchdog.outputs.notify_hook import NotifyHook
from watchdog.sources.base import SourceTick
from watchdog.sources.canary import CanarySource

ROOT = Path(__file__).resolve().parents[1]
SIGS = load_signatures()


def _skipped(sink: MetricsSink) -> dict[str, float]:
    for family in sink.collect():
        if family.name == "hang_watchdog_log_lines_skipped":
            return {
                s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")
            }
    raise AssertionError("no log_lines_skipped family")


def test_the_metrics_hook_counts_log_skips_from_the_observation() -> None:
    sink, kit = MetricsSink(SIGS.ids, version="test"), TickKit()
    hook = MetricsHook(sink)
    idle = Verdict(state="idle")
    for t, totals in enumerate(({}, {"lag": 5}, {"lag": 5}, {"lag": 7, "dropped": 2})):
        hook.on_tick(kit.tick(Observation(t=float(t), wall=0.0, log_skipped=totals), idle))
    assert _skipped(sink) == {"dropped": 2.0, "lag": 7.0, "budget": 0.0}  # totals, not sums


def test_the_metrics_hook_exports_the_previous_loop_and_its_lag() -> None:
    sink, kit = MetricsSink(SIGS.ids, version="test"), TickKit()
    tick = kit.tick(Observation(t=1.0, wall=0.0), Verdict(state="idle"), last_loop_s=0.2, lag_s=3.0)
    MetricsHook(sink).on_tick(tick)
    values = {s.name: s.value for f in sink.collect() for s in f.samples}
    assert values["hang_watchdog_loop_duration_seconds_count"] == 1.0
    assert values["hang_watchdog_loop_lag_seconds"] == 3.0


class _Notes:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def ready(self, status: str = "") -> None:
        self.sent.append(f"READY {status}")

    def status(self, text: str) -> None:
        self.sent.append(f"STATUS {text}")

    def watchdog(self) -> None:
        self.sent.append("WATCHDOG")


def test_the_notify_hook_says_ready_once_then_state_changes_and_pings_every_loop() -> None:
    notes, kit = _Notes(), TickKit()
    hook = NotifyHook(notes)
    hung = Verdict(state="hung", signature="gpu_kernel_spin")
    for t, verdict in enumerate((Verdict(state="idle"), Verdict(state="idle"), hung)):
        hook.on_tick(kit.tick(Observation(t=float(t), wall=0.0), verdict))
    assert notes.sent == ["READY idle", "WATCHDOG", "WATCHDOG",
                          "STATUS hung: gpu_kernel_spin", "WATCHDOG"]  # fmt: skip


class _Completions(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # /v1/models
        self._answer({"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:  # /v1/completions
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer({"choices": [{"text": "ok"}]})

    def _answer(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def api() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_the_canary_answers_in_its_own_observation_field(api: str) -> None:
    """Sent only after the last verdict was idle; its answer is a typed CanaryResult."""
    events: list[str] = []
    canary = CanarySource(
        api, idle_s=0.0, timeout_s=5.0, event=lambda kind, msg, **f: events.append(kind)
    )
    assert canary.poll(SourceTick(last_state="serving")) is None and canary.last_sent is None
    deadline = time.monotonic() + 10
    answer = None
    while answer is None and time.monotonic() < deadline:
        answer = canary.poll(SourceTick(last_state="idle"))
        time.sleep(0.05)
    assert answer is not None and not answer.timed_out and answer.result == "ok", answer
    assert canary.results == ["ok"] and events == []  # an answer is quiet


def test_the_canary_is_a_source_and_remediation_a_hook(tmp_path: Path) -> None:
    from watchdog.daemon.wiring import build

    cfg = build_config({"pid": 1, "gpu_source": "none", "metrics_addr": "off", "stacks": False,
                        "cdn_default": False, "canary": True, "server_url": "http://127.0.0.1:9",
                        "dry_run": True, "restarter": "command", "restart_command": ["true"],
                        "state_dir": str(tmp_path / "st")})  # fmt: skip
    built = build(cfg)
    try:
        names = [type(h).__name__ for h in built.daemon.hooks]
        canary = built.daemon.source("canary")
    finally:
        built.close()
    assert isinstance(canary, CanarySource) and canary.part == "canary"
    assert names == ["MetricsHook", "EpisodeHook", "RemediationHook"], names


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_remediation_imports_neither_daemon_nor_outputs() -> None:
    bad = {
        f"{path.name}: {name}"
        for path in sorted((ROOT / "watchdog" / "remediation").glob("*.py"))
        for name in _imports(path)
        if name.startswith(("watchdog.daemon", "watchdog.outputs"))
    }
    assert not bad, sorted(bad)


def test_log_skips_reach_the_metric_through_the_observation(tmp_path: Path) -> None:
    """The log source only counts; the loop puts its totals in each Observation and the
    metrics hook exports the increases."""
    from watchdog.daemon.wiring import build

    log = tmp_path / "vllm.log"
    log.write_text("")
    cfg = build_config({"log_files": [str(log)], "gpu_source": "none", "metrics_addr": "off",
                        "stacks": False, "cdn_default": False})  # fmt: skip
    built = build(cfg)
    try:
        built.daemon.tick()
        built.daemon.source("logs").skipped["lag"] += 3  # as FileFollower's lag folds in
        obs = built.daemon.observe()
        built.daemon.tick()
    finally:
        built.close()
    assert obs.log_skipped == {"lag": 3}
    assert _skipped(built.metrics) == {"dropped": 0.0, "lag": 3.0, "budget": 0.0}
