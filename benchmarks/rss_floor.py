"""The daemon's RSS above what any NVML reader pays: a figure that compares across hosts.

    python benchmarks/rss_floor.py [--seconds 12] [--gpu-source nvml] [--server-url both|off|on]
                                   [--no-hyperscan]

The floor is a Python process that imports pynvml and calls nvmlInit() (libnvidia-ml.so mapped
and initialised): a bare Python measured 15.6 MB on a GPU host, `import pynvml` 32 MB and
`nvmlInit()` 50.5 MB, so the daemon's own RSS on such a host says little until that is taken
off. Where nvmlInit fails (no driver, a CPU host) the floor is Python + `import pynvml`, and the
line says which. The daemon is `hang-watchdog run` attached to an idle process with the given
GPU source (default `nvml`, as deployed; on a CPU host it imports pynvml, fails to initialise
and stays down), its log source, the exporter and the process tree on; with `server_url` (set
in the shipped systemd and Kubernetes configs) it also scrapes /metrics and /health every tick
from a loopback HTTP server this benchmark starts, serving a vLLM page from tests/data. By
default both daemons are measured, one line each. `--no-hyperscan` hides the Hyperscan binding
from the daemon (its log prefilter then runs on bytes.find), as on an install without the wheel.
The package's .pyc files are written first, as an installed wheel has them (a daemon that
compiles its modules from source at start keeps about 0.5 MiB more). RSS is read after
`--seconds`, then again every 2 s until two readings agree within 0.2 MiB (a loaded host starts
slower). Prints the numbers; asserts nothing. benchmarks/gpu_live.py calls `measure()` on a
GPU host.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    server_url: bool = False
    hyperscan: bool = True

    @property
    def above_mib(self) -> float:
        return self.daemon_mib - self.floor_mib

    def line(self) -> str:
        return (
            f"daemon RSS {self.daemon_mib:.1f} MiB (run, --gpu-source {self.gpu_source}"
            f"{', --server-url' if self.server_url else ''}"
            f"{'' if self.hyperscan else ', Hyperscan hidden'}); "
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


PAGE = (REPO / "tests" / "data" / "vllm_metrics_serving.txt").read_bytes()


class _Vllm(BaseHTTPRequestHandler):
    """vLLM's /metrics (a recorded page) and /health (200, empty), keep-alive."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        body = PAGE if self.path == "/metrics" else b""
        self.send_response(200 if self.path in ("/metrics", "/health") else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def vllm_server() -> Iterator[str]:
    """A loopback HTTP server answering as vLLM's /metrics and /health; yields its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def daemon(
    gpu_source: str,
    seconds: float,
    python: str = sys.executable,
    server_url: str | None = None,
    hyperscan: bool = True,
) -> float:
    """RSS MiB of `hang-watchdog run` once settled, `seconds` at least, attached to an idle
    sleeper (and scraping `server_url` when given)."""
    compileall.compile_dir(REPO / "watchdog", quiet=1)
    with tempfile.TemporaryDirectory(prefix="rss-floor-") as tmp:
        log = Path(tmp) / "server.log"
        log.write_text("")
        sleeper = subprocess.Popen([python, "-c", "import time; time.sleep(3600)"])
        argv = [
            python, "-m", "watchdog", "run", "--pid", str(sleeper.pid), "--gpu-source", gpu_source,
            "--log-file", str(log), "--no-cdn-default", "--metrics-addr", "127.0.0.1:0",
        ]  # fmt: skip
        if server_url is not None:
            argv += ["--server-url", server_url]
        path = str(REPO)
        if not hyperscan:  # found first on the path: `import hyperscan` fails as if not installed
            hide = Path(tmp) / "hide"
            hide.mkdir()
            (hide / "hyperscan.py").write_text("raise ImportError('hidden by rss_floor')\n")
            path = f"{hide}{os.pathsep}{path}"
        env = {**os.environ, "PYTHONPATH": path}
        run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(seconds)
            last = -1.0
            for _ in range(15):
                if run.poll() is not None:
                    raise RuntimeError(f"hang-watchdog run exited {run.returncode}")
                rss = psutil.Process(run.pid).memory_info().rss / MIB
                if abs(rss - last) <= 0.2:
                    break
                last = rss
                time.sleep(2.0)
            return rss
        finally:
            for p in (run, sleeper):
                p.kill()
                p.wait()


def measure(
    gpu_source: str = "nvml",
    seconds: float = 12.0,
    server_url: bool = False,
    hyperscan: bool = True,
) -> RssFigures:
    rss, what = floor()
    if not server_url:
        got = daemon(gpu_source, seconds, hyperscan=hyperscan)
        return RssFigures(rss, what, got, gpu_source, False, hyperscan)
    with vllm_server() as url:
        got = daemon(gpu_source, seconds, server_url=url, hyperscan=hyperscan)
        return RssFigures(rss, what, got, gpu_source, True, hyperscan)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=12.0, help="daemon run time before reading")
    p.add_argument("--gpu-source", default="nvml")
    p.add_argument(
        "--server-url",
        choices=("both", "off", "on"),
        default="both",
        help="measure the daemon without server_url, with it (a loopback vLLM), or both",
    )
    p.add_argument("--no-hyperscan", action="store_true", help="hide the Hyperscan binding")
    args = p.parse_args(argv)
    for with_url in {"both": (False, True), "off": (False,), "on": (True,)}[args.server_url]:
        figures = measure(args.gpu_source, args.seconds, with_url, not args.no_hyperscan)
        print(figures.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
