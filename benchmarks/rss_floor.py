"""The daemon's RSS above what any NVML reader pays: a figure that compares across hosts.

    python benchmarks/rss_floor.py [--seconds 12] [--gpu-source nvml]

The floor is a Python process that imports pynvml and calls nvmlInit() (libnvidia-ml.so mapped
and initialised): a bare Python measured 15.6 MB on a GPU host, `import pynvml` 32 MB and
`nvmlInit()` 50.5 MB, so the daemon's own RSS on such a host says little until that is taken
off. Where nvmlInit fails (no driver, a CPU host) the floor is Python + `import pynvml`, and the
line says which. The daemon is `hang-watchdog run` attached to an idle process with the given
GPU source (default `nvml`, as deployed; on a CPU host it imports pynvml, fails to initialise
and stays down), its log source, the exporter and the process tree on. Prints the numbers;
asserts nothing. benchmarks/gpu_live.py calls `measure()` on a GPU host.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
FLOOR = (
    "import sys, time, pynvml\n"
    "try:\n"
    "    pynvml.nvmlInit()\n"
    "    print('python + import pynvml + nvmlInit', flush=True)\n"
    "except pynvml.NVMLError as exc:\n"
    "    print(f'python + import pynvml (nvmlInit failed: {exc})', flush=True)\n"
    "time.sleep(3600)\n"
)
MIB = 1048576


@dataclass(frozen=True)
class RssFigures:
    """The floor's RSS and what it is, the daemon's RSS, and the difference (MiB)."""

    floor_mib: float
    floor_what: str
    daemon_mib: float
    gpu_source: str

    @property
    def above_mib(self) -> float:
        return self.daemon_mib - self.floor_mib

    def line(self) -> str:
        return (
            f"daemon RSS {self.daemon_mib:.1f} MiB (run, --gpu-source {self.gpu_source}); "
            f"floor {self.floor_mib:.1f} MiB ({self.floor_what}); "
            f"above the floor {self.above_mib:.1f} MiB"
        )


def floor(python: str = sys.executable, settle_s: float = 2.0) -> tuple[float, str]:
    """(RSS MiB, what it holds) of the floor process, once it has said what it loaded."""
    proc = subprocess.Popen([python, "-c", FLOOR], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        what = proc.stdout.readline().strip() or f"floor exited {proc.wait()}"
        time.sleep(settle_s)
        return psutil.Process(proc.pid).memory_info().rss / MIB, what
    finally:
        proc.kill()
        proc.wait()


def daemon(gpu_source: str, seconds: float, python: str = sys.executable) -> float:
    """RSS MiB of `hang-watchdog run` after `seconds`, attached to an idle sleeper."""
    with tempfile.TemporaryDirectory(prefix="rss-floor-") as tmp:
        log = Path(tmp) / "server.log"
        log.write_text("")
        sleeper = subprocess.Popen([python, "-c", "import time; time.sleep(3600)"])
        argv = [
            python, "-m", "watchdog", "run", "--pid", str(sleeper.pid), "--gpu-source", gpu_source,
            "--log-file", str(log), "--no-cdn-default", "--metrics-addr", "127.0.0.1:0",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(seconds)
            if run.poll() is not None:
                raise RuntimeError(f"hang-watchdog run exited {run.returncode}")
            return psutil.Process(run.pid).memory_info().rss / MIB
        finally:
            for p in (run, sleeper):
                p.kill()
                p.wait()


def measure(gpu_source: str = "nvml", seconds: float = 12.0) -> RssFigures:
    rss, what = floor()
    return RssFigures(rss, what, daemon(gpu_source, seconds), gpu_source)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=12.0, help="daemon run time before reading")
    p.add_argument("--gpu-source", default="nvml")
    args = p.parse_args(argv)
    print(measure(args.gpu_source, args.seconds).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
