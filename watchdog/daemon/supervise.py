"""Supervise mode (`run -- COMMAND ...`): the watchdog is the server's parent.

It launches the command in its own session (so the whole tree can be signalled), passes its
output through while reading it as the log source, and can stop and restart it with a
fallback's extra arguments and environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

import psutil

from watchdog.sources.linesplit import Block
from watchdog.sources.logs import StreamReader

log = logging.getLogger("hang_watchdog.supervise")


class StopError(RuntimeError):
    """Part of the server's process tree survived SIGKILL; the message names the pids."""


class Supervisor:
    """Owns the supervised child; `reader()` follows it across restarts."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        tee_out: BinaryIO | None = None,
        tee_err: BinaryIO | None = None,
    ) -> None:
        if not argv:
            raise ValueError("run --: no command given to supervise (e.g. run -- vllm serve MODEL)")
        self.argv = list(argv)
        self.env = dict(env if env is not None else os.environ)
        self.tee_out = tee_out if tee_out is not None else sys.stdout.buffer
        self.tee_err = tee_err if tee_err is not None else sys.stderr.buffer
        self.popen: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = []
        self.extra_env: dict[str, str] = {}
        self.starts = 0
        self._readers: list[StreamReader] = []
        self._retired: list[StreamReader] = []
        self._dropped_gone = 0  # lines dropped by readers of children that are gone
        # A restart runs in a background thread while a signal may shut everything down: one
        # lock for start/stop (held through a stop's grace), and once closing no start may
        # follow. The loop's reads take only the short readers lock, never waiting on a stop.
        self._lock = threading.RLock()
        self._readers_lock = threading.Lock()
        self.closing = False

    def start(
        self, extra_args: Sequence[str] = (), extra_env: Mapping[str, str] | None = None
    ) -> int:
        """Launch the command (plus a fallback's arguments and environment); returns its PID."""
        with self._lock:
            if self.closing:
                raise RuntimeError("the watchdog is shutting down; the server is not started again")
            return self._start(extra_args, extra_env)

    def _start(self, extra_args: Sequence[str], extra_env: Mapping[str, str] | None) -> int:
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        argv = self.argv + [a for a in self.extra_args if a not in self.argv]
        try:
            self.popen = subprocess.Popen(  # argv, never a shell
                argv,
                env={**self.env, **self.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise RuntimeError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        assert self.popen.stdout is not None and self.popen.stderr is not None
        readers = [
            StreamReader(self.popen.stdout, "child", tee=self.tee_out),
            StreamReader(self.popen.stderr, "child", tee=self.tee_err),
        ]
        with self._readers_lock:
            self._retired.extend(self._readers)
            self._readers = readers
        self.starts += 1
        log.info("started %s (pid %d)", " ".join(argv), self.popen.pid)
        return self.popen.pid

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def current(self) -> subprocess.Popen[bytes] | None:
        return self.popen

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Stop the child's whole tree: SIGTERM, SIGKILL to whatever is left after `grace_s`.

        Returns the child's exit code; StopError when part of the tree survives SIGKILL.
        """
        with self._lock:
            return self._stop(grace_s)

    def shutdown(self, grace_s: float = 30.0) -> int | None:
        """Stop for good: a restart in flight cannot start the server again afterwards."""
        self.closing = True
        return self.stop(grace_s)

    def _stop(self, grace_s: float) -> int | None:
        child = self.popen
        if child is None:
            return None
        # Recorded before any signal: a worker that outlives its parent (vLLM's engine core
        # keeps the GPU memory) is reparented and no longer a descendant of the child.
        tree = _tree(child.pid)
        if child.poll() is None or tree:
            _signal_tree(child.pid, tree, signal.SIGTERM)
        left = _wait_tree(child, tree, grace_s)
        if left is None:
            return child.returncode
        log.warning("%s ignored SIGTERM for %.0f s; sending SIGKILL", left, grace_s)
        _signal_tree(child.pid, tree, signal.SIGKILL)
        left = _wait_tree(child, tree, 10.0)
        if left is not None:
            raise StopError(f"{left} survived SIGKILL (stuck in the kernel: the GPU driver?)")
        return child.returncode

    def partials(self) -> list[str]:
        """The current child's unterminated last lines (a frozen tqdm bar)."""
        with self._readers_lock:
            return [p for r in self._readers for p in r.partials()]

    def reader(self) -> SupervisedReader:
        return SupervisedReader(self)

    def lines(self) -> list[str]:
        # What a stopped child still prints (its API server logs EngineDeadError on SIGTERM)
        # describes the old server, not the restarted one: drain it, do not report it.
        with self._readers_lock:
            return self._lines()

    def _lines(self) -> list[str]:
        return [line for block in self._blocks() for line in block.lines()]

    def blocks(self) -> list[Block]:
        """The current child's new output as line blocks (the log source's block path)."""
        with self._readers_lock:
            return self._blocks()

    def _blocks(self) -> list[Block]:
        for r in self._retired:
            r.read_blocks()
        self._dropped_gone += sum(r.dropped for r in self._retired if r.eof)
        self._retired = [r for r in self._retired if not r.eof]
        out: list[Block] = []
        for r in self._readers:
            out.extend(r.read_blocks())
        return out

    @property
    def dropped(self) -> int:
        """Lines every child reader so far dropped because the loop fell behind."""
        with self._readers_lock:
            return self._dropped_gone + sum(r.dropped for r in self._retired + self._readers)

    def close(self) -> None:
        with self._readers_lock:
            for r in self._retired + self._readers:
                r.close()


class SupervisedReader:
    """A LineReader over whichever child is current."""

    name = "child"

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup
        self.error: str | None = None

    def read(self) -> list[str]:
        return self._sup.lines()

    def read_blocks(self) -> list[Block]:
        return self._sup.blocks()

    @property
    def dropped(self) -> int:
        return self._sup.dropped

    def partials(self) -> list[str]:
        return self._sup.partials()

    def close(self) -> None:
        self._sup.close()


def _tree(pid: int) -> list[psutil.Process]:
    """The child's descendants and the rest of its process group (its id is the child's pid,
    since the child leads its own session); found by scanning, as the leader may be gone."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process(pid).children(recursive=True))
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid in (pid, os.getpid()):
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(proc.pid) == pid:
                found[proc.pid] = proc
    return list(found.values())


def _signal_tree(pid: int, tree: Sequence[psutil.Process], sig: signal.Signals) -> None:
    """Signal the group, then each recorded process (one may have left the group)."""
    _signal_group(pid, sig)
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil refuses a pid that was reused meanwhile


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_tree(
    child: subprocess.Popen[bytes], tree: Sequence[psutil.Process], timeout_s: float
) -> str | None:
    """Wait until the child (reaped) and every recorded process are gone; what is left, if any."""
    end = time.monotonic() + timeout_s
    while True:
        alive = [p.pid for p in tree if _running(p)]
        if child.poll() is None:
            alive.insert(0, child.pid)
        if not alive:
            return None
        if time.monotonic() >= end:
            return f"pid{'s' if len(alive) > 1 else ''} {', '.join(map(str, alive))}"
        time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
