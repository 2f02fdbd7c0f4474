"""A poll that misses its deadline because the host starves the watchdog of CPU says so,
instead of blaming a read stuck in the driver."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from watchdog.sources.schedstat import RunQueueMeter, run_queue_wait_s

# Runs in a child: pinned to one CPU at nice 19 beside two busy loops at nice 0 on the same
# CPU, the poll's own CPU work waits on the run queue far past its 0.5 s deadline.
STARVED = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from watchdog.sources.base import SourceHealth
    from watchdog.sources.deadline import DeadlineCall
    os.sched_setaffinity(0, {0})
    busy = [subprocess.Popen([sys.executable, "-c",
            "import os; os.sched_setaffinity(0, {0})\\nwhile True: pass"]) for _ in range(2)]
    os.nice(19)
    try:
        health = SourceHealth("probe")
        call = DeadlineCall("probe", health, 0.5)
        def work():
            end = time.process_time() + 0.6
            while time.process_time() < end:
                pass
        call(work)
        print(health.last_error)
    finally:
        for p in busy:
            p.kill()
    """
)

BLOCKED = textwrap.dedent(
    """
    import time
    from watchdog.sources.base import SourceHealth
    from watchdog.sources.deadline import DeadlineCall
    health = SourceHealth("probe")
    DeadlineCall("probe", health, 0.3)(lambda: time.sleep(2))
    print(health.last_error)
    """
)


def run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_a_starved_poll_names_the_cpu_not_the_driver() -> None:
    said = run(STARVED)
    assert "waited" in said and "for a CPU" in said and "CPUWeight=" in said, said
    assert "stuck in the driver" not in said


def test_a_blocked_poll_keeps_the_blocked_read_hint() -> None:
    said = run(BLOCKED)
    assert "stuck in the driver" in said and "for a CPU" not in said, said


def test_run_queue_wait_reads_this_process_or_none() -> None:
    wait = run_queue_wait_s()
    assert wait is None or wait >= 0.0
    assert run_queue_wait_s(proc_root="/nonexistent") is None


def test_the_loops_meter_reads_what_the_function_reads_and_follows_its_threads() -> None:
    meter = RunQueueMeter()
    # The counters only grow: a meter reading its open files afresh is sandwiched.
    for _ in range(50):
        before = meter.wait_s()
        plain = run_queue_wait_s()
        after = meter.wait_s()
        assert before is not None and plain is not None and after is not None
        assert before <= plain <= after
    held = len(meter._fds)
    stop = threading.Event()
    extra = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in extra:
        t.start()
    assert meter.wait_s() is not None and len(meter._fds) == held + 3
    stop.set()
    for t in extra:
        t.join()
    assert meter.wait_s() is not None and len(meter._fds) == held  # ended threads let go
    meter.close()
    assert meter._fds == {}
    assert RunQueueMeter(proc_root="/nonexistent").wait_s() is None
