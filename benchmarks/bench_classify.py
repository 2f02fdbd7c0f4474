"""How long one classification takes on a full window (prints numbers; asserts nothing).

A tick must stay far below `tick_s` (1 s) even with 8 GPUs, a 600 s window and a busy log.
Run: python benchmarks/bench_classify.py [--gpus 8] [--lines-per-tick 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import (
    GpuSample,
    LogEvent,
    Observation,
    ProcInfo,
    ProcSnapshot,
    ServerSample,
)
from watchdog.core.state.window import Window
from watchdog.sources.logs.parse import parse_line

ACCESS = '(APIServer pid=7) INFO:     127.0.0.1:50163 - "POST /v1/completions HTTP/1.1" 200 OK'
STATS = (
    "(APIServer pid=7) INFO 01-12 02:58:15 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "1646.8 tokens/s, Avg generation throughput: 154.3 tokens/s, Running: 128 reqs, Waiting: 0 "
    "reqs, GPU KV cache usage: 4.6%, Prefix cache hit rate: 0.0%"
)


def build_window(gpus: int, lines: int, seconds: int, keep_all: bool) -> Window:
    sigs = load_signatures()
    keep = sigs.log_keep_pattern()
    stats = parse_line(STATS)
    # The log source keeps only lines a parser or a signature pattern wants; an access line is
    # dropped there. A worst case keeps every line: --keep-all.
    access = parse_line(ACCESS, keep=keep) or (
        LogEvent(kind="line", line=ACCESS) if keep_all else None
    )
    assert stats is not None
    w = Window(span_s=seconds)
    procs = ProcSnapshot(
        7, True, tuple(ProcInfo(7 + i, 7, "python", f"VLLM::Worker_TP{i}") for i in range(gpus))
    )
    for t in range(seconds):
        logs = (stats,) + ((access,) * (lines - 1) if access is not None else ())
        gs = tuple(GpuSample(index=i, sm=0.8, dram=0.5, procs=1, cc="10.3") for i in range(gpus))
        vllm = ServerSample(
            up=True, health_status=200, iterations=float(t), running=8.0, waiting=0.0
        )
        w.append(
            Observation(t=float(t), wall=1.7e9 + t, gpus=gs, logs=logs, server=vllm, procs=procs)
        )
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--lines-per-tick", type=int, default=50)
    ap.add_argument("--window-s", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--keep-all", action="store_true", help="keep every log line (worst case)")
    args = ap.parse_args()
    w = build_window(args.gpus, args.lines_per_tick, args.window_s, args.keep_all)
    sigs, th = load_signatures(), Thresholds()
    samples = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        classify(w, sigs, th)
        samples.append((time.perf_counter() - t0) * 1000)
    kept = " (every line kept)" if args.keep_all else ""
    p95 = sorted(samples)[int(len(samples) * 0.95) - 1]
    print(
        f"classify{kept}: {args.gpus} GPUs, {args.window_s} s window, "
        f"{args.lines_per_tick} log lines/tick: median {statistics.median(samples):.2f} ms, "
        f"p95 {p95:.2f} ms, max {max(samples):.2f} ms"
    )


if __name__ == "__main__":
    main()
