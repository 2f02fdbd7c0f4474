"""The daemon's own exposition (outputs/exposition.py) against prometheus_client as the oracle:
the same families give the same bytes as its generate_latest (text 0.0.4 and OpenMetrics), its
parsers read them back, and its choose_encoder picks the same format for an Accept header."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
from prometheus_client import exposition as pc_exposition
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from watchdog.core.model import Connection, GpuSample, Observation, ProcInfo, ProcSnapshot, Verdict
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.exposition import (
    Family,
    go_float,
    render_openmetrics,
    render_text,
    wants_openmetrics,
)
from watchdog.outputs.fleet import FleetLabels
from watchdog.outputs.metrics_table import METRICS


class Oracle:
    """Our families rebuilt as prometheus_client's, for its generate_latest."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for fam in self.families:
            out: Metric
            if fam.type == "counter":
                out = CounterMetricFamily(fam.name, fam.help, labels=list(fam.labels))
            elif fam.type == "histogram":
                out = HistogramMetricFamily(fam.name, fam.help, labels=list(fam.labels))
            else:
                out = GaugeMetricFamily(fam.name, fam.help, labels=list(fam.labels))
            for s in fam.samples:
                out.add_sample(s.name, s.labels, s.value)
            yield out


def _busy_sink() -> MetricsSink:
    """A sink with every kind of series set, label values that need escaping included."""
    sink = MetricsSink(
        ("cubin_download_stall", "gpu_kernel_spin"),
        version='1.0"\\x\ny',
        wall=lambda: 1.7e9,
        fleet=FleetLabels("prod", "node-1"),
    )
    gpus = (GpuSample(0, "GPU-a", sm=0.99, dram=1e-7, power_w=123456789.0),)
    conns = (Connection(1, 'cdn "x"', "127.0.0.1", 443, "ESTABLISHED", 1.0),)
    procs = ProcSnapshot(
        target_pid=10,
        alive=True,
        procs=(ProcInfo(10, 1, "python", "VLLM::Worker_TP1", role="worker", rank=1),),
        engine="vllm",
    )
    obs = Observation(
        t=1.0, wall=2.0, gpus=gpus, conns=conns, procs=procs, sources={"gpu": True, "server": False}
    )
    verdict = Verdict(
        state="hung", signature="gpu_kernel_spin", confidence=0.85, seconds_since_progress=1e21
    )
    for seconds in (0.01, 0.3, 1e9):
        sink.observe(obs, verdict, seconds, 0.25)
    sink.incident("gpu_kernel_spin")
    sink.stack_capture("timeout")
    sink.log_lines_skipped("lag", 12)
    sink.remediation("restart", "recovered")
    sink.set_fallback_active("disable_nvls", True)
    sink.set_plan({"signature": "s", "args": ["--x", "a\\b"], "env": {"A": "1"}}, dry_run=True)
    sink.set_restarts(1.6e9, 2)
    return sink


def test_text_format_is_byte_for_byte_prometheus_clients() -> None:
    families = _busy_sink().collect()
    assert render_text(families) == pc_exposition.generate_latest(Oracle(families))  # type: ignore[arg-type]


def test_openmetrics_is_byte_for_byte_prometheus_clients() -> None:
    families = _busy_sink().collect()
    want = om_exposition.generate_latest(Oracle(families))
    assert render_openmetrics(families) == want


def test_every_table_metric_parses_back_with_its_type_help_and_values() -> None:
    families = _busy_sink().collect()
    text = render_text(families).decode()
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    om = {f.name: f for f in om_families(render_openmetrics(families).decode())}
    for spec in METRICS:
        base = spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
        for got in (parsed[base], om[base]):
            assert (got.type, got.documentation) == (spec.type, spec.help), spec.name
    spin = [s for s in parsed["hang_watchdog_hang"].samples if s.value == 1.0]
    assert [s.labels for s in spin] == [{"signature": "gpu_kernel_spin"}]
    info = parsed["hang_watchdog_build_info"].samples[0]
    assert info.labels == {"version": '1.0"\\x\ny'}
    assert parsed["hang_watchdog_seconds_since_progress"].samples[0].value == 1e21
    loop = {s.name: s.value for s in parsed["hang_watchdog_loop_duration_seconds"].samples}
    assert loop["hang_watchdog_loop_duration_seconds_count"] == 3.0


@pytest.mark.parametrize(
    "value", [0.0, -0.0, 1.0, -2.5, 1e-7, 0.1, 123456.0, 1234567.0, 1.7e9, 1e21, -1e21, 42]
)
def test_go_float_is_floatToGoString(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


def test_go_float_special_values_and_random_ones() -> None:
    assert [go_float(v) for v in (math.inf, -math.inf, math.nan)] == ["+Inf", "-Inf", "NaN"]
    rng = random.Random(7)
    for _ in range(2000):
        v = rng.choice((rng.uniform(-1e12, 1e12), rng.random(), float(rng.randrange(10**9))))
        assert go_float(v) == floatToGoString(v), v


@pytest.mark.parametrize(
    "accept",
    [
        "",
        "*/*",
        "text/plain",
        "text/plain;version=0.0.4",
        "application/openmetrics-text",
        "application/openmetrics-text; version=1.0.0",
        "application/openmetrics-text;version=0.0.1",
        "application/openmetrics-text;version=0.0.1,text/plain;version=0.0.4;q=0.5",
        # Prometheus 3's scrape header (scrape/scrape.go, scrapeAcceptHeader)
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
        "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
        "application/json, application/openmetrics-text",
    ],
)
def test_format_choice_follows_choose_encoder(accept: str) -> None:
    _, content_type = pc_exposition.choose_encoder(accept)
    assert wants_openmetrics(accept) == content_type.startswith("application/openmetrics-text")


def test_a_family_refuses_the_wrong_number_of_label_values() -> None:
    fam = Family.of("hang_watchdog_x_total", "counter", "x", ("a", "b"))
    assert fam.name == "hang_watchdog_x"
    with pytest.raises(ValueError, match="label values"):
        fam.add(("only-one",), 1.0)
