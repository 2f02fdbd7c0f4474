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
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from watchdog.sources.logs import StreamReader

log = logging.getLogger("hang_watchdog.supervise")


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

    def start(
        self, extra_args: Sequence[str] = (), extra_env: Mapping[str, str] | None = None
    ) -> int:
        """Launch the command (plus a fallback's arguments and environment); returns its PID."""
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
        self._retired.extend(self._readers)
        self._readers = [
            StreamReader(self.popen.stdout, "child", tee=self.tee_out),
            StreamReader(self.popen.stderr, "child", tee=self.tee_err),
        ]
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
        """SIGTERM the child's process group, SIGKILL after `grace_s`; returns its exit code."""
        child = self.popen
        if child is None or child.poll() is not None:
            return None if child is None else child.returncode
        _signal_group(child.pid, signal.SIGTERM)
        try:
            return child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("pid %d ignored SIGTERM for %.0f s; sending SIGKILL", child.pid, grace_s)
            _signal_group(child.pid, signal.SIGKILL)
            return child.wait(timeout=10)

    def partials(self) -> list[str]:
        """The current child's unterminated last lines (a frozen tqdm bar)."""
        return [p for r in self._readers for p in r.partials()]

    def reader(self) -> SupervisedReader:
        return SupervisedReader(self)

    def lines(self) -> list[str]:
        # What a stopped child still prints (its API server logs EngineDeadError on SIGTERM)
        # describes the old server, not the restarted one: drain it, do not report it.
        for r in self._retired:
            r.read()
        self._retired = [r for r in self._retired if not r.eof]
        out: list[str] = []
        for r in self._readers:
            out.extend(r.read())
        return out

    def close(self) -> None:
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

    def partials(self) -> list[str]:
        return self._sup.partials()

    def close(self) -> None:
        self._sup.close()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
