"""The process-tree poll at 1, 8 and 64 ranks: what one ProcSource.poll costs, with the tree's
membership and titles cached (the default, re-read every 5 s) and re-read every tick (as before)
(prints numbers and the ratio; asserts nothing).

Starts a real parent with N-1 sleeping Python children (N ranks in all), then times --polls
polls of ProcSource on it, as the daemon's 1 Hz loop would run them back to back.

Run: flock /tmp/e2e.lock python3 benchmarks/bench_procs.py [--ranks 1,8,64] [--polls 50]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from watchdog.sources.procs import PidTarget, ProcSource  # noqa: E402

PARENT = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    " for _ in range(int(sys.argv[1]))]\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def per_poll(src: ProcSource, polls: int) -> float:
    """CPU seconds of this process per poll."""
    src.poll()
    t0 = time.process_time()
    for _ in range(polls):
        src.poll()
    return (time.process_time() - t0) / polls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", default="1,8,64", help="process counts to measure")
    ap.add_argument("--polls", type=int, default=50, help="polls timed per point")
    args = ap.parse_args()
    print(f"process-tree poll, CPU per poll ({args.polls} polls; host has "
          f"{len(psutil.pids())} processes)")  # fmt: skip
    print(f"{'ranks':>6} {'cached ms':>10} {'every tick ms':>14} {'speed-up':>9}")
    for n in (int(x) for x in args.ranks.split(",")):
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, str(n - 1)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
            while len(psutil.Process(parent.pid).children()) < n - 1:
                time.sleep(0.05)
            cached = per_poll(ProcSource(PidTarget(parent.pid)), args.polls)
            fresh = per_poll(ProcSource(PidTarget(parent.pid), tree_every_s=0.0), args.polls)
            seen = len(ProcSource(PidTarget(parent.pid)).poll().procs)
            print(f"{seen:>6} {cached * 1000:>10.2f} {fresh * 1000:>14.2f} "
                  f"{fresh / max(cached, 1e-9):>8.1f}x", flush=True)  # fmt: skip
        finally:
            for child in psutil.Process(parent.pid).children():
                child.kill()
            parent.kill()
            parent.wait()


if __name__ == "__main__":
    main()
