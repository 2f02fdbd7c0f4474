"""Stack capture for 8 and 64 ranks against serial `py-spy dump` calls (prints numbers and the
ratio; asserts nothing).

Starts N real Python processes ("ranks", each blocked a few frames deep, as a rank waiting in
a collective is), then times:
  serial      one `py-spy dump --pid P` after another, as a shell loop would
  capturer    the watchdog's StackCapturer.capture_now (sources/stacks/capture.py, whatever its
              scheduling is on this checkout: concurrency, overall deadline), first dump only
Both without --native by default (--native: both with it), so the ratio is the scheduling's.
The capturer runs py-spy twice per rank (JSON for the rules, text for the bundle).

Run: flock /tmp/e2e.lock python3 benchmarks/bench_stacks.py [--ranks 8,64]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from watchdog.core.model import ProcInfo  # noqa: E402
from watchdog.sources.stacks.capture import StackCapturer  # noqa: E402
from watchdog.sources.stacks.parse import resolve_pyspy  # noqa: E402

RANK = """
import sys, threading, time
def all_reduce(event):
    event.wait()
def forward(event):
    all_reduce(event)
print("ready", flush=True)
forward(threading.Event())
"""


def start_ranks(n: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()
    time.sleep(0.3)
    return procs


def serial(exe: str, pids: list[int], native: bool) -> tuple[float, int]:
    ok = 0
    t0 = time.perf_counter()
    for pid in pids:
        argv = [exe, "dump", "--pid", str(pid), *(["--native"] if native else [])]
        done = subprocess.run(argv, capture_output=True, check=False)
        ok += done.returncode == 0 and b"all_reduce" in done.stdout
    return time.perf_counter() - t0, ok


def capturer(pids: list[int], deadline_s: float, native: bool) -> tuple[float, str, int]:
    procs = [ProcInfo(pid=p, ppid=0, name="python", title=f"rank {i}") for i, p in enumerate(pids)]
    cap = StackCapturer(native=native, deadline_s=deadline_s, second_after_s=-1)
    t0 = time.perf_counter()
    result = cap.capture_now(procs)
    secs = time.perf_counter() - t0
    return secs, result.result, len(result.samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", default="8,64", help="comma-separated rank counts")
    ap.add_argument("--deadline-s", type=float, default=30.0, help="the capturer's deadline")
    ap.add_argument("--native", action="store_true", help="py-spy --native on both sides")
    args = ap.parse_args()
    exe = resolve_pyspy(None)
    if exe is None:
        print("py-spy not found: pip install py-spy")
        return
    print(f"stack capture, py-spy at {exe}, {'with' if args.native else 'without'} --native")
    for n in (int(x) for x in args.ranks.split(",")):
        procs = start_ranks(n)
        try:
            pids = [p.pid for p in procs]
            t_serial, ok = serial(exe, pids, args.native)
            t_cap, result, got = capturer(pids, args.deadline_s, args.native)
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
        print(f"  {n:>3} ranks: serial py-spy {t_serial:6.2f} s ({ok}/{n} ok)   "
              f"StackCapturer {t_cap:6.2f} s ({result}, {got} stacks)   "
              f"speed-up {t_serial / t_cap:5.1f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
