"""Supervise mode (`run -- COMMAND ...`): the watchdog is the server's parent.

It launches the command in its own session (so the whole tree can be signalled), passes its
output through while reading it as the log source, and can stop and restart it with a
fallback's extra arguments and environment. The child is started with PR_SET_PDEATHSIG, so a
watchdog killed with SIGKILL takes its server with it instead of orphaning it under PID 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import BinaryIO, cast

import psutil

from watchdog.core.redact import redact_argv
from watchdog.core.state.window import OWN_PIPE
from watchdog.daemon.leftovers import report_leftovers
from watchdog.outputs.sdnotify import child_environ
from watchdog.sources.deadline import Worker
from watchdog.sources.logs.source import StreamReader
from watchdog.sources.logs.split import Block
from watchdog.sources.treetag import TAG_VAR, new_tag, tagged

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
        death_pattern: re.Pattern[str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("run --: no command given to supervise (e.g. run -- vllm serve MODEL)")
        self.argv = list(argv)
        # The server must not inherit NOTIFY_SOCKET and ping systemd as if it were the watchdog.
        self.env = child_environ(env if env is not None else os.environ)
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
        # A second stop signal: skip the rest of the grace and SIGKILL the tree at once.
        self.hurry = threading.Event()
        # Lines that say the engine died (the engine_dead signature's log pattern): vLLM can
        # exit 0 after its engine died (vllm #48966), which must not read as success.
        self.death_pattern = death_pattern
        self.engine_died = False
        # Set when the watchdog itself stops a running server (a stop signal): what it prints
        # while stopping (vLLM's API server logs EngineDeadError on SIGTERM) is not a death.
        self.stopped_by_us = False
        self._tag = ""
        self._held_blocks: list[Block] = []
        # PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process:
        # every start (restarts run in background threads) forks from this one long-lived thread.
        self._spawner: Worker | None = None

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
        if self.starts:  # what the old server left behind would fail the new one
            report_leftovers()
        if self._spawner is None:
            self._spawner = Worker("supervise-spawn")
        self._tag = new_tag()  # marks the whole tree, setsid and double forks included
        env = {**self.env, **self.extra_env, TAG_VAR: self._tag}
        try:
            self.popen = self._spawner.submit(lambda: _spawn(argv, env)).result()
        except OSError as exc:
            raise RuntimeError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        assert self.popen.stdout is not None and self.popen.stderr is not None
        readers = [
            # Popen's pipes are typed IO[bytes]; they are the binary files a reader wants.
            StreamReader(cast(BinaryIO, self.popen.stdout), OWN_PIPE, tee=self.tee_out),
            StreamReader(cast(BinaryIO, self.popen.stderr), OWN_PIPE, tee=self.tee_err),
        ]
        with self._readers_lock:
            self._retired.extend(self._readers)
            self._readers = readers
            self._held_blocks = []
        self.starts += 1
        self.engine_died = False
        log.info("started %s (pid %d)", " ".join(redact_argv(argv)), self.popen.pid)
        return self.popen.pid

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def exit_code(self, wait_output_s: float = 2.0) -> int:
        """The watchdog's exit code for a child that ended: its own code (128+N for signal N),
        but 1 when it exited 0 after its engine died, so `Restart=on-failure` restarts it."""
        code = self.returncode()
        if code is None:
            return 0
        code = code if code >= 0 else 128 - code
        with self._readers_lock:
            for r in self._readers:  # its last lines (the EngineDeadError) may still be in flight
                r.wait(wait_output_s)
            self._held_blocks.extend(self._blocks())
        if code == 0 and self.engine_died and not self.stopped_by_us:
            log.error("the server exited 0 after its engine died; reporting failure (exit 1)")
            return 1
        return code

    def current(self) -> subprocess.Popen[bytes] | None:
        return self.popen

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Stop the child's whole tree: SIGTERM, SIGKILL to whatever is left after `grace_s`.

        Returns the child's exit code; StopError when part of the tree survives SIGKILL.
        """
        with self._lock:
            return self._stop(grace_s)

    def shutdown(self, grace_s: float = 30.0) -> int | None:
        """Stop for good: a restart in flight cannot start the server again afterwards. Also
        after the server ended by itself: what it forked may still run (a grandchild that
        called setsid, or one a double fork left under PID 1) and goes with it."""
        self.closing = True
        if self.popen is not None and self.popen.poll() is None:
            self.stopped_by_us = True
        return self.stop(grace_s)

    def _stop(self, grace_s: float) -> int | None:
        child = self.popen
        if child is None:
            return None
        # Recorded before any signal: a worker that outlives its parent (vLLM's engine core
        # keeps the GPU memory) is reparented and no longer a descendant of the child.
        found = {p.pid: p for p in _tree(child.pid)}
        # The child itself is signalled through its group only: a second SIGTERM can land
        # while Python is exiting from the first, with the default action (death by SIGTERM).
        found.update((p.pid, p) for p in tagged(self._tag) if p.pid not in (*found, child.pid))
        tree = list(found.values())
        if child.poll() is not None and tree:
            pids = ", ".join(str(p.pid) for p in tree[:10])
            log.warning("the server (pid %d) has exited; stopping what it left running: pid %s",
                        child.pid, pids)  # fmt: skip
        if child.poll() is None or tree:
            _signal_tree(child.pid, tree, signal.SIGTERM)
        left = _wait_tree(child, tree, grace_s, self.hurry)
        if left is None:
            return child.returncode
        if self.hurry.is_set():
            log.warning("sending SIGKILL to %s now", left)
        else:
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
        out, self._held_blocks = self._held_blocks, []
        for r in self._readers:
            out.extend(r.read_blocks())
        if self.death_pattern is not None and not self.engine_died and not self.stopped_by_us:
            self.engine_died = any(
                self.death_pattern.search(b.data.decode("utf-8", "replace")) for b in out
            )
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
        if self._spawner is not None:
            self._spawner.stop()
            self._spawner = None


class SupervisedReader:
    """A block reader (logs.BlockReader) over whichever child is current."""

    name = OWN_PIPE

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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved before any fork (the child may only call it, not look it up)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Popen in its own session, set to receive SIGKILL when the spawning thread dies."""
    prctl, parent = _prctl(), os.getpid()

    def die_with_parent() -> None:
        # Runs in the forked child before exec: only async-signal-safe calls, nothing imported.
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the watchdog died between fork and prctl
            os._exit(1)

    return subprocess.Popen(  # argv, never a shell
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no locks taken; see die_with_parent
    )


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
    child: subprocess.Popen[bytes],
    tree: Sequence[psutil.Process],
    timeout_s: float,
    hurry: threading.Event | None = None,
) -> str | None:
    """Wait until the child (reaped) and every recorded process are gone, or `hurry` is set;
    what is left, if any."""
    end = time.monotonic() + timeout_s
    while True:
        alive = [p.pid for p in tree if _running(p)]
        if child.poll() is None:
            alive.insert(0, child.pid)
        if not alive:
            return None
        if time.monotonic() >= end or (hurry is not None and hurry.is_set()):
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
