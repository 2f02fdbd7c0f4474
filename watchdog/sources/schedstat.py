"""How long this process's threads waited for a CPU: tells a starved watchdog from a stuck read.

/proc/PID/task/TID/schedstat holds three numbers per thread: time on a CPU, time runnable but
waiting on a run queue (both in nanoseconds), and the number of time slices (Linux
Documentation/scheduler/sched-stats.rst). A poll that missed its deadline while our threads sat
on the run queue for most of it was starved of CPU by a busy host, not blocked in the kernel.
"""

from __future__ import annotations

from pathlib import Path


def run_queue_wait_s(proc_root: str = "/proc") -> float | None:
    """Seconds this process's threads have spent runnable but not running; None when the
    kernel has no schedstat (CONFIG_SCHED_INFO off) or /proc cannot be read."""
    total = 0
    found = False
    try:
        tasks = list((Path(proc_root) / "self" / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            total += int(fields[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9 if found else None
