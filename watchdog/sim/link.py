"""The API server's (or bench CLI's) side of the engine: spawn it, read its status pipe.

vLLM V1 runs the engine in a child process titled `VLLM::EngineCore`; the simulator does the
same and keeps the latest counters the engine reported, for /metrics, stats and the bar.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.sim.config import ROLE_ENGINE


@dataclass
class EngineState:
    """What the engine last reported (counters are cumulative)."""

    ready: bool = False
    finished: bool = False
    dead: bool = False
    prompt_tokens: int = 0
    gen_tokens: int = 0
    iterations: int = 0
    done: int = 0
    running: int = 0
    waiting: int = 0
    # As of the last batch that returned: SGLang writes its scheduler gauges when it reports a
    # batch (srt/managers/scheduler_components/metrics_reporter.py, after the forward), and
    # TensorRT-LLM's num_requests_running is an iteration-level metric (metrics/collector.py
    # @050f80de, from the stats of a finished iteration). A batch that never returns leaves them
    # at the previous values: the warm-up's 0 for the first one.
    batch_running: int = 0
    batch_waiting: int = 0


class EngineLink:
    """Owns the engine child process and the thread that reads its status lines."""

    def __init__(self, argv: Sequence[str], role: str = ROLE_ENGINE) -> None:
        self._argv = [a for a in argv]
        self._role = role
        self.state = EngineState()
        self.changed = threading.Condition()
        self.proc: subprocess.Popen[bytes] | None = None
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Spawn `python -m watchdog.sim.vllm_sim ... --role VLLM::EngineCore`."""
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "watchdog.sim.vllm_sim", *self._argv]
        cmd += ["--role", self._role, "--status-fd", str(write_fd)]
        self.proc = subprocess.Popen(cmd, pass_fds=(write_fd,))
        os.close(write_fd)
        reader = threading.Thread(target=self._read, args=(read_fd,), name="engine-status")
        reader.daemon = True
        reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as pipe:
            for line in pipe:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                self._apply(msg)
        if self.proc is not None:
            self.proc.wait()
        with self.changed:
            if not self.state.finished:
                self.state.dead = True  # pipe closed without "finished": the engine is gone
            self.changed.notify_all()

    def _apply(self, msg: dict[str, object]) -> None:
        with self.changed:
            st = self.state
            ev = msg.get("ev")
            st.ready = st.ready or ev in ("ready", "batch", "step", "finished")
            st.finished = st.finished or ev == "finished"
            st.dead = st.dead or ev == "dead"
            for name in ("prompt_tokens", "gen_tokens", "iterations", "done", "running", "waiting"):
                value = msg.get(name)
                if isinstance(value, int):
                    setattr(st, name, value)
            if ev in ("step", "finished"):
                st.batch_running, st.batch_waiting = st.running, st.waiting
            self.changed.notify_all()

    def wait_for(self, predicate: str, timeout: float | None = None) -> bool:
        """Block until `state.<predicate>` is true (or the engine is dead); returns it."""
        with self.changed:
            self.changed.wait_for(
                lambda: getattr(self.state, predicate) or self.state.dead, timeout
            )
            return bool(getattr(self.state, predicate))

    def spawn_child(self, role: str) -> None:
        """Another titled child of the API process (SGLang's detokenizer); dies with its parent."""
        cmd = [sys.executable, "-m", "watchdog.sim.vllm_sim", *self._argv, "--role", role]
        self.children.append(subprocess.Popen(cmd))

    def stop(self) -> None:
        """SIGTERM the engine (it stops its workers) and the other children, and reap them."""
        for child in self.children:
            child.terminate()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
