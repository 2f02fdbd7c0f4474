"""Daemon CPU and RSS against the floor process, and the curve over GPUs and ranks (prints
numbers and ratios; asserts nothing).

For each (GPUs, ranks) point: a healthy simulated vLLM serves on 127.0.0.1 with --gpus N
(file GPU source) and --tp R (R worker processes), under light load; `hang-watchdog run`
attaches to it at 1 Hz with every source on (file GPU source, its log, /metrics, the process
tree, sockets, package facts). After a warm-up, the daemon's CPU time over --seconds and its
RSS are read from /proc (psutil). The floor: an idle Python process that imports the same
libraries and serves the daemon's own exporter (an empty sink) on 127.0.0.1.

Then, at the headline point (8 GPUs, 1 rank), what each part of a tick costs: the same daemon
built in this process by the same wiring, every source's poll, classify and each hook timed
(benchmarks/tickcost.py), mean and p90 ms of CPU and wall time. --host-conns N holds N idle
loopback TCP connections open on the host for the whole run, as on a busy server: the
unanswered-requests witness reads the kernel's socket table (sources/tcpdiag.py).

Run: flock /tmp/e2e.lock python3 benchmarks/bench_daemon.py [--seconds 20] [--points 8x1,...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tickcost import host_connections, report, tick_costs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FLOOR = (
    # The libraries a default `run` loads (httpx only comes with the canary, the smoke test,
    # dcgm: and fleet queries, all off by default; prometheus_client only with dcgm:), with
    # nvml's pynvml as deployed, and the daemon's own exporter serving an empty sink.
    "import time, psutil, pynvml\n"
    "import watchdog.commands.cli, watchdog.daemon.wiring, watchdog.core.judge.classify\n"
    "from watchdog.outputs.export import MetricsSink\n"
    "from watchdog.outputs.metrics_http import MetricsServer\n"
    "MetricsServer(MetricsSink((), version='floor'), '127.0.0.1:0').start()\n"
    "print('ready', flush=True)\n"
    "time.sleep(3600)\n"
)


def measure(proc: psutil.Process, warmup: float, seconds: float) -> tuple[float, float]:
    """(CPU share of one core, RSS MiB at the end) of a running process."""
    time.sleep(warmup)
    t0 = proc.cpu_times()
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = proc.cpu_times()
    cpu = max(0.0, t1.user + t1.system - t0.user - t0.system) / (time.monotonic() - w0)
    return cpu, proc.memory_info().rss / 1048576


def floor(warmup: float, seconds: float, python: str = sys.executable) -> tuple[float, float]:
    proc = subprocess.Popen([python, "-c", FLOOR], stdout=subprocess.PIPE, env=ENV)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        return measure(psutil.Process(proc.pid), warmup, seconds)
    finally:
        proc.kill()
        proc.wait()


def start_sim(work: Path, gpus: int, ranks: int) -> tuple[subprocess.Popen[bytes], int]:
    port_file = work / "port"
    argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", "healthy"]
    argv += ["--mode", "serve", "--startup-s", "1", "--load", "2", "--workdir", str(work)]
    argv += ["--gpus", str(gpus), "--tp", str(ranks), "--gpu-file", str(work / "gpu.jsonl")]
    argv += ["--log-file", str(work / "sim.log"), "--port-file", str(port_file)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + 60
    while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    return proc, int(port_file.read_text())


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for p in [*kids, psutil.Process(proc.pid)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()
    psutil.wait_procs(kids, timeout=10)


def run_args(work: Path, sim_pid: int, port: int) -> list[str]:
    """`hang-watchdog run`'s arguments for the simulator: every default source on."""
    argv = ["--pid", str(sim_pid), "--no-cdn-default"]
    argv += ["--server-url", f"http://127.0.0.1:{port}"]
    argv += ["--gpu-source", f"file:{work / 'gpu.jsonl'}"]
    argv += ["--log-file", str(work / "sim.log"), "--metrics-addr", "127.0.0.1:0"]
    return [*argv, "--state-dir", str(work / "state")]


