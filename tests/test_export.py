"""Exporter tests: a real MetricsServer on 127.0.0.1, scraped with httpx and parsed back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from watchdog.core.model import STATES, Connection, GpuSample, Observation, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.metrics_http import MetricsServer, parse_addr
from watchdog.outputs.metrics_table import METRICS, STACK_RESULTS

SIGNATURES = (
    "cubin_download_stall",
    "trtllm_attention_deadlock",
    "gpu_kernel_spin",
    "collective_hang",
    "engine_dead",
    "jit_toolchain_missing",
    "nvls_multicast_failure",
)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _obs(gpus: tuple[GpuSample, ...] = (), hosts: tuple[str, ...] = ()) -> Observation:
    conns = tuple(Connection(1, h, "127.0.0.1", 443, "ESTABLISHED", 1.0) for h in hosts)
    return Observation(
        t=1.0, wall=2.0, gpus=gpus, conns=conns, sources={"gpu": True, "logs": False}
    )


def _hung(signature: str = "cubin_download_stall", confidence: float = 0.9) -> Verdict:
    return Verdict(
        state="hung",
        signature=signature,
        confidence=confidence,
        seconds_since_progress=42.0,
        progress_ratio=0.25,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink(clock: FakeClock) -> MetricsSink:
    return MetricsSink(SIGNATURES, version="9.9.9", clock=clock, wall=lambda: 1.7e9)


@pytest.fixture
def url(sink: MetricsSink) -> Iterator[str]:
    server = MetricsServer(sink, "127.0.0.1:0")
    host, port = server.start()
    yield f"http://{host}:{port}"
    server.stop()


def scrape(url: str) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """name -> (type, {sorted label items: value}) from a real HTTP scrape."""
    resp = httpx.get(f"{url}/metrics", timeout=10)
    assert resp.status_code == 200
    out: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    for fam in text_string_to_metric_families(resp.text):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        samples = {
            tuple(sorted(s.labels.items())): s.value
            for s in fam.samples
            if fam.type != "histogram" or s.name.endswith("_count")
        }
        out[name] = (fam.type, samples)
    return out


def test_every_table_metric_is_exposed_with_its_type_and_labels(sink: MetricsSink, url: str):
    gpu = GpuSample(0, "GPU-abc", sm=0.99, dram=0.01, power_w=700.0)
    sink.observe(_obs((gpu,), ("flashinfer.ai",)), _hung(), 0.2)
    sink.incident("cubin_download_stall")
    sink.stack_capture("ok")
    sink.remediation("disable_trtllm_attention", "planned")
    sink.set_fallback_active("disable_trtllm_attention", True)
    got = scrape(url)
    assert sorted(got) == sorted(m.name for m in METRICS)
    for spec in METRICS:
        mtype, samples = got[spec.name]
        assert mtype == spec.type, spec.name
        for labels in samples:
            assert tuple(k for k, _ in labels if k != "le") == tuple(sorted(spec.labels)), spec.name
            assert "pid" not in dict(labels)


def test_values_follow_the_observation_and_verdict(sink: MetricsSink, url: str):
    gpu = GpuSample(1, "GPU-x", sm=0.98, dram=0.02, power_w=512.5)
    sink.observe(_obs((gpu,), ("cdn.example", "cdn.example", "other")), _hung(), 0.3, 2.5)
    got = scrape(url)
    key = (("gpu", "1"), ("uuid", "GPU-x"))
    assert got["hang_watchdog_gpu_sm_utilization_ratio"][1] == {key: 0.98}
    assert got["hang_watchdog_gpu_dram_bandwidth_utilization_ratio"][1] == {key: 0.02}
    assert got["hang_watchdog_gpu_power_watts"][1] == {key: 512.5}
    states = got["hang_watchdog_state"][1]
    assert {k[0][1]: v for k, v in states.items()} == {s: float(s == "hung") for s in STATES}
    hang = {k[0][1]: v for k, v in got["hang_watchdog_hang"][1].items()}
    assert hang == {s: float(s == "cubin_download_stall") for s in SIGNATURES}
    conf = got["hang_watchdog_hang_confidence_ratio"][1]
    assert conf[(("signature", "cubin_download_stall"),)] == 0.9
    assert conf[(("signature", "engine_dead"),)] == 0.0
    assert got["hang_watchdog_seconds_since_progress"][1] == {(): 42.0}
    assert got["hang_watchdog_progress_ratio"][1] == {(): 0.25}
    cdn = got["hang_watchdog_cdn_connections"][1]
    assert cdn == {(("host", "cdn.example"),): 2.0, (("host", "other"),): 1.0}
    assert got["hang_watchdog_source_up"][1] == {
        (("source", "gpu"),): 1.0,
        (("source", "logs"),): 0.0,
    }
    assert got["hang_watchdog_last_loop_timestamp_seconds"][1] == {(): 1.7e9}
    assert got["hang_watchdog_loop_lag_seconds"][1] == {(): 2.5}
    assert got["hang_watchdog_build_info"][1] == {(("version", "9.9.9"),): 1.0}
    assert got["hang_watchdog_loop_duration_seconds"][1] == {(): 1.0}


def test_the_server_source_is_also_exported_under_its_old_name(sink: MetricsSink, url: str):
    """`source="server"` is the name; `source="vllm"` (its name before) follows it for a release."""
    for up in (True, False):
        obs = Observation(t=1.0, wall=2.0, sources={"gpu": True, "server": up})
        sink.observe(obs, _hung(), 0.1)
        assert scrape(url)["hang_watchdog_source_up"][1] == {
            (("source", "gpu"),): 1.0,
            (("source", "server"),): float(up),
            (("source", "vllm"),): float(up),
        }


def test_signatures_preset_to_zero_before_any_loop(url: str):
    got = scrape(url)
    assert {k[0][1]: v for k, v in got["hang_watchdog_hang"][1].items()} == dict.fromkeys(
        SIGNATURES, 0.0
    )
    incidents = got["hang_watchdog_incidents_total"][1]
    assert {k[0][1]: v for k, v in incidents.items()} == dict.fromkeys(SIGNATURES, 0.0)
    captures = got["hang_watchdog_stack_captures_total"][1]
    assert {k[0][1] for k in captures} == set(STACK_RESULTS)
    assert got["hang_watchdog_remediation_exhausted"][1] == {(): 0.0}


def test_vanished_gpu_and_host_leave_no_stale_series(sink: MetricsSink, url: str):
    two = (GpuSample(0, "A", sm=0.5, dram=0.5, power_w=1.0), GpuSample(1, "B", sm=0.5))
    sink.observe(_obs(two, ("cdn.example",)), Verdict(state="serving"), 0.1)
    assert len(scrape(url)["hang_watchdog_gpu_sm_utilization_ratio"][1]) == 2
    sink.observe(_obs(two[:1]), Verdict(state="serving"), 0.1)
    got = scrape(url)
    assert list(got["hang_watchdog_gpu_sm_utilization_ratio"][1]) == [(("gpu", "0"), ("uuid", "A"))]
    assert got["hang_watchdog_cdn_connections"][1] == {}
    assert got["hang_watchdog_hang"][1][(("signature", "cubin_download_stall"),)] == 0.0


def test_unreadable_gpu_field_is_absent_not_zero(sink: MetricsSink, url: str):
    sink.observe(_obs((GpuSample(0, "A", sm=0.7, dram=None),)), Verdict(state="idle"), 0.1)
    got = scrape(url)
    assert len(got["hang_watchdog_gpu_sm_utilization_ratio"][1]) == 1
    assert got["hang_watchdog_gpu_dram_bandwidth_utilization_ratio"][1] == {}
    assert got["hang_watchdog_seconds_since_progress"][1] == {}


def test_hang_clears_when_the_verdict_changes(sink: MetricsSink, url: str):
    sink.observe(_obs(), _hung("gpu_kernel_spin", 0.8), 0.1)
    assert scrape(url)["hang_watchdog_hang"][1][(("signature", "gpu_kernel_spin"),)] == 1.0
    sink.observe(_obs(), Verdict(state="serving"), 0.1)
    got = scrape(url)
    assert set(got["hang_watchdog_hang"][1].values()) == {0.0}
    assert set(got["hang_watchdog_hang_confidence_ratio"][1].values()) == {0.0}
    assert got["hang_watchdog_state"][1][(("state", "serving"),)] == 1.0


def test_counters_and_remediation_state(sink: MetricsSink, url: str):
    sink.incident("engine_dead")
    sink.incident("engine_dead")
    sink.incident("stalled")  # an episode no signature named
    for result in ("ok", "timeout", "ok"):
        sink.stack_capture(result)
    sink.remediation("restart", "failed")
    sink.set_fallback_active("disable_nvls", True)
    sink.set_fallback_active("disable_trtllm_attention", False)
    sink.set_remediation_exhausted(True)
    got = scrape(url)
    incidents = got["hang_watchdog_incidents_total"][1]
    assert incidents[(("signature", "engine_dead"),)] == 2.0
    assert incidents[(("signature", "stalled"),)] == 1.0
    assert (("signature", "stalled"),) not in got["hang_watchdog_hang"][1]  # not a signature
    captures = got["hang_watchdog_stack_captures_total"][1]
    assert captures[(("result", "ok"),)] == 2.0
    assert captures[(("result", "timeout"),)] == 1.0
    rem = got["hang_watchdog_remediations_total"][1]
    assert rem[(("action", "restart"), ("outcome", "failed"))] == 1.0
    assert rem[(("action", "restart"), ("outcome", "recovered"))] == 0.0
    assert got["hang_watchdog_fallback_active"][1] == {
        (("fallback", "disable_nvls"),): 1.0,
        (("fallback", "disable_trtllm_attention"),): 0.0,
    }
    assert got["hang_watchdog_remediation_exhausted"][1] == {(): 1.0}


def test_loop_histogram_buckets_are_cumulative(sink: MetricsSink, url: str):
    for seconds in (0.04, 0.3, 7.0, 100.0):
        sink.observe(_obs(), Verdict(state="idle"), seconds)
    text = httpx.get(f"{url}/metrics", timeout=10).text
    fam = next(
        f
        for f in text_string_to_metric_families(text)
        if f.name == "hang_watchdog_loop_duration_seconds"
    )
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    assert buckets["0.05"] == 1.0
    assert buckets["0.5"] == 2.0
    assert buckets["10.0"] == 3.0
    assert buckets["+Inf"] == 4.0
    total = next(s.value for s in fam.samples if s.name.endswith("_sum"))
    assert total == pytest.approx(107.34)


def test_bad_labels_are_refused_with_the_allowed_values(sink: MetricsSink):
    with pytest.raises(ValueError, match="not one of"):
        sink.stack_capture("exploded")
    with pytest.raises(ValueError, match="not one of"):
        sink.remediation("restart", "maybe")
    with pytest.raises(ValueError, match="stale_after_s"):
        MetricsSink(SIGNATURES, version="1", stale_after_s=0)


def test_healthz_turns_503_when_the_loop_is_stuck(sink: MetricsSink, url: str, clock: FakeClock):
    sink.observe(_obs(), Verdict(state="serving"), 0.1)
    resp = httpx.get(f"{url}/healthz", timeout=10)
    assert (resp.status_code, resp.text.strip()) == (200, "ok")
    clock.now += 29.0
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    clock.now += 16.0  # the loop is stuck: no observe() for 45 s
    resp = httpx.get(f"{url}/healthz", timeout=10)
    assert resp.status_code == 503
    assert resp.text.strip() == "stale: last loop 45 s ago"
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
    sink.observe(_obs(), Verdict(state="serving"), 0.1)
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


def test_first_loop_gets_one_staleness_window(sink: MetricsSink, clock: FakeClock):
    assert sink.healthy()
    clock.now += 31.0
    assert not sink.healthy()


def test_unknown_path_is_404(url: str):
    assert httpx.get(f"{url}/nope", timeout=10).status_code == 404


def test_openmetrics_is_served_when_asked(sink: MetricsSink, url: str):
    accept = "application/openmetrics-text; version=1.0.0"
    resp = httpx.get(f"{url}/metrics", headers={"Accept": accept}, timeout=10)
    assert resp.headers["content-type"].startswith("application/openmetrics-text")
    assert resp.text.rstrip().endswith("# EOF")
    assert 'hang_watchdog_hang{signature="engine_dead"} 0.0' in resp.text


def test_nothing_registered_in_the_default_registry():
    from prometheus_client import REGISTRY

    MetricsSink(SIGNATURES, version="1")
    names = {m.name for m in REGISTRY.collect()}
    assert not any(n.startswith("hang_watchdog_") for n in names)


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        ("127.0.0.1:9433", ("127.0.0.1", 9433)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9433", ("::1", 9433)),
        ("localhost:80", ("localhost", 80)),
        ("off", None),
        ("OFF", None),
    ],
)
def test_parse_addr_accepts(addr: str, want: tuple[str, int] | None):
    assert parse_addr(addr) == want


@pytest.mark.parametrize(
    ("addr", "message"),
    [
        ("9433", "needs a host and a port"),
        (":9433", "needs a host and a port"),
        ("127.0.0.1:http", "port 'http' is not 0-65535"),
        ("127.0.0.1:70000", "port '70000' is not 0-65535"),
        ("::1:9433", "IPv6 host in brackets"),
        ("[::1]9433", "IPv6 needs"),
        ("[nothost]:1", "is not IPv6"),
    ],
)
def test_parse_addr_rejects_with_a_clear_message(addr: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_addr(addr)


def test_port_taken_is_a_clear_error_and_stop_is_idempotent(sink: MetricsSink):
    server = MetricsServer(sink, "127.0.0.1:0")
    _, port = server.start()
    try:
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1"):
            MetricsServer(sink, f"127.0.0.1:{port}").start()
    finally:
        server.stop()
    server.stop()  # twice is harmless
    with pytest.raises(ValueError, match="off"):
        MetricsServer(sink, "off")


def test_healthz_goes_503_when_the_real_loop_is_stuck(tmp_path) -> None:
    """build() wires metrics_stale_s through; a hook stuck in the loop turns /healthz 503."""

    from watchdog.config import Config
    from watchdog.daemon.wiring import build

    log = tmp_path / "server.log"
    log.write_text("")
    cfg = Config(
        gpu_source="none",
        log_files=[str(log)],
        metrics_addr="127.0.0.1:0",
        metrics_stale_s=2.0,
        tick_s=0.1,
        stacks=False,
        cdn_default=False,
    )
    built = build(cfg)
    hold, stop = threading.Event(), threading.Event()

    class Stuck:
        def on_tick(self, tick) -> None:
            while hold.is_set() and not stop.is_set():
                time.sleep(0.05)

    built.daemon.hooks.append(Stuck())
    host, port = built.server.start()
    loop = threading.Thread(target=built.daemon.run, args=(stop,), daemon=True)
    loop.start()
    url = f"http://{host}:{port}/healthz"
    try:
        deadline = time.monotonic() + 10
        while httpx.get(url, timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "never healthy"
            time.sleep(0.1)
        hold.set()
        deadline = time.monotonic() + 10
        while (resp := httpx.get(url, timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, "a stuck loop never turned /healthz 503"
            time.sleep(0.1)
        assert resp.text.startswith("stale: last loop")
        hold.clear()
        deadline = time.monotonic() + 10
        while httpx.get(url, timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "did not recover once the loop moved again"
            time.sleep(0.1)
    finally:
        stop.set()
        loop.join(timeout=10)
        built.server.stop()
        built.daemon.close()
