"""Checks `run` and `diagnose` make before watching: a target that cannot work is a usage
error (exit 2) now, with what to do, instead of a `dead` verdict or a traceback later."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from watchdog.config import Config

log = logging.getLogger("hang_watchdog.cli")


class TargetError(Exception):
    """What the operator gave cannot be watched; the message says what to do."""


def check_pid(pid: int | None, instead: str) -> None:
    """--pid must name a live process: watching it would only ever report `dead`."""
    import psutil

    if pid is not None and (pid <= 0 or not psutil.pid_exists(pid)):
        raise TargetError(f"no process with PID {pid}; check the PID or use {instead}")


def check_something(cfg: Config, *, supervise: bool) -> None:
    """At least one source or target; otherwise every tick would say `starting`."""
    if cfg.pid or cfg.match or cfg.systemd_unit or cfg.server_url or cfg.log_files:
        return
    if cfg.journal_unit or (supervise and cfg.command):
        return
    end = ", --log-file or `-- COMMAND`" if supervise else " or --log-file"
    raise TargetError(f"nothing to watch; give --pid, --match, --systemd-unit, --server-url{end}")


def check_log_files(paths: Sequence[str]) -> None:
    """A directory is never a log: FileFollower would wait for ever for it to become one."""
    for path in paths:
        if path != "-" and Path(path).is_dir():
            raise TargetError(
                f"--log-file {path} is a directory; give the server's log file "
                "(or - for standard input)"
            )


def check_command(argv: Sequence[str], which: Callable[[str], str | None] = shutil.which) -> None:
    """`run -- COMMAND`: the command must exist and be executable before anything starts."""
    if not argv:
        return
    name = argv[0]
    if "/" not in name:
        if which(name) is None:
            raise TargetError(
                f"cannot start {name!r}: no such command on PATH; install it, activate its "
                "environment, or give its full path after `--`"
            )
        return
    path = Path(name)
    if not path.exists():
        raise TargetError(f"cannot start {name!r}: no such file; check the path after `--`")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise TargetError(
            f"cannot start {name!r}: not an executable file; give the server's command "
            "after `--` (e.g. `-- vllm serve MODEL`)"
        )


def check_systemd_unit(
    unit: str | None, runner: Callable[[Sequence[str]], str] | None = None
) -> None:
    """--systemd-unit needs a working systemctl; its error is shown, never swallowed."""
    if not unit:
        return
    from watchdog.sources.procs import run_argv

    argv = ["systemctl", "show", "-p", "MainPID", "--value", unit]
    try:
        out = (runner or run_argv)(argv)
    except FileNotFoundError as exc:
        raise TargetError(
            f"--systemd-unit {unit}: cannot run systemctl ({exc.strerror or exc}); on a host "
            "without systemd use --pid or --match"
        ) from exc
    except subprocess.CalledProcessError as exc:
        said = " ".join((exc.stderr or exc.stdout or "").split()) or f"exit {exc.returncode}"
        raise TargetError(
            f"--systemd-unit {unit}: systemctl failed: {said}; check the unit name "
            "(`systemctl status UNIT`) or use --pid/--match"
        ) from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise TargetError(f"--systemd-unit {unit}: systemctl failed: {exc}") from exc
    if out.strip() in ("", "0"):
        log.warning("unit %s is not running (MainPID 0); waiting for it to start", unit)


def check_match(regex: str | None, *, wait: bool) -> None:
    """--match that finds nothing: `run` waits for the server, `diagnose` cannot sample it."""
    if not regex:
        return
    from watchdog.sources.procs import MatchTarget

    try:
        found = MatchTarget(regex).find()
    except ValueError as exc:
        raise TargetError(str(exc)) from exc
    if found is not None:
        return
    if not wait:
        raise TargetError(
            f"no process matches --match {regex!r}; compare it with `ps -eo args` "
            "(the server may not have started yet)"
        )
    log.warning("no process matches --match %r yet; waiting for the server to start", regex)
