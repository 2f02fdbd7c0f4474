"""Log-source throughput: bytes in, parsed events out, per second (prints numbers).

Feeds every real log sample in tests/data/logs/ (repeated) through the same steps the log
source runs: LineSplitter, clean_line, split_records and parse_line with the signatures' keep
pattern. Run: python benchmarks/bench_logs.py [--mib 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from watchdog.core.signatures import load_signatures
from watchdog.sources.linesplit import LineSplitter, split_records
from watchdog.sources.logparse import clean_line, parse_line

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "logs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=float, default=20.0, help="how much log to feed")
    args = ap.parse_args()
    sample = b"".join(p.read_bytes() for p in sorted(DATA.glob("*.log")))
    data = sample * max(1, int(args.mib * 1024 * 1024 / len(sample)))
    keep = load_signatures().log_keep_pattern()
    splitter = LineSplitter()
    lines = events = 0
    t0 = time.perf_counter()
    for i in range(0, len(data), 65536):
        for raw in splitter.feed(data[i : i + 65536]):
            lines += 1
            for record in split_records(clean_line(raw)):
                events += parse_line(record, keep=keep) is not None
    secs = time.perf_counter() - t0
    print(
        f"logs: {len(data) / 1048576:.1f} MiB, {lines} lines in {secs:.2f} s: "
        f"{lines / secs:,.0f} lines/s, {len(data) / 1048576 / secs:.1f} MiB/s, {events} events kept"
    )


if __name__ == "__main__":
    main()
