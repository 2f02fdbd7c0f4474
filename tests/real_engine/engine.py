"""A real vLLM (CPU build) for the real-engine tier: started, loaded, hung from inside, stopped.

The server runs in its own venv (tests/real_engine/install.sh) with a tiny random Llama made at
test time; hangs come from `plugin/hw_hang_plugin.py`, which vLLM loads itself through its
`vllm.general_plugins` entry point group. Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PLUGIN = HERE / "plugin" / "hw_hang_plugin.py"
# vLLM 0.32 on 2 cores: about 30 s when idle, several minutes when the host is busy.
READY_S = float(os.environ.get("HANG_WATCHDOG_REAL_ENGINE_READY_S", "420"))

# What the CPU build needs here: a small KV cache (GiB), no hub, and on a one-NUMA-node host an
# explicit core per rank (the automatic binding refuses it). Eager mode unless a test asks for
# vLLM's default (torch.compile at startup); the dtype is the one `choose_dtype` found serving.
BASE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
    "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plugin_site(root: Path) -> Path:
    """A sys.path folder holding the plugin and the dist-info that registers its entry point."""
    site = root / "plugin-site"
    info = site / "hw_hang_plugin-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (site / PLUGIN.name).write_text(PLUGIN.read_text())
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hw-hang-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nhw_hang = hw_hang_plugin:register\n"
    )
    return site


def make_model(python: str, out: Path) -> Path:
    """The tiny random Llama and its tokenizer, made by the real-engine venv's transformers."""
    if not (out / "config.json").exists():
        subprocess.run(
            [python, str(HERE / "make_model.py"), str(out)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return out


def http(url: str, body: Mapping[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, str]:
    """(status, text) of a GET (or a JSON POST); status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback only)
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


@dataclass
class Hang:
    """What the plugin does, and where it says when."""

    mode: str = ""
    rank: int = 0
    load_s: float = 60.0
    trigger: Path | None = None

    def env(self, work: Path) -> dict[str, str]:
        out = {"HW_HANG_ONSET": str(work / "onset"), "HW_HANG_CONFIG": str(work / "config")}
        if self.mode:
            out.update({"HW_HANG": self.mode, "HW_HANG_RANK": str(self.rank)})
            out["HW_HANG_LOAD_S"] = str(self.load_s)
        if self.trigger is not None:
            out["HW_HANG_TRIGGER"] = str(self.trigger)
        return out


@dataclass
class VllmServer:
    """One real vLLM OpenAI server; `argv` and `env` are what it was started with."""

    python: str
    model: Path
    work: Path
    site: Path
    hang: Hang = field(default_factory=Hang)
    tp: int = 1
    extra_env: Mapping[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    dtype: str = "float32"
    eager: bool = True
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.work / "vllm.log"

    @property
    def onset_file(self) -> Path:
        return self.work / "onset"

    def argv(self) -> list[str]:
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)]
        argv += ["--served-model-name", "tiny", "--max-model-len", "512"]
        argv += ["--enforce-eager"] if self.eager else []
        argv += ["--dtype", self.dtype, "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--max-num-seqs", "16"]
        if self.tp > 1:
            argv += ["--tensor-parallel-size", str(self.tp)]
        return [*argv, *self.extra_args]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST"))}
        env.update(BASE_ENV)
        # A compile cache of this server's own: a compile-mode start is a cold one.
        env["VLLM_CACHE_ROOT"] = str(self.work / "vllm-cache")
        env["PYTHONPATH"] = str(self.site)
        # One core per rank: vLLM's CPU worker binds its OpenMP threads to these.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % os.cpu_count()) for i in range(self.tp))  # type: ignore[operator]
        env.update(self.hang.env(self.work))
        env.update(self.extra_env)
        return env

    def start(self) -> VllmServer:
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.work,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, timeout: float = READY_S) -> float:
        """Seconds until /health answered 200 and a completion came back."""
        t0 = time.monotonic()
        end = t0 + timeout
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited {self.proc.returncode}:\n{self.tail()}")
            if http(self.url + "/health", timeout=2)[0] == 200:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise AssertionError(f"vLLM not ready within {timeout:.0f} s:\n{self.tail()}")

    def complete(self, max_tokens: int = 8, timeout: float = 60.0) -> tuple[int, str]:
        body = {"model": "tiny", "prompt": "Hello world", "max_tokens": max_tokens}
        return http(self.url + "/v1/completions", {**body, "temperature": 0}, timeout=timeout)

    def process(self, title: str, timeout: float = 60.0) -> psutil.Process:
        """The first descendant whose command line (vLLM's process title) contains `title`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for child in psutil.Process(self.pid).children(recursive=True):
                try:
                    if title in " ".join(child.cmdline()):
                        return child
                except psutil.Error:
                    continue
            time.sleep(0.2)
        raise AssertionError(f"no process titled {title!r} under pid {self.pid}")

    def onset(self, timeout: float = 120.0) -> float:
        """Wall time the plugin wrote when the hang began."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.onset_file.exists():
                return float(self.onset_file.read_text())
            time.sleep(0.1)
        raise AssertionError(f"the hang never began:\n{self.tail()}")

    def configs(self) -> list[dict[str, Any]]:
        """The attention config each process resolved, as the plugin recorded it."""
        return [json.loads(p.read_text()) for p in sorted(self.work.glob("config.*.json"))]

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        stop_group(self.proc)


def stop_group(proc: subprocess.Popen[Any] | None, grace_s: float = 20.0) -> None:
    """SIGTERM to the process group, SIGKILL what is left after `grace_s` (and SIGCONT first:
    a stopped process cannot act on SIGTERM)."""
    if proc is None:
        return
    try:
        members = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        members = []
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    for p in members:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    psutil.wait_procs(members, timeout=10)


class Load:
    """`clients` threads sending short completions until stopped; counts what came back."""

    def __init__(self, url: str, clients: int = 8, max_tokens: int = 16) -> None:
        self.url, self.clients, self.max_tokens = url, clients, max_tokens
        self.ok = self.failed = self.tokens = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            for i in range(clients)
        ]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": self.max_tokens}
        body.update({"temperature": 0, "ignore_eos": True})
        while not self._stop.is_set():
            status, text = http(self.url + "/v1/completions", body, timeout=30)
            with self._lock:
                if status == 200:
                    self.ok += 1
                    self.tokens += _tokens(text)
                else:
                    self.failed += 1
            if status != 200:
                self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35)


def _tokens(text: str) -> int:
    try:
        return int(json.loads(text)["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


def wait_until(check: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """The first truthy value of `check()` within `timeout` s; AssertionError naming `what`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
