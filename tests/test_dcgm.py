"""dcgm-exporter text parsing, and DcgmSource against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from watchdog.sources.gpu.dcgm import DcgmSource, parse_dcgm
from watchdog.sources.gpu.source import make_gpu_source

DATA = Path(__file__).parent / "data"


def data(name: str) -> str:
    return (DATA / name).read_text()


class Exporter:
    """A loopback HTTP server whose answer the test sets: text, a status, or no answer."""

    def __init__(self) -> None:
        self.body = data("dcgm_prof.txt")
        self.status = 200
        self.hang = False
        self.unblock = threading.Event()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if exporter.hang:
                    exporter.unblock.wait(60.0)
                    return
                payload = exporter.body.encode()
                self.send_response(exporter.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.unblock.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def test_parse_prof_fields_are_ratios() -> None:
    gpus = parse_dcgm(data("dcgm_prof.txt"))
    assert [g.index for g in gpus] == [0, 1]
    g0 = gpus[0]
    assert (g0.method, g0.sm, g0.dram) == ("dcgm_prof", 0.991234, 0.000412)
    assert (g0.uuid, g0.name) == ("GPU-9a8b7c6d-0000-4000-8000-000000000000", "NVIDIA GB300")
    assert (g0.power_w, g0.sm_clock_mhz) == (655.123, 1965.0)
    assert g0.procs is None and g0.cc is None  # dcgm-exporter does not say


def test_parse_dev_fields_are_percent() -> None:
    g0, g1 = parse_dcgm(data("dcgm_dev.txt"))
    assert (g0.method, g0.sm, g0.dram) == ("dcgm_dev", 1.0, 0.0)
    assert g1.dram == pytest.approx(0.03) and g1.sm == 0.0
    assert g0.name == "NVIDIA H100 80GB HBM3" and g1.power_w == 71.5


def test_parse_dcp_profile_mixes_dev_sm_with_prof_dram_and_blanks() -> None:
    g0, g1 = parse_dcgm(data("dcgm_dcp_profile.txt"))
    assert (g0.method, g0.sm, g0.dram) == ("dcgm_dev", 0.99, 0.0021)
    assert g1.sm is None  # DCGM blank sentinel, not 9.2e18 %
    assert g0.power_w is None  # not in that profile


def test_parse_mig_prefers_the_whole_gpu_series() -> None:
    text = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 0.1\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a"} 0.8\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",GPU_I_PROFILE="1g.10gb",GPU_I_ID="8"} 0.2\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="x",UUID="GPU-b"} 0.5\n'
    )
    (g0,) = parse_dcgm(text)
    assert g0.sm == 0.8 and g0.dram is None


def test_parse_ignores_other_metrics_and_rejects_garbage() -> None:
    assert parse_dcgm("go_goroutines 42\n") == []
    with pytest.raises(ValueError):
        parse_dcgm("this is { not prometheus text\n")


def test_source_scrapes_and_recovers_after_http_500(exporter: Exporter) -> None:
    source = DcgmSource(exporter.url)
    try:
        assert [g.sm for g in source.poll()] == [0.991234, 0.874]
        assert source.health.up
        exporter.status = 500
        assert source.poll() == ()
        assert source.health.last_error == f"dcgm-exporter at {exporter.url} answered HTTP 500"
        exporter.status = 200
        exporter.body = data("dcgm_dev.txt")
        assert source.poll()[0].method == "dcgm_dev" and source.health.up
    finally:
        source.close()


def test_source_down_on_page_without_gpu_metrics(exporter: Exporter) -> None:
    exporter.body = "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 7\n"
    with httpx.Client() as client:
        source = DcgmSource(exporter.url, client=client)
        assert source.poll() == ()
    assert "no DCGM GPU metrics" in (source.health.last_error or "")


def test_source_down_on_unparsable_page(exporter: Exporter) -> None:
    exporter.body = "DCGM_FI_DEV_GPU_UTIL{gpu= oops\n"
    source = DcgmSource(exporter.url)
    assert source.poll() == ()
    source.close()
    assert "unparsable" in (source.health.last_error or "")


def test_source_times_out_promptly_when_exporter_never_answers(exporter: Exporter) -> None:
    exporter.hang = True
    source = DcgmSource(exporter.url, timeout_s=0.5)
    started = time.monotonic()
    assert source.poll() == ()
    elapsed = time.monotonic() - started
    source.close()
    assert "did not answer: timed out" in (source.health.last_error or "")
    assert elapsed < 15.0  # bounded by the timeout, not by the stuck server


def test_source_down_when_nothing_listens() -> None:
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()  # the port is now closed: connection refused
    source = DcgmSource(f"http://127.0.0.1:{port}/metrics")
    assert source.poll() == ()
    source.close()
    assert "did not answer" in (source.health.last_error or "") and not source.health.up


def test_make_gpu_source_uses_the_given_client(exporter: Exporter) -> None:
    with httpx.Client() as client:
        source = make_gpu_source(f"dcgm:{exporter.url}", http_client=client)
        assert len(source.poll()) == 2
        source.close()
        assert not client.is_closed  # a client we were given is not ours to close
