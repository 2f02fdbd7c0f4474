"""Soak: a live watchdog against a chatty healthy server for N minutes (prints numbers; asserts
nothing). Every interval it prints the watchdog's RSS, threads, open fds and loop durations, and
at the end the RSS and fd slopes after the window has filled (flat means bounded memory).

Run: python benchmarks/soak.py [--minutes 15] [--tick-s 0.2] [--window-s 60] [--lines-per-s 2000]
       [--burst-mb 8 --burst-every-s 60] [--long-lines-per-s 2]
The burst writer appends BURST_MB of access lines at once every BURST_EVERY_S; the long-line
writer appends 100 KB lines (SGLang's ProcessGroupNCCL shape, TensorRT-LLM's iteration log).
At the end: the loop's p99 (from the exporter's histogram buckets, after the window filled)
and how often the log source went down or fell behind.
Everything stays on 127.0.0.1; the server is the simulated vLLM (watchdog/sim).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
ACCESS = '(APIServer pid=7) INFO:     127.0.0.1:50163 - "POST /v1/completions HTTP/1.1" 200 OK\n'
PROMPT = "(APIServer pid=7) INFO 12-01 10:00:00 [logger.py:1] Received request: prompt: '{}'\n"


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    return out


def wait_for(
    path: Path, pattern: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None
) -> re.Match[str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the watchdog exited ({proc.returncode}): {path.read_text()[-500:]}")
        m = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if m:
            return m
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {pattern!r} in {path}")


def chatter(log: Path, per_s: int, stop: threading.Event) -> None:
    """Access lines, and every hundredth line a long logged prompt (the 64 KB case)."""
    with log.open("a") as fh:
        n = 0
        while not stop.is_set():
            began = time.monotonic()
            for _ in range(max(1, per_s // 10)):
                n += 1
                fh.write(PROMPT.format("word " * 4000) if n % 100 == 0 else ACCESS)
            fh.flush()
            stop.wait(max(0.0, 0.1 - (time.monotonic() - began)))


LONG = (
    "[2026-12-01 10:00:00 TP0] " + "[E ProcessGroupNCCL.cpp:1] " * 3800 + "\n",
    "[12/01/2026-10:00:00] [TRT-LLM] [MPI_Rank 0] [I] iter = 1, global_rank = 0, rank = 0, "
    "states = {" + "'num_ctx_requests': 0, " * 4300 + "}\n",
)


def bursts(log: Path, mb: float, every_s: float, stop: threading.Event) -> None:
    """`mb` MB of access lines at once, every `every_s` seconds."""
    chunk = ACCESS * max(1, int(mb * 2**20) // len(ACCESS))
    while not stop.wait(every_s):
        with log.open("a") as fh:
            fh.write(chunk)


def long_lines(log: Path, per_s: float, stop: threading.Event) -> None:
    """100 KB lines, alternating the two engine shapes."""
    n = 0
    while not stop.wait(1.0 / per_s):
        with log.open("a") as fh:
            fh.write(LONG[n % 2])
        n += 1


def loop_figures(port: int) -> tuple[float, float, dict[float, float]]:
    """(sum, count, {bucket bound: cumulative count}) of hang_watchdog_loop_duration_seconds."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback only
        body = resp.read().decode()
    vals = dict(re.findall(r"^hang_watchdog_loop_duration_seconds_(sum|count) (\S+)$", body, re.M))
    les = re.findall(r'^hang_watchdog_loop_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$', body,
                     re.M)  # fmt: skip
    buckets = {float(le): float(n) for le, n in les}
    return float(vals.get("sum", 0)), float(vals.get("count", 0)), buckets


