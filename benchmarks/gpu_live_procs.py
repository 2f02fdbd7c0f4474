"""The processes benchmarks/gpu_live.py owns: each in its own group, all stopped at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

CHILD = Path(__file__).resolve().parent / "gpu_live_child.py"


class Procs:
    """Starts children in new sessions (own process groups) and stops every one it started."""

    def __init__(self) -> None:
        self._live: list[subprocess.Popen[Any]] = []
        self._files: list[IO[Any]] = []

    def start(self, argv: Sequence[str], stderr: Path | None = None) -> subprocess.Popen[Any]:
        err: Any = subprocess.DEVNULL
        if stderr is not None:
            err = stderr.open("ab")
            self._files.append(err)
        # CUDA's device 0 is NVML's GPU 0 only in PCI order (CUDA orders fastest-first).
        env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        self._live.append(proc)
        return proc

    def start_child(
        self, mode: str, log: Path, ready: Path, *, cpu: bool, extra: Sequence[str] = ()
    ) -> subprocess.Popen:
        argv = [sys.executable, str(CHILD), mode, "--log", str(log), "--ready", str(ready)]
        argv += [*extra, *(["--cpu"] if cpu else [])]
        return self.start(argv, log.with_suffix(".stderr"))

    def wait_ready(self, proc: subprocess.Popen[Any], ready: Path, timeout_s: float) -> dict:
        """The child's ready file, or an error saying why it never came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready.exists():
                time.sleep(0.5)  # let it enter its blocking call
                return dict(json.loads(ready.read_text()))
            if proc.poll() is not None:
                err = ready.with_suffix(".stderr")
                tail = err.read_text(errors="replace").strip()[-300:] if err.exists() else ""
                return {"error": f"exited {proc.returncode} before it was ready: {tail}"}
            time.sleep(0.2)
        return {"error": f"not ready within {timeout_s:.0f} s"}

    def run(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        """Run to completion in its own group; the group is killed when it overruns."""
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._live.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            out, err = proc.communicate()
            err += f"\n(killed after {timeout_s:.0f} s)"
        except BaseException:  # interrupted: stop it before it is forgotten
            self.stop(proc, grace_s=5.0)
            raise
        finally:
            self._forget(proc)
        return proc.returncode, out, err

    def stop(self, proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
        """SIGTERM to the whole group, SIGKILL after `grace_s`, then reap."""
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        _signal_group(proc.pid, signal.SIGKILL)  # the group may outlive its leader (NCCL ranks)
        if proc.poll() is None:
            proc.wait(timeout=grace_s)
        self._forget(proc)

    def stop_all(self) -> None:
        for proc in list(self._live):
            self.stop(proc, grace_s=5.0)
        for fh in self._files:
            fh.close()
        self._files.clear()

    def interrupted(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: unwind (the caller's `finally` stops every child)."""
        raise KeyboardInterrupt(f"signal {signum}")

    def _forget(self, proc: subprocess.Popen[Any]) -> None:
        if proc in self._live:
            self._live.remove(proc)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def find_pyspy() -> str | None:
    """py-spy on PATH, beside this Python, or in the user scheme's scripts (pip --user)."""
    found = shutil.which("py-spy")
    if found:
        return found
    dirs = [Path(sys.executable).parent]
    for scheme in (f"{os.name}_user", sysconfig.get_default_scheme()):
        try:
            dirs.append(Path(sysconfig.get_path("scripts", scheme)))
        except KeyError:
            continue
    return next((str(d / "py-spy") for d in dirs if (d / "py-spy").is_file()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> str | None:
    """The exporter's page, or None while it does not answer yet."""
    import httpx

    try:
        return httpx.get(url, timeout=2.0).text
    except httpx.HTTPError:
        return None
