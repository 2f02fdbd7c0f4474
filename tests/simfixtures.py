"""Start the simulated vLLM and the stand-in CDN from tests, and always clean them up.

`start_sim(tmp_path, scenario, ...)` runs `python -m watchdog.sim.vllm_sim` as a real process
tree with its log, GPU file and port under tmp_path; `SimHandle.stop()` kills the whole tree.
Fixtures `sim_factory` and `cdn_factory` wrap both and clean up after each test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from watchdog.sim.cdn import start_cdn

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SimHandle:
    """A running simulator: its process, files, port, and helpers to wait on its output."""

    process: subprocess.Popen[bytes]
    workdir: Path
    gpu_file: Path
    log_file: Path
    stdout_file: Path
    stderr_file: Path
    port: int | None = None
    _offset: int = field(default=0, repr=False)

    @property
    def pid(self) -> int:
        """PID of the top process (API server or bench CLI)."""
        return self.process.pid

    def log_text(self) -> str:
        """Everything the tree has written so far (stdout, stderr and flashinfer.jit)."""
        try:
            return self.log_file.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_line(self, regex: str, timeout: float = 30.0) -> re.Match[str]:
        """First log line (split on `\\n` and `\\r`) matching regex; AssertionError if none."""
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        while True:
            for line in re.split(r"[\r\n]", self.log_text()):
                match = pattern.search(line)
                if match:
                    return match
            if time.monotonic() > deadline:
                tail = self.log_text()[-2000:]
                raise AssertionError(f"no line matching {regex!r} within {timeout}s; tail:\n{tail}")
            time.sleep(0.1)

    def engine_pid(self, timeout: float = 30.0) -> int:
        """PID of the `VLLM::EngineCore` child."""
        return self.child_pid("VLLM::EngineCore", timeout)

    def child_pid(self, title: str, timeout: float = 30.0) -> int:
        """PID of the descendant whose command line carries `title`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for child in psutil.Process(self.pid).children(recursive=True):
                try:
                    if title in child.cmdline():
                        return child.pid
                except psutil.Error:
                    continue
            time.sleep(0.1)
        raise AssertionError(f"no child titled {title!r} under pid {self.pid}")

    def gpu_samples(self) -> list[str]:
        """Lines written to the GPU file so far."""
        try:
            return self.gpu_file.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        """Kill the whole tree (children first, then the top process) and reap it."""
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        psutil.wait_procs(procs, timeout=10)


def run_watchdog(
    *args: str, cwd: Path | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """`python -m watchdog ARGS` as a real process, run to completion; text output."""
    return subprocess.run(
        [sys.executable, "-m", "watchdog", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sim_env(),
        cwd=cwd or REPO_ROOT,
        check=False,
    )


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def sim_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a sim: ours plus `env`, with the repo importable."""
    out = dict(os.environ)
    out.update(env or {})
    old = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + old if old else "")
    return out


def start_sim(
    tmp_path: Path,
    scenario: str,
    mode: str = "bench",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_s: float = 1.0,
    timeout: float = 30.0,
) -> SimHandle:
    """Start `python -m watchdog.sim.vllm_sim`; in serve mode, wait until its port is known."""
    workdir = Path(tmp_path) / f"sim-{scenario}-{time.monotonic_ns()}"
    workdir.mkdir(parents=True)
    port_file = workdir / "port"
    handle_files = {
        "gpu_file": workdir / "gpu.jsonl",
        "log_file": workdir / "sim.log",
        "stdout_file": workdir / "stdout.txt",
        "stderr_file": workdir / "stderr.txt",
    }
    argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario]
    argv += ["--mode", mode, "--startup-s", str(startup_s), "--workdir", str(workdir)]
    argv += [
        "--gpu-file",
        str(handle_files["gpu_file"]),
        "--log-file",
        str(handle_files["log_file"]),
    ]
    argv += ["--port-file", str(port_file), *extra_args]
    with (
        open(handle_files["stdout_file"], "wb") as out,
        open(handle_files["stderr_file"], "wb") as err,
    ):
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=sim_env(env), cwd=workdir)
    handle = SimHandle(process=proc, workdir=workdir, **handle_files)
    if mode == "serve":
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                handle.stop()
                raise AssertionError(f"sim did not report a port: {handle.stderr_file.read_text()}")
            time.sleep(0.05)
        handle.port = int(port_file.read_text().strip())
    return handle


def start_cdn_thread(mode: str) -> tuple[int, Callable[[], None]]:
    """The stand-in CDN in this test process: (port, stop)."""
    return start_cdn(mode)


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[Callable[..., SimHandle]]:
    """`sim_factory(scenario, mode=..., extra_args=..., env=...)`; every sim is killed after."""
    handles: list[SimHandle] = []

    def factory(scenario: str, **kwargs: object) -> SimHandle:
        handle = start_sim(tmp_path, scenario, **kwargs)  # type: ignore[arg-type]
        handles.append(handle)
        return handle

    yield factory
    for handle in handles:
        handle.stop()


@pytest.fixture
def cdn_factory() -> Iterator[Callable[[str], int]]:
    """`cdn_factory(mode) -> port`; every CDN is stopped after the test."""
    stops: list[Callable[[], None]] = []

    def factory(mode: str) -> int:
        port, stop = start_cdn_thread(mode)
        stops.append(stop)
        return port

    yield factory
    for stop in stops:
        stop()


def watch_sources(sim: SimHandle) -> list[str]:
    """The watchdog flags that point it at every source of one simulated server."""
    return [
        "--pid", str(sim.pid), "--gpu-source", f"file:{sim.gpu_file}",
        "--log-file", str(sim.log_file), "--server-url", f"http://127.0.0.1:{sim.port}",
    ]  # fmt: skip


def state_events(stderr: str) -> list[dict[str, Any]]:
    """The `state` events of a watchdog run with `--log-format json`, in order."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "state":
                out.append(ev)
    return out
