"""Log throughput against `grep -P` and `wc -l` on the same file, and the live source under a
burst (prints numbers and ratios; asserts nothing).

1. Writes a log of --mib MiB (benchmarks/logload.py: uvicorn access lines around the real
   samples in tests/data/logs/), twice: sparse (15,000 access lines per copy of the samples,
   a busy server) and dense (200 per copy: most lines are ones the watchdog keeps).
2. Times, on each file: `grep -cP` with the signatures' keep pattern (output to a file: GNU
   grep stops at the first match when it writes to /dev/null), `wc -l`, the whole
   `hang-watchdog replay FILE` command, and in-process the old line-by-line path and the
   prefiltered block path over the same bytes (the old path on the sparse file only), then
   prints replay's speed against grep's for both files side by side.
3. Burst: a writer appends --burst-lines lines over --burst-s seconds (NCCL_DEBUG=INFO-like
   noise, stats lines and tqdm redraws) while a LogSource follows the file at a 1 s tick;
   prints the slowest tick, the RSS growth and the lines skipped by reason.

Run: flock /tmp/e2e.lock python3 benchmarks/bench_logs.py [--mib 50]
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logload import write_busy_log  # noqa: E402

from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures  # noqa: E402
from watchdog.core.model import LogEvent  # noqa: E402
from watchdog.core.state.openops import keep_with_ops  # noqa: E402
from watchdog.knowledge import load_knowledge  # noqa: E402
from watchdog.sources.logs.parse import LogPatterns, clean_line  # noqa: E402
from watchdog.sources.logs.scan import BlockScanner, StackBlocks, parse_text  # noqa: E402
from watchdog.sources.logs.source import FileFollower, LogSource  # noqa: E402
from watchdog.sources.logs.split import BlockSplitter, LineSplitter  # noqa: E402
from watchdog.sources.logs.stackdumps import StackScanner  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The shipped engine formats, as the daemon's wiring hands them to its log source.
PATTERNS = LogPatterns.from_engines(load_knowledge().engines)


def timed(argv: list[str], out: Path) -> float:
    """Best of three wall times of a command, stdout to `out`."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with out.open("wb") as fh:
            subprocess.run(argv, stdout=fh, stderr=subprocess.DEVNULL, check=False, cwd=REPO)
        best = min(best, time.perf_counter() - t0)
    return best


def in_process(
    data: bytes, keep: re.Pattern[str] | None, *, line_path: bool = True
) -> tuple[float, float, int, int]:
    """(old seconds, new seconds, old events, new events): the live source's two paths (the
    operations' lines kept too, stack dumps in the log scanned) over the same bytes; the old
    line-by-line one only if `line_path` (else 0.0 s, 0 events)."""
    keep = keep_with_ops(keep, load_ops())
    t0 = time.perf_counter()
    old: list[LogEvent] = []
    if line_path:
        splitter, stacks = LineSplitter(), StackScanner()
        for raw in splitter.feed(data) + [x for x in [splitter.flush()] if x]:
            line = clean_line(raw)
            old += stacks.feed(line, "bench")
            if line:
                old += parse_text(line, "bench", keep, PATTERNS)
        old += stacks.flush("bench")
    t_old = time.perf_counter() - t0
    t0 = time.perf_counter()
    blocks, stacks = BlockSplitter(), StackScanner()
    walker = StackBlocks(BlockScanner(keep, patterns=PATTERNS))
    new: list[LogEvent] = []
    for i in range(0, len(data), 8 << 20):  # the live source's read size per tick
        block = blocks.feed(data[i : i + (8 << 20)])
        if block is not None:
            new += walker.scan(block, "bench", stacks)[0]
    new += stacks.flush("bench")
    t_new = time.perf_counter() - t0
    return t_old, t_new, len(old), len(new)


# Access lines between two copies of the samples: "sparse" is a busy server (about 97 % of the
# bytes are access lines), "dense" a log where most lines are ones the watchdog keeps.
COMPOSITIONS = (("sparse", 15000), ("dense", 200))