def daemon_point(
    gpus: int, ranks: int, warmup: float, seconds: float, python: str = sys.executable
) -> tuple[float, float]:
    """The daemon's (CPU share, RSS MiB) at one point, run by the interpreter `python`."""
    work = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    sim, port = start_sim(work, gpus, ranks)
    argv = [python, "-m", "watchdog", "run", *run_args(work, sim.pid, port)]
    wd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        return measure(psutil.Process(wd.pid), warmup, seconds)
    finally:
        wd.terminate()
        try:
            wd.wait(timeout=20)
        except subprocess.TimeoutExpired:
            wd.kill()
            wd.wait()
        kill_tree(sim)
        shutil.rmtree(work, ignore_errors=True)


def tick_point(gpus: int, ranks: int, warmup: float, seconds: float) -> None:
    """Print what each part of a tick costs, the daemon built in this process."""
    work = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    sim, port = start_sim(work, gpus, ranks)
    try:
        costs, cpu_s, ticks = tick_costs(run_args(work, sim.pid, port), warmup, seconds)
    finally:
        kill_tree(sim)
        shutil.rmtree(work, ignore_errors=True)
    print(f"per tick at {gpus} GPUs, {ranks} rank(s), 1 Hz (in-process, {ticks} ticks):")
    for line in report(costs, cpu_s, ticks):
        print("  " + line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured span per point")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds before measuring")
    ap.add_argument(
        "--points",
        default="8x1,1x1,16x1,64x1,8x8,64x64",
        help="GPUSxRANKS points; the first is the headline (8 GPUs, 1 Hz)",
    )
    ap.add_argument(
        "--clean-python",
        default="",
        metavar="EXE",
        help="an interpreter whose environment holds only hang-watchdog's dependencies (a "
        "venv): one more floor and 8x1 row run by it; httpx imports optional packages (trio, "
        "h2, click, rich, ...) whenever they are installed",
    )
    ap.add_argument(
        "--host-conns",
        type=int,
        default=0,
        metavar="N",
        help="hold N idle TCP connections open on 127.0.0.1 during the run (a busy host)",
    )
    ap.add_argument(
        "--tick-seconds",
        type=float,
        default=20.0,
        help="measured span of the per-tick breakdown at 8x1 (0: skip it)",
    )
    args = ap.parse_args()
    with host_connections(args.host_conns):
        if args.host_conns:
            print(f"{args.host_conns} idle loopback TCP connections held open on the host")
        run(args)


def run(args: argparse.Namespace) -> None:
    f_cpu, f_rss = floor(args.warmup, args.seconds)
    print(f"floor process (imports + the exporter's server): "
          f"{f_cpu * 100:.2f} % of a core, {f_rss:.1f} MiB RSS")  # fmt: skip
    print(f"{'GPUs':>5} {'ranks':>5} {'CPU % core':>11} {'RSS MiB':>8} {'CPU/floor':>10} "
          f"{'RSS/floor':>10}")  # fmt: skip
    for point in args.points.split(","):
        gpus, ranks = (int(x) for x in point.split("x"))
        cpu, rss = daemon_point(gpus, ranks, args.warmup, args.seconds)
        ratio = cpu / max(f_cpu, 1e-4)  # the floor can read 0 at /proc's 10 ms resolution
        print(f"{gpus:>5} {ranks:>5} {cpu * 100:>11.2f} {rss:>8.1f} {ratio:>10.1f} "
              f"{rss / f_rss:>10.2f}", flush=True)  # fmt: skip
    if args.clean_python:
        c_cpu, c_rss = floor(args.warmup, args.seconds, args.clean_python)
        cpu, rss = daemon_point(8, 1, args.warmup, args.seconds, args.clean_python)
        print(f"only hang-watchdog's dependencies installed ({args.clean_python}): floor "
              f"{c_cpu * 100:.2f} % of a core, {c_rss:.1f} MiB RSS")  # fmt: skip
        print(f"    8     1 {cpu * 100:>11.2f} {rss:>8.1f} {cpu / max(c_cpu, 1e-4):>10.1f} "
              f"{rss / c_rss:>10.2f}", flush=True)  # fmt: skip
    if args.tick_seconds > 0:
        tick_point(8, 1, args.warmup, args.tick_seconds)


if __name__ == "__main__":
    main()