def p99_bound(first: dict[float, float], last: dict[float, float]) -> float:
    """The smallest bucket bound holding 99% of the loops between two scrapes."""
    total = last.get(float("inf"), 0.0) - first.get(float("inf"), 0.0)
    for le in sorted(last):
        if total and last[le] - first.get(le, 0.0) >= 0.99 * total:
            return le
    return float("nan")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points, per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points) or 1.0
    return sum((t - mt) * (y - my) for t, y in points) / var * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--tick-s", type=float, default=0.2)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--lines-per-s", type=int, default=2000)
    ap.add_argument("--every-s", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--burst-mb", type=float, default=0.0, help="MB per burst (0: no bursts)")
    ap.add_argument("--burst-every-s", type=float, default=60.0)
    ap.add_argument("--long-lines-per-s", type=float, default=0.0, help="100 KB lines a second")
    ap.add_argument(
        "--settle-s", type=float, default=None,
        help="seconds before slopes and p99 count (default 3 windows: the log budget fills)",
    )  # fmt: skip
    a = ap.parse_args()
    settle = a.settle_s if a.settle_s is not None else a.window_s * 3
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    log, gpu, port_file = tmp / "server.log", tmp / "gpu.jsonl", tmp / "port"
    sim = subprocess.Popen(
        [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", "healthy", "--mode", "serve",
         "--port", "0", "--port-file", str(port_file), "--log-file", str(log), "--gpu-file",
         str(gpu), "--stats-interval", "1", "--startup-s", "1", "--workdir", str(tmp)],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while not port_file.exists() or not port_file.read_text().strip():
        time.sleep(0.1)
    stall = min(30.0, a.window_s / 2)  # thresholds must fit inside the window (config checks)
    err = (tmp / "watchdog.err").open("wb")
    wd = subprocess.Popen(
        [sys.executable, "-m", "watchdog", "run", "--pid", str(sim.pid), "--log-file", str(log),
         "--gpu-source", f"file:{gpu}", "--server-url", f"http://127.0.0.1:{port_file.read_text().strip()}",
         "--tick-s", str(a.tick_s), "--window-s", str(a.window_s), "--stall-after-s", str(stall),
         "--suspect-after-s", str(min(8.0, stall / 2)), "--blind-stall-after-s", str(stall),
         "--gpu-spin-for-s", str(min(20.0, stall / 2)),
         "--metrics-addr", "127.0.0.1:0", "--no-cdn-default", "--no-stacks"],
        env=env(), stdout=subprocess.DEVNULL, stderr=err,
    )  # fmt: skip
    stop = threading.Event()
    writers = [threading.Thread(target=chatter, args=(log, a.lines_per_s, stop), daemon=True)]
    if a.burst_mb > 0:
        writers.append(threading.Thread(target=bursts, daemon=True,
                                        args=(log, a.burst_mb, a.burst_every_s, stop)))  # fmt: skip
    if a.long_lines_per_s > 0:
        writers.append(threading.Thread(target=long_lines, daemon=True,
                                        args=(log, a.long_lines_per_s, stop)))  # fmt: skip
    try:
        up = wait_for(tmp / "watchdog.err", r"metrics on http://[^:]+:(\d+)/", proc=wd)
        port = int(up.group(1))
        for w in writers:
            w.start()
        proc = psutil.Process(wd.pid)
        began, last = time.monotonic(), loop_figures(port)
        filled: dict[float, float] | None = None  # the histogram when the window had filled
        rss_pts: list[tuple[float, float]] = []
        fd_pts: list[tuple[float, float]] = []
        print(
            f"{'t_s':>6} {'rss_MB':>8} {'threads':>7} {'fds':>5} {'loop_mean_ms':>12} {'loops':>6}"
        )
        while time.monotonic() - began < a.minutes * 60:
            time.sleep(a.every_s)
            t = time.monotonic() - began
            now = loop_figures(port)
            loops = now[1] - last[1]
            mean_ms = (now[0] - last[0]) / loops * 1000 if loops else float("nan")
            last = now
            rss = proc.memory_info().rss / 2**20
            fds = proc.num_fds()
            threads = proc.num_threads()
            row = f"{t:6.0f} {rss:8.1f} {threads:7d} {fds:5d} {mean_ms:12.1f} {loops:6.0f}"
            print(row, flush=True)
            if t > settle:  # the window (and its log budget) has filled
                filled = now[2] if filled is None else filled
                rss_pts.append((t, rss))
                fd_pts.append((t, fds))
        print(f"after the window filled: RSS slope {slope(rss_pts):+.2f} MB/min, "
              f"fd slope {slope(fd_pts):+.2f} /min over {len(rss_pts)} samples")  # fmt: skip
        if filled is not None:
            print(f"loop p99 after the window filled: <= {p99_bound(filled, last[2]):g} s "
                  f"(histogram bucket; tick {a.tick_s:g} s)")  # fmt: skip
        text = (tmp / "watchdog.err").read_text(errors="replace")
        print(f"tracebacks in the watchdog's stderr: {text.count('Traceback')}")
        print(
            f"'source logs is down' lines: {text.count('source logs is down')}, "
            f"'fell behind' lines: {text.count('fell behind')}"
        )
    finally:
        stop.set()
        wd.terminate()
        wd.wait(30)
        sim.terminate()
        sim.wait(30)
        err.close()


if __name__ == "__main__":
    main()