def throughput(mib: float, work: Path, access_per_copy: int = 15000) -> tuple[float, float]:
    """Time one composition; returns (grep MiB/s, replay MiB/s)."""
    log = write_busy_log(work / "busy.log", mib, access_per_copy)
    size = log.stat().st_size / 1048576
    keep = load_signatures().log_keep_pattern()
    assert keep is not None
    pat = work / "keep.pat"
    pat.write_text(keep.pattern)
    grep = timed(["grep", "-cP", "-f", str(pat), str(log)], work / "grep.out")
    wc = timed(["wc", "-l", str(log)], work / "wc.out")
    replay = timed([sys.executable, "-m", "watchdog", "replay", str(log)], work / "replay.out")
    tiny = work / "tiny.log"
    tiny.write_bytes(b"INFO 12-01 10:00:00 [api_server.py:1] nothing to see\n")
    start = timed([sys.executable, "-m", "watchdog", "replay", str(tiny)], work / "start.out")
    line_path = access_per_copy >= 1000  # the old path takes minutes on a dense log
    t_old, t_new, n_old, n_new = in_process(log.read_bytes(), keep, line_path=line_path)
    engine = BlockScanner(keep_with_ops(keep, load_ops()), patterns=PATTERNS).prefilter.engine
    n_lines = log.read_bytes().count(b"\n")
    kept = int((work / "grep.out").read_text().strip() or 0)
    print(
        f"log throughput, {size:.1f} MiB log, {access_per_copy} access lines per copy of the "
        f"samples ({n_lines} lines, {kept / n_lines:.1%} of them match the keep pattern)"
    )
    rows = [
        ("wc -l", wc),
        ("grep -cP keep pattern", grep),
        ("hang-watchdog replay (whole command)", replay),
        ("  of which start-up (replay of a 1-line log)", start),
        ("  the rest: the log path", replay - start),
        (f"live block path, in-process (prefilter: {engine})", t_new),
    ]
    if line_path:
        rows.append(("live line-by-line path, in-process (before)", t_old))
    for name, secs in rows:
        print(f"  {name:<46} {secs:7.3f} s  {size / secs:9.1f} MiB/s")
    if line_path:
        print(f"  events kept: old {n_old}, new {n_new}")
    else:
        print(f"  events kept: {n_new}")
    print(f"  replay speed / grep speed (whole command):      {grep / replay:.2f}")
    print(f"  replay's log path speed / grep speed:           {grep / (replay - start):.2f}")
    print(f"  block path speed / grep speed (in-process):     {grep / t_new:.2f}")
    print(f"  block path speed / wc -l speed:                 {wc / t_new:.3f}")
    if line_path:
        print(f"  block path / old path speed-up:                 {t_old / t_new:.1f}x")
    return size / grep, size / replay


_NOISE = (
    b"node1:1234:1290 [3] NCCL INFO Channel 07/32 :    0   1   2   3   4   5   6   7\n",
    b'(APIServer pid=1) INFO:     172.31.0.9:40000 - "POST /v1/completions HTTP/1.1" 200 OK\n',
    b"(EngineCore pid=2) DEBUG 12-01 10:00:00 [core.py:1] EngineCore loop iteration\n",
)
_STATS = (
    b"(APIServer pid=1) INFO 12-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput:"
    b" 10.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs,"
    b" GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%\n"
)


def burst(lines: int, seconds: float, work: Path) -> None:
    log = work / "burst.log"
    log.write_bytes(b"")
    source = LogSource(
        [FileFollower(log)], keep=load_signatures().log_keep_pattern(), patterns=PATTERNS
    )
    source.poll()
    batch = [_NOISE[i % 3] for i in range(999)] + [_STATS]
    batch[500] = b"Processed prompts:  50%|#####     | 50/100 [00:05<00:05, 10.0it/s]\r"
    chunk = b"".join(batch)
    steps = int(seconds * 20)

    def writer() -> None:
        with log.open("ab") as fh:
            for _ in range(steps):
                fh.write(chunk * max(1, lines // 1000 // steps))
                fh.flush()
                time.sleep(seconds / steps)

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    thread = threading.Thread(target=writer)
    t_start = time.monotonic()
    thread.start()
    ticks: list[float] = []
    events = 0
    while thread.is_alive() or not ticks or ticks[-1] > 0.01:
        t0 = time.monotonic()
        events += len(source.poll())
        ticks.append(time.monotonic() - t0)
        time.sleep(max(0.0, 1.0 - ticks[-1]))
        if time.monotonic() - t_start > seconds + 30:
            break
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    written = log.read_bytes().count(b"\n") + log.read_bytes().count(b"\r")
    print(f"burst: {written} lines ({log.stat().st_size / 1048576:.1f} MiB) in {seconds:g} s")
    median = sorted(ticks)[len(ticks) // 2]
    print(f"  ticks: {len(ticks)}, slowest {max(ticks):.3f} s, median {median:.3f} s")
    print(f"  events: {events}, capped: {source.dropped_events}, skipped: {source.skipped}")
    print(f"  peak RSS growth while following: {(rss1 - rss0) / 1024:.1f} MiB")
    print(f"  prefilter: {source.prefilter_engine}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=float, default=50.0, help="size of the busy log (MiB)")
    ap.add_argument("--burst-lines", type=int, default=500_000)
    ap.add_argument("--burst-s", type=float, default=5.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    try:
        speeds = [(name, n, *throughput(args.mib, work, n)) for name, n in COMPOSITIONS]
        print("replay vs grep -cP, side by side (whole `hang-watchdog replay` command):")
        for name, n, grep, replay in speeds:
            print(
                f"  {name:<6} ({n:>5} access lines per copy): grep {grep:6.1f} MiB/s, "
                f"replay {replay:6.1f} MiB/s, replay / grep {replay / grep:.2f}"
            )
        burst(args.burst_lines, args.burst_s, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
