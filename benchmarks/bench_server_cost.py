"""What the watchdog costs the server: a real vLLM's token throughput under a fixed load with
the watchdog attached (default settings) against without, side by side in one run, and the dip
while the server's stacks are dumped (prints numbers and ratios; asserts nothing).

The server is the real-engine tier's vLLM 0.32 CPU build with its tiny model
(tests/real_engine/install.sh). Phases of --phase-s seconds each, in this order so that drift
shows: without, with, without, with. The capture drill then runs the watchdog's own
StackCapturer (py-spy, both dumps, default deadlines) on every server process, --captures times
under the same load, and compares the throughput of the seconds it ran with the steady phases.

On a 2-core machine the server, the load, the watchdog and py-spy share both cores, so the
figures are an upper bound on what a watchdog costs a GPU server, whose work is on the GPU.

Run: python3 benchmarks/bench_server_cost.py [--phase-s 60] [--clients 8] [--captures 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.real_engine.engine import (  # noqa: E402
    HERE,
    Load,
    VllmServer,
    make_model,
    plugin_site,
    stop_group,
)
from watchdog.core.model import ProcInfo  # noqa: E402
from watchdog.sources.stacks.capture import StackCapturer  # noqa: E402


def real_python() -> str:
    out = subprocess.run([str(HERE / "install.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def tokens_per_s(load: Load, seconds: float) -> float:
    before = load.tokens
    time.sleep(seconds)
    return (load.tokens - before) / seconds


def watchdog(server: VllmServer, work: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "watchdog", "run", "--pid", str(server.pid)]
    argv += ["--log-file", str(server.log_file), "--server-url", server.url]
    argv += ["--gpu-source", "none", "--no-cdn-default", "--metrics-addr", "127.0.0.1:0"]
    argv += ["--incident-dir", str(work / "incidents"), "--state-dir", str(work / "state")]
    with open(work / "watchdog.stderr", "ab") as err:
        return subprocess.Popen(argv, stderr=err, cwd=REPO, start_new_session=True)


def server_procs(server: VllmServer) -> list[ProcInfo]:
    import psutil

    root = psutil.Process(server.pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            out.append(
                ProcInfo(pid=p.pid, ppid=p.ppid(), name=p.name(), title=" ".join(p.cmdline()))
            )
        except psutil.Error:
            continue
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--phase-s", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--captures", type=int, default=5)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-server-cost-"))
    python = real_python()
    model = make_model(python, work / "model")
    server = VllmServer(python, model, work / "vllm", plugin_site(work)).start()
    wd = None
    try:
        ready = server.wait_ready()
        print(f"vLLM ready in {ready:.0f} s; {args.clients} clients, {args.phase_s:.0f} s phases")
        load = Load(server.url, clients=args.clients, max_tokens=32).start()
        tokens_per_s(load, 20)  # warm-up
        without: list[float] = []
        with_wd: list[float] = []
        for phase in ("without", "with", "without", "with"):
            if phase == "with":
                wd = watchdog(server, work)
                time.sleep(5)  # attached, first facts and scrapes done
            rate = tokens_per_s(load, args.phase_s)
            (with_wd if phase == "with" else without).append(rate)
            print(f"  {phase:8s} watchdog: {rate:8.1f} tokens/s")
            if wd is not None:
                stop_group(wd)
                wd = None
        base, attached = statistics.mean(without), statistics.mean(with_wd)
        print(f"steady: without {base:.1f} tokens/s, with {attached:.1f} tokens/s: "
              f"{100 * (1 - attached / base):+.2f} % lost (goal <= 1 %)")  # fmt: skip
        capturer = StackCapturer()
        dips = []
        for i in range(args.captures):
            before = load.tokens
            t0 = time.monotonic()
            result = capturer.capture_now(server_procs(server))
            took = time.monotonic() - t0
            rate = (load.tokens - before) / took
            dips.append(rate)
            print(
                f"  capture {i + 1}: {took:.1f} s ({result.result}), {rate:.1f} tokens/s meanwhile"
            )
            tokens_per_s(load, 5)
        dip = statistics.mean(dips)
        print(f"during a capture: {dip:.1f} tokens/s, {100 * (1 - dip / base):.1f} % below steady")
        load.stop()
    finally:
        stop_group(wd)
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
