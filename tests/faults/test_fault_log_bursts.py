"""Faults of log volume, against the parts and a live watchdog: a burst larger than one poll's
budget, lines of 64-100 KB in every engine's format, a million 1-byte lines, a rotation in the
middle of a burst. The promise is the same for each: the signature line behind the burst is
found (late, never lost), the loop keeps its tick, and the memory held stays bounded in bytes."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import DEATH, FOUND, Watchdog, finish, watch
from tests.shipped import PATTERNS
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import LogEvent, Observation
from watchdog.core.state.window import Window
from watchdog.sources.logs.scan import BlockScanner
from watchdog.sources.logs.source import FileFollower, LogSource
from watchdog.sources.logs.split import BlockSplitter

pytestmark = pytest.mark.slow

STATS = (
    "INFO 12-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%\n"
)


@pytest.fixture
def target() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "613"])
    yield proc.pid
    proc.kill()
    proc.wait()


def loop_worst_s(wd: Watchdog) -> float:
    """The slowest loop so far, from the exporter's histogram: the smallest bucket bound that
    holds every loop (inf when some loop was slower than the largest bound)."""
    body = wd.get("/metrics")[1]
    count, buckets = 0.0, []
    for line in body.splitlines():
        if line.startswith("hang_watchdog_loop_duration_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("hang_watchdog_loop_duration_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.split()[-1])))
    return min((le for le, n in sorted(buckets) if n >= count), default=float("inf"))


# -- the parts: budget read per line, carry, bounded memory ----------------------------------


def test_a_spent_budget_parses_one_line_and_carries_the_rest() -> None:
    """The clock is read after every line: with the deadline already passed one line is
    parsed, not 64 (64 lines of 60 KB were 3.8 MB of regex work between two looks)."""
    keep = load_signatures([]).log_keep_pattern()
    line = b"vllm.v1.engine.exceptions.EngineDeadError: " + b"x" * 60_000 + b"\n"
    block = BlockSplitter().feed(line * 100)
    assert block is not None
    events, rest = BlockScanner(keep).scan(block, "t", deadline=0.0)
    assert len(events) == 1
    assert rest is not None and rest.count() == 99  # carried, nothing dropped


def test_a_burst_over_the_budget_loses_no_signature_line(tmp_path: Path) -> None:
    """Every line of a burst the budget cannot parse in one poll is still parsed, in order,
    over the next polls; the death line at its end is among them."""
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    keep = load_signatures([]).log_keep_pattern()
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # each look at the clock: 1 ms of "work"
        return now[0]

    source = LogSource([FileFollower(log)], keep=keep, budget_s=0.05, clock=clock,
                       max_events_per_tick=10**6, patterns=PATTERNS)  # fmt: skip
    source.poll()
    with log.open("a") as fh:
        fh.write(STATS * 5000 + DEATH)
    events: list[LogEvent] = []
    for _ in range(5000):
        events += source.poll()
        if not source.carried:
            break
    assert source.carried == 0 and sum(source.skipped.values()) == 0
    assert sum(e.kind == "stats" for e in events) == 5000
    assert any("EngineDeadError" in e.line for e in events)


def _tick(t: float, n: int, width: int) -> Observation:
    logs = tuple(
        LogEvent(kind="line", line=f"req {i} " + "p" * width, source="logs") for i in range(n)
    )
    return Observation(t=t, wall=t, logs=logs)


def test_the_windows_log_memory_is_bounded_in_bytes() -> None:
    """500 long lines a tick for 400 ticks: shrinking the oldest lines to 256 characters still
    held 500 x 256 x 400 = 51 MB; past the budget the oldest ticks now lose their lines."""
    w = Window(span_s=10_000, max_len=4000, max_chars=4 << 20)
    held = 0
    for t in range(400):
        w.append(_tick(float(t), 500, 4000))
        held = max(held, w.chars)
    newest = 500 * (4096 + 400)
    assert held <= (4 << 20) + newest, held
    assert w.latest is not None and len(w.latest.logs) == 500  # the newest tick is whole


def test_the_log_tail_is_bounded_in_bytes(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    source = LogSource([FileFollower(log)], tail_lines=2000, patterns=PATTERNS)
    source.poll()
    with log.open("a") as fh:
        for i in range(2000):
            fh.write(f"prompt {i} " + "w" * 9000 + "\n")
    for _ in range(4):  # 18 MB: read 8 MB a poll
        source.poll()
    tail = source.tail(2000)
    assert tail[-1].startswith("prompt 1999 ")
    assert sum(map(len, tail)) <= (1 << 20) + 8192  # 2000 x 8 KB was 16 MB


# -- live: the watchdog attached to a log that misbehaves -------------------------------------


def test_a_burst_then_the_death_line_is_found(tmp_path: Path, target: int) -> None:
    """12 MB of stats lines (each one parsed) in one go, then EngineDeadError: the old scanner
    dropped the rest of each 8 MB read when its budget ran out, the death line with it."""
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    with log.open("a") as fh:
        fh.write(STATS * (12_000_000 // len(STATS)) + DEATH)
    # Found, not fast: every stats line is parsed and classified at a 0.2 s tick, which took
    # 90-235 s on two shared cores; the limit only catches a line that is never found.
    wd.wait_line(FOUND, timeout=480)
    finish(wd)


HOSTILE_LINES = {
    # tensorrt_llm logger.py Logger.log prefix, then a 100 KB iteration-log payload
    "trtllm_100k": "[12/01/2026-10:00:00] [TRT-LLM] [MPI_Rank 0] [I] iter = 1, global_rank = 0, "
    "rank = 0, states = {" + "'num_ctx_requests': 0, " * 4300 + "}\n",
    # SGLang's scheduler line shape with ProcessGroupNCCL repeated (the shape that made
    # `ProcessGroupNCCL.*[Tt]imeout` quadratic)
    "sglang_nccl_100k": "[2026-12-01 10:00:00 TP0] " + "[E ProcessGroupNCCL.cpp:1] " * 3800 + "\n",
}


@pytest.mark.parametrize("shape", sorted(HOSTILE_LINES))
def test_long_engine_lines_keep_the_loop_and_the_source_up(
    tmp_path: Path, target: int, shape: str
) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    with log.open("a") as fh:
        for _ in range(40):
            fh.write(HOSTILE_LINES[shape])
            fh.flush()
            time.sleep(0.05)
        fh.write(DEATH)
    wd.wait_line(FOUND, timeout=60)
    assert "source logs is down" not in wd.stderr, wd.stderr[-2000:]
    assert loop_worst_s(wd) <= 2.5, wd.get("/metrics")[1][-3000:]
    finish(wd)


def test_a_million_one_byte_lines_then_the_death(tmp_path: Path, target: int) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    with log.open("a") as fh:
        fh.write("x\n" * 1_000_000 + DEATH)
    wd.wait_line(FOUND, timeout=60)
    assert "source logs is down" not in wd.stderr, wd.stderr[-2000:]
    finish(wd)


@pytest.mark.parametrize("how", ["rename", "copytruncate"])
def test_a_rotation_during_a_burst_loses_no_death_line(
    tmp_path: Path, target: int, how: str
) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    wd = watch(tmp_path, log, target)
    stop = threading.Event()

    def burst() -> None:  # about 10 000 lines (2 MB) a second, each one a parsed stats line
        while not stop.is_set():
            with log.open("a") as fh:
                fh.write(STATS * 100)
            time.sleep(0.01)

    writer = threading.Thread(target=burst)
    writer.start()
    try:
        time.sleep(1.5)
        if how == "rename":
            os.rename(log, tmp_path / "server.log.1")
        else:
            os.truncate(log, 0)
        time.sleep(0.5)
    finally:
        stop.set()
        writer.join()
    with log.open("a") as fh:  # the engine dies: its stats lines stop (the burst unread yet)
        fh.write(DEATH)
    wd.wait_line(FOUND, timeout=90)
    finish(wd)
