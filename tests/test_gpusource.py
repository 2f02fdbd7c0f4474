"""GpuSource: deadline per poll, lost-GPU placeholders, init retry; make_gpu_source parsing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from watchdog.core.model import GpuSample
from watchdog.sources.gpu.backend import FabricInfo, GpuError
from watchdog.sources.gpu.dcgm import DcgmSource
from watchdog.sources.gpu.fake import FakeGpuBackend
from watchdog.sources.gpu.file import GpuFileSource
from watchdog.sources.gpu.source import GpuSource, NullGpuSource, make_gpu_source

WAIT_S = 20.0  # generous: the machine may be loaded


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_for(cond: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def spin(index: int) -> list[GpuSample]:
    return [GpuSample(index=index, sm=0.99, dram=0.0, procs=1, pids=(77,), method="fake")]


@pytest.fixture
def fake() -> FakeGpuBackend:
    return FakeGpuBackend({0: spin(0), 1: spin(1)})


def test_poll_returns_every_gpu(fake: FakeGpuBackend) -> None:
    source = GpuSource(fake)
    got = source.poll()
    source.close()
    assert [s.index for s in got] == [0, 1] and got[0].sm == 0.99
    assert source.health.up and "shutdown" in fake.calls


def test_hung_call_marks_down_within_deadline_then_recovers(
    fake: FakeGpuBackend, caplog: pytest.LogCaptureFixture
) -> None:
    source = GpuSource(fake, deadline_s=0.3)
    assert source.poll()
    fake.hang_next("sample", 600.0)
    with caplog.at_level(logging.WARNING):
        assert source.poll() == ()
        assert not source.health.up
        assert source.health.last_error == (
            "NVML call did not return within 0.3 s; GPU source down"
        )
        calls_while_stuck = len(fake.calls)
        for _ in range(5):  # still stuck: answer () at once, call nothing new
            assert source.poll() == ()
        assert len(fake.calls) == calls_while_stuck and not source.health.up
    stuck_logs = [r for r in caplog.records if "did not return" in r.getMessage()]
    assert len(stuck_logs) == 1  # logged once, not once per poll
    fake.release()
    assert wait_for(lambda: bool(source.poll()))
    assert source.health.up
    source.close()


def test_polls_while_stuck_do_not_wait_for_the_deadline_again(fake: FakeGpuBackend) -> None:
    source = GpuSource(fake, deadline_s=1.0)
    fake.hang_next("sample", 600.0)
    assert source.poll() == ()  # this one waits out the deadline
    started = time.monotonic()
    for _ in range(3):
        assert source.poll() == ()
    # Each would take the full 1 s deadline if it queued a call behind the stuck one.
    assert time.monotonic() - started < 1.0
    fake.release()
    source.close()


def test_lost_gpu_is_a_placeholder_and_others_still_report(fake: FakeGpuBackend) -> None:
    fake.lost.add(1)
    source = GpuSource(fake)
    got = source.poll()
    assert source.health.up
    assert got[0] == spin(0)[0]
    assert got[1] == GpuSample(index=1)
    fake.lost.clear()
    assert source.poll()[1].sm == 0.99
    source.close()


def test_init_failure_is_down_and_retried_rarely(fake: FakeGpuBackend) -> None:
    clock = FakeClock()
    fake.fail_next("init", GpuError("NVML not available (test)"))
    source = GpuSource(fake, clock=clock, init_retry_s=60.0)
    assert source.poll() == ()
    assert source.health.last_error == "NVML not available (test)"
    clock.now += 59.0
    assert source.poll() == ()
    assert fake.calls.count("init") == 1  # not retried before init_retry_s
    clock.now += 2.0
    assert len(source.poll()) == 2
    assert fake.calls.count("init") == 2 and source.health.up
    source.close()


def test_hung_init_recovers_when_it_returns(fake: FakeGpuBackend) -> None:
    fake.hang_next("init", 600.0)
    source = GpuSource(fake, deadline_s=0.2)
    assert source.poll() == ()
    assert "did not return" in (source.health.last_error or "")
    fake.release()
    assert wait_for(lambda: bool(source.poll()))
    assert fake.calls.count("init") == 1  # the late init counted; no second one
    source.close()


def test_device_count_failure_is_down_then_recovers(fake: FakeGpuBackend) -> None:
    source = GpuSource(fake)
    fake.fail_next("device_count", GpuError("NVML could not count GPUs: Unknown Error"))
    assert source.poll() == ()
    assert source.health.last_error == "NVML could not count GPUs: Unknown Error"
    assert len(source.poll()) == 2 and source.health.up
    source.close()


def test_close_does_not_wait_for_a_stuck_call(fake: FakeGpuBackend) -> None:
    source = GpuSource(fake, deadline_s=0.2)
    source.poll()
    fake.hang_next("sample", 600.0)
    source.poll()
    source.close()  # would block for 600 s if it waited
    assert "shutdown" not in fake.calls
    fake.release()


def test_driver_version_and_fabric_pass_through() -> None:
    info = FabricInfo(state=3, status=0, health_summary=1, health_mask=0)
    fake = FakeGpuBackend(1, driver="580.65.06", fabric={0: info})
    source = GpuSource(fake)
    assert source.driver_version() == "580.65.06"
    assert source.fabric(0) == info and source.fabric(1) is None
    fake.fail_next("fabric", GpuError("GPU 0 unreachable"))
    assert source.fabric(0) is None and not source.health.up
    source.close()


def test_fake_script_advances_and_repeats_last() -> None:
    fake = FakeGpuBackend(
        {
            0: [GpuSample(index=0, sm=0.1), GpuSample(index=0, sm=0.9)],
            1: lambda n: GpuSample(1, sm=n / 10),
        }
    )
    got = [(fake.sample(0).sm, fake.sample(1).sm) for _ in range(3)]
    assert got == [(0.1, 0.0), (0.9, 0.1), (0.9, 0.2)]
    with pytest.raises(GpuError, match="does not exist"):
        fake.sample(5)


@pytest.mark.parametrize(
    ("spec", "cls"),
    [
        ("nvml", GpuSource),
        ("none", NullGpuSource),
        ("dcgm:http://127.0.0.1:9400/metrics", DcgmSource),
        ("file:/tmp/gpu.jsonl", GpuFileSource),
    ],
)
def test_make_gpu_source_accepts_the_documented_forms(spec: str, cls: type) -> None:
    source = make_gpu_source(spec)
    assert isinstance(source, cls) and source.name == "gpu"
    source.close()


def test_none_source_is_down_and_empty() -> None:
    source = make_gpu_source("none")
    assert source.poll() == () and not source.health.up
    assert "disabled" in (source.health.last_error or "")


def test_dcgm_spec_keeps_the_url() -> None:
    source = make_gpu_source("dcgm:http://127.0.0.1:9400/metrics")
    assert isinstance(source, DcgmSource) and source.url == "http://127.0.0.1:9400/metrics"


@pytest.mark.parametrize("spec", ["nvidia", "", "dcgm:", "dcgm:127.0.0.1:9400", "file:", "nvml:x"])
def test_make_gpu_source_rejects_anything_else(spec: str) -> None:
    with pytest.raises(ValueError, match=r"nvml, dcgm:URL .* file:PATH .* none"):
        make_gpu_source(spec)


def test_the_daemon_runs_an_nvml_poll_on_the_sources_own_worker_only() -> None:
    """The loop polls the GPU source inline: its backend calls run on one thread, the worker
    the source owns, and a hung call still costs the loop one deadline."""
    import threading

    from watchdog.config import Config
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.daemon.loop import Daemon

    threads: set[str] = set()
    backend = FakeGpuBackend(
        {0: lambda n: threads.add(threading.current_thread().name) or spin(0)[0]}
    )
    source = GpuSource(backend, deadline_s=0.3)
    cfg = Config(tick_s=0.1, metrics_addr="off", stacks=False, cdn_default=False)
    daemon = Daemon(cfg, load_signatures(), [source])
    try:
        assert [g.index for g in daemon.observe().gpus] == [0]
        assert threads == {"gpu-backend"}
        assert not [t for t in threading.enumerate() if t.name == "gpu-poll"]
        assert daemon.worst_tick_s() == pytest.approx(0.1 + 2 * 0.3)  # an init, then a read
        backend.hang_next("sample", 600.0)
        t0 = time.monotonic()
        obs = daemon.observe()
        assert time.monotonic() - t0 < 0.3 + 1.0
        assert obs.gpus == () and obs.sources == {"gpu": False}
    finally:
        backend.release()
        daemon.close()
