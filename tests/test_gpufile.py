"""GpuFileSource follows a JSON Lines file like tail -F: append, rotate, truncate, late, stale."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from watchdog.sources.gpu.file import BadLine, GpuFileSource, parse_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def line(**fields: Any) -> str:
    base: dict[str, Any] = {"gpu": 0, "sm": 0.5, "dram": 0.25}
    base.update(fields)
    return json.dumps(base) + "\n"


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "gpu.jsonl"


def test_appended_lines_give_the_latest_sample_per_gpu(path: Path, clock: FakeClock) -> None:
    full = line(
        gpu=0, sm=0.99, dram=0.0, ts=clock.now, power_w=650.0, procs=1, pids=[1234],
        uuid="GPU-abc", name="NVIDIA GB300", cc="10.3", sm_clock_mhz=1980,
    )  # fmt: skip
    path.write_text(line(gpu=0, sm=0.1) + full)
    source = GpuFileSource(path, clock=clock)
    (g0,) = source.poll()
    assert (g0.sm, g0.dram, g0.power_w, g0.procs, g0.pids) == (0.99, 0.0, 650.0, 1, (1234,))
    assert (g0.uuid, g0.name, g0.cc, g0.sm_clock_mhz, g0.method) == (
        "GPU-abc", "NVIDIA GB300", "10.3", 1980, "file",
    )  # fmt: skip
    append(path, line(gpu=1, sm=0.2) + line(gpu=0, sm=0.3))
    got = source.poll()
    assert [(g.index, g.sm) for g in got] == [(0, 0.3), (1, 0.2)]
    assert source.health.up
    source.close()


def test_partial_last_line_waits_for_its_newline(path: Path, clock: FakeClock) -> None:
    path.write_text(line(sm=0.1))
    source = GpuFileSource(path, clock=clock)
    assert source.poll()[0].sm == 0.1
    whole = line(sm=0.7)
    append(path, whole[:10])
    assert source.poll()[0].sm == 0.1 and source.bad_lines == 0
    append(path, whole[10:])
    assert source.poll()[0].sm == 0.7
    source.close()


def test_late_file_is_picked_up(path: Path, clock: FakeClock) -> None:
    source = GpuFileSource(path, clock=clock)
    assert source.poll() == ()
    assert source.health.last_error == f"GPU sample file {path} does not exist (yet)"
    path.write_text("")
    assert source.poll() == ()
    assert source.health.last_error == f"no GPU samples in {path} yet"
    append(path, line(sm=0.4))
    assert source.poll()[0].sm == 0.4
    source.close()


def test_rotation_by_rename_drains_old_then_follows_new(path: Path, clock: FakeClock) -> None:
    path.write_text(line(gpu=0, sm=0.1))
    source = GpuFileSource(path, clock=clock)
    source.poll()
    append(path, line(gpu=1, sm=0.6))  # written just before the rotation
    os.rename(path, path.with_suffix(".1"))
    assert {g.index: g.sm for g in source.poll()} == {0: 0.1, 1: 0.6}
    new = path.with_suffix(".new")
    new.write_text(line(gpu=0, sm=0.9))
    os.rename(new, path)  # replaced by rename (a new inode)
    assert {g.index: g.sm for g in source.poll()} == {0: 0.9, 1: 0.6}
    append(path, line(gpu=0, sm=0.8))
    assert source.poll()[0].sm == 0.8
    source.close()


def test_truncation_restarts_from_the_top(path: Path, clock: FakeClock) -> None:
    path.write_text(line(sm=0.1) + line(sm=0.2) + line(sm=0.3))
    source = GpuFileSource(path, clock=clock)
    assert source.poll()[0].sm == 0.3
    path.write_text(line(sm=0.9))  # truncate and rewrite, shorter than before
    assert source.poll()[0].sm == 0.9
    source.close()


def test_stale_by_ts_marks_down(path: Path, clock: FakeClock) -> None:
    path.write_text(line(ts=clock.now - 12.0))
    source = GpuFileSource(path, clock=clock, stale_after_s=10.0)
    assert source.poll() == ()
    assert source.health.last_error == f"no GPU samples in {path} for 12 s"
    append(path, line(ts=clock.now))
    assert source.poll() and source.health.up
    source.close()


def test_stale_without_ts_counts_from_arrival(path: Path, clock: FakeClock) -> None:
    path.write_text(line())
    source = GpuFileSource(path, clock=clock, stale_after_s=10.0)
    assert source.poll()
    clock.now += 9.0
    assert source.poll()
    clock.now += 3.0
    assert source.poll() == ()
    assert source.health.last_error == f"no GPU samples in {path} for 12 s"
    append(path, line())
    assert source.poll()
    source.close()


def test_bad_lines_are_counted_and_never_break_it(
    path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    path.write_text(
        "{not json\n"
        + line(sm=99.0)  # percent, not a ratio: line 2
        + "[1, 2]\n"
        + json.dumps({"gpu": 0, "sm": 0.5}) + "\n"  # dram missing
        + "\n"  # blank lines are ignored, not bad
        + line(sm=0.6)
    )  # fmt: skip
    source = GpuFileSource(path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="hang_watchdog.sources.gpu.file"):
        got = source.poll()
    assert got[0].sm == 0.6 and source.health.up
    assert source.bad_lines == 4
    messages = [r.getMessage() for r in caplog.records]
    assert any("line 2 skipped" in m and "outside 0-1" in m for m in messages)
    assert any("line 1 skipped: not valid JSON" in m for m in messages)


def test_bad_line_warnings_are_capped(path: Path, clock: FakeClock, caplog: Any) -> None:
    path.write_text("nope\n" * 50 + line())
    source = GpuFileSource(path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="hang_watchdog.sources.gpu.file"):
        assert source.poll()
    assert source.bad_lines == 50
    assert len(caplog.records) == 11  # 10 lines named, then one "counted, not logged"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"gpu": -1, "sm": 0.1, "dram": 0.1}', '"gpu" must be a GPU index'),
        ('{"gpu": true, "sm": 0.1, "dram": 0.1}', '"gpu" must be a GPU index'),
        ('{"gpu": 0, "sm": "0.1", "dram": 0.1}', '"sm" is required'),
        ('{"gpu": 0, "sm": 0.1, "dram": -0.1}', '"dram" is -0.1, outside 0-1'),
        ('{"gpu": 0, "sm": 0.1, "dram": 0.1, "pids": [0]}', '"pids" must be a list'),
        ('{"gpu": 0, "sm": 0.1, "dram": 0.1, "power_w": "high"}', '"power_w" must be a number'),
        ('{"gpu": 0, "sm": 0.1, "dram": 0.1, "ts": "now"}', '"ts" must be Unix seconds'),
        ('{"gpu": 0, "sm": 0.1, "dram": 0.1, "cc": 10.3}', '"cc" must be a string'),
    ],
)
def test_parse_line_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(BadLine, match=why.replace("(", r"\(")):
        parse_line(text)


def test_parse_line_minimal_and_pids_imply_procs() -> None:
    sample, ts = parse_line('{"gpu": 3, "sm": 1, "dram": 0}')
    assert (sample.index, sample.sm, sample.dram, sample.procs, ts) == (3, 1.0, 0.0, None, None)
    sample, ts = parse_line('{"gpu": 0, "sm": 0.5, "dram": 0.5, "pids": [7, 9], "ts": 5}')
    assert (sample.procs, sample.pids, ts) == (2, (7, 9), 5.0)


def test_unreadable_path_is_down_with_the_os_error(tmp_path: Path, clock: FakeClock) -> None:
    source = GpuFileSource(tmp_path, clock=clock)  # a directory, not a file
    assert source.poll() == ()
    assert f"cannot read GPU samples from {tmp_path}" in (source.health.last_error or "")


def test_a_growing_staleness_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """'no samples for 12 s', '... 13 s', ... is one error, not one warning per tick."""
    from watchdog.sources.base import SourceHealth

    health = SourceHealth("gpu")
    with caplog.at_level("WARNING", logger="hang_watchdog.sources"):
        for seconds in range(12, 40):
            health.down(f"no GPU samples in {tmp_path}/gpu.jsonl for {seconds} s")
        health.down("GPU sample file is unreadable")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert health.last_error == "GPU sample file is unreadable" and not health.up


def test_a_large_existing_file_is_joined_near_its_end(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "gpu.jsonl"
    old = line(sm=0.1, ts=clock.now)
    with path.open("w") as fh:
        fh.write(old * (3 * (1 << 20) // len(old) + 1))  # about 3 MiB of old samples
        fh.write(line(sm=0.9, ts=clock.now))
    src = GpuFileSource(path, clock=clock)
    (sample,) = src.poll()
    assert sample.sm == 0.9
    assert src.bad_lines == 0  # the line cut at the join point is skipped, not reported
    assert src._line_no < 20_000  # only the tail was parsed, not the ~40,000 lines before it
    src.close()


def test_deeply_nested_json_is_one_bad_line(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text("[" * 100_000 + "\n" + line(sm=0.7, ts=clock.now))
    src = GpuFileSource(path, clock=clock)
    (sample,) = src.poll()
    assert sample.sm == 0.7 and src.bad_lines == 1
    src.close()


# -- lies a GPU file can tell ---------------------------------------------------------------


def test_a_gpu_that_goes_silent_is_dropped_not_frozen(tmp_path: Path) -> None:
    path, now = tmp_path / "gpu.jsonl", [1000.0]
    path.write_text("")
    src = GpuFileSource(path, stale_after_s=5, clock=lambda: now[0])
    src.poll()
    with path.open("a") as fh:
        fh.write('{"gpu": 0, "sm": 0.5, "dram": 0.5}\n{"gpu": 1, "sm": 0.9, "dram": 0.1}\n')
    assert [g.index for g in src.poll()] == [0, 1]
    now[0] += 10
    with path.open("a") as fh:
        fh.write('{"gpu": 0, "sm": 0.5, "dram": 0.5}\n')  # GPU 1 stopped reporting
    assert [g.index for g in src.poll()] == [0]
    assert src.health.up


def test_a_timestamp_in_the_future_does_not_keep_the_source_up(tmp_path: Path) -> None:
    path, now = tmp_path / "gpu.jsonl", [1000.0]
    path.write_text("")
    src = GpuFileSource(path, stale_after_s=5, clock=lambda: now[0])
    src.poll()
    with path.open("a") as fh:
        fh.write('{"gpu": 0, "sm": 0.5, "dram": 0.5, "ts": 99999999999}\n')
    assert src.poll()
    now[0] += 30  # the writer stopped
    assert src.poll() == ()
    assert not src.health.up


@pytest.mark.parametrize(
    "line",
    [
        '{"gpu": 99999999999999999999999, "sm": 0.5, "dram": 0.5}',
        '{"gpu": 1024, "sm": 0.5, "dram": 0.5}',
        '{"gpu": 0, "sm": 0.5, "dram": 0.5, "ts": 1' + "0" * 400 + "}",
        '{"gpu": 0, "sm": 0.5, "dram": 0.5, "power_w": 1' + "0" * 400 + "}",
        '{"gpu": 0, "sm": 0.5, "dram": 0.5, "pids": [99999999999999]}',
    ],
)
def test_impossible_numbers_are_bad_lines(line: str) -> None:
    with pytest.raises(BadLine):
        parse_line(line)


def test_null_dram_and_power_limit_and_max_clock_are_read() -> None:
    sample, _ = parse_line(
        json.dumps(
            {"gpu": 0, "sm": 0.96, "dram": None, "power_w": 22.0, "power_limit_w": 100.0,
             "sm_clock_mhz": 2400, "sm_clock_max_mhz": 3000}
        )
    )  # fmt: skip
    assert (sample.sm, sample.dram, sample.power_limit_w, sample.sm_clock_max_mhz) == (
        0.96, None, 100.0, 3000,
    )  # fmt: skip
    with pytest.raises(BadLine, match='"power_limit_w" must be a number'):
        parse_line('{"gpu": 0, "sm": 0.1, "dram": 0.1, "power_limit_w": "700 W"}')
