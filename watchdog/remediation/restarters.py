"""One restarter per deployment shape: supervise (we are the parent), systemd, kubernetes, command.

Each `restart(plan, target_pid)` blocks (stop grace, `systemctl restart`), so the hook runs it
in a background thread; it returns a one-line description or raises RestartError.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

from watchdog.config import ConfigError
from watchdog.remediation.plan import Plan
from watchdog.remediation.settings import RemediationConfig
from watchdog.remediation.state import atomic_write

log = logging.getLogger("hang_watchdog.remediation")

# Engine-neutral names (HANG_WATCHDOG_ARGS is taken: the watchdog's own unit's arguments, in
# systemd/hang-watchdog.env). The vLLM-era names are written too, with the same value, so a
# unit or entrypoint that still reads `$VLLM_WATCHDOG_ARGS` keeps working (for one release).
ARGS_VARIABLE = "HANG_WATCHDOG_FALLBACK_ARGS"
FALLBACK_VARIABLE = "HANG_WATCHDOG_FALLBACKS"
OLD_ARGS_VARIABLE = "VLLM_WATCHDOG_ARGS"
OLD_FALLBACK_VARIABLE = "VLLM_WATCHDOG_FALLBACK"


class RestartError(RuntimeError):
    """The restart could not be carried out; the message says what failed."""


class Restarter(Protocol):
    """Restarts the server with a plan's arguments and environment."""

    name: str

    @property
    def env_file(self) -> str | None:
        """The fallback file it writes (None: it writes none)."""
        ...

    def restart(self, plan: Plan, target_pid: int | None) -> str: ...


def env_file_text(args: Sequence[str], env: Mapping[str, str], fallbacks: Sequence[str]) -> str:
    """EnvironmentFile content: systemd reads it, and so can `set -a; . FILE` in an entrypoint.

    Values are checked by plan.check_safe, so they need no quoting in either reader.
    """
    names, flags = ",".join(fallbacks), " ".join(args)
    lines = [
        "# written by hang-watchdog remediation; `hang-watchdog fallback clear` resets it",
        f"{FALLBACK_VARIABLE}={names}",
        f'{ARGS_VARIABLE}="{flags}"',
        f"# {OLD_ARGS_VARIABLE} and {OLD_FALLBACK_VARIABLE}: the old names, for units not yet "
        f"updated to ${ARGS_VARIABLE}",
        f"{OLD_FALLBACK_VARIABLE}={names}",
        f'{OLD_ARGS_VARIABLE}="{flags}"',
    ]
    lines += [f"{k}={v}" for k, v in sorted(env.items())]
    return "\n".join(lines) + "\n"


def write_env_file(path: str | Path, plan: Plan | None) -> Path:
    """Write the fallback file for `plan` (None: an empty fallback) atomically."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if plan is None:
            text = env_file_text((), {}, ())
        else:
            text = env_file_text(plan.args, plan.env, plan.active)
        atomic_write(target, text)
    except OSError as exc:
        raise RestartError(
            f"cannot write the fallback file {target}: {exc.strerror or exc}"
        ) from exc
    return target


class Supervised(Protocol):
    """The child the watchdog supervises (daemon/supervise.py Supervisor)."""

    argv: list[str]
    env: dict[str, str]

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Stop the whole tree; RuntimeError (StopError) when it survives."""
        ...

    def start(
        self, extra_args: Sequence[str] = (), extra_env: Mapping[str, str] | None = None
    ) -> int:
        """Start it again; RuntimeError when it cannot be started."""
        ...


EnvFilter = Callable[[Mapping[str, str]], dict[str, str]]


class SuperviseRestarter:
    """`run -- COMMAND`: stop the child's whole tree, start it again with the fallback."""

    name = "supervise"
    env_file: str | None = None  # the watchdog applies the fallback itself

    def __init__(self, supervisor: Supervised, grace_s: float, child_env: EnvFilter) -> None:
        self.sup = supervisor
        self.grace_s = grace_s
        # vLLM must not inherit NOTIFY_SOCKET and ping systemd as if it were the watchdog:
        # `child_env` is outputs/sdnotify.py child_environ, passed in by the wiring.
        self.sup.env = child_env(self.sup.env)
        self.base_argv = list(self.sup.argv)
        self.base_env = dict(self.sup.env)

    def apply_at_start(self, active: Mapping[str, Any] | None) -> None:
        """Make the first start (by the CLI) carry the fallback that is still active."""
        if not active:
            return
        self.sup.argv = self.base_argv + [
            a for a in active.get("args") or [] if a not in self.base_argv
        ]
        self.sup.env = {**self.base_env, **dict(active.get("env") or {})}

    def restart(self, plan: Plan, target_pid: int | None) -> str:
        try:
            code = self.sup.stop(self.grace_s)  # the whole tree, workers included
        except RuntimeError as exc:  # the supervisor's StopError: part of the tree survived
            raise RestartError(str(exc)) from exc
        self.sup.argv, self.sup.env = list(self.base_argv), dict(self.base_env)
        try:
            pid = self.sup.start(plan.args, plan.env)
        except RuntimeError as exc:
            raise RestartError(str(exc)) from exc
        return f"stopped the server (exit {code}) and started it again as pid {pid}"


class SystemdRestarter:
    """Write the EnvironmentFile the vLLM unit reads, then `systemctl restart UNIT` (argv)."""

    name = "systemd"

    def __init__(
        self, unit: str, env_file: str, *, systemctl: str = "systemctl", timeout_s: float = 120.0
    ) -> None:
        self.unit, self.env_file = unit, env_file
        self.systemctl, self.timeout_s = systemctl, timeout_s

    def restart(self, plan: Plan, target_pid: int | None) -> str:
        path = write_env_file(self.env_file, plan)
        argv = [self.systemctl, "restart", self.unit]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RestartError(f"{' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            raise RestartError(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}"
            )
        return f"wrote {path} and ran {' '.join(argv)}"


class KubernetesRestarter:
    """Sidecar: write the file into the shared volume, then end vLLM's main process so the
    kubelet restarts the container (SIGTERM, SIGKILL after the grace)."""

    name = "kubernetes"

    def __init__(self, env_file: str, grace_s: float, *, poll_s: float = 0.1) -> None:
        self.env_file, self.grace_s, self.poll_s = env_file, grace_s, poll_s

    def restart(self, plan: Plan, target_pid: int | None) -> str:
        path = write_env_file(self.env_file, plan)
        if target_pid is None:
            raise RestartError(f"wrote {path} but found no server process to terminate")
        how = terminate(target_pid, self.grace_s, self.poll_s)
        return f"wrote {path}; pid {target_pid} {how}"


def terminate(pid: int, grace_s: float, poll_s: float = 0.1) -> str:
    """SIGTERM `pid`, SIGKILL after `grace_s` if it is still there; says which ended it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "was already gone"
    except PermissionError as exc:
        raise RestartError(
            f"not allowed to signal pid {pid}: run as its user or with CAP_KILL"
        ) from exc
    if _wait_gone(pid, grace_s, poll_s):
        return "exited on SIGTERM"
    log.warning("pid %d ignored SIGTERM for %.0f s; sending SIGKILL", pid, grace_s)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "exited on SIGTERM"
    if not _wait_gone(pid, 10.0, poll_s):
        raise RestartError(f"pid {pid} survived SIGKILL (stuck in the kernel?)")
    return f"ignored SIGTERM for {grace_s:.0f} s and was killed"


def _wait_gone(pid: int, timeout_s: float, poll_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True  # exited; its parent has not reaped it yet
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)


class CommandRestarter:
    """An operator argv with {signature} {fallback} {args} {env_file} placeholders.

    An argument that is exactly "{args}" becomes one argument per fallback flag.
    """

    name = "command"

    def __init__(self, argv: Sequence[str], env_file: str | None, timeout_s: float = 300.0) -> None:
        if not argv:
            raise ValueError(
                "restarter 'command' needs restart_command (an argv list) in the config file"
            )
        if not env_file and any("{env_file}" in arg for arg in argv):
            raise ValueError(
                "uses {env_file} but key 'fallback_file' is not set; set it "
                "(e.g. /var/lib/hang-watchdog/fallback.env) or drop the placeholder"
            )
        self.argv, self.env_file, self.timeout_s = list(argv), env_file, timeout_s

    def expand(self, plan: Plan) -> list[str]:
        values = {
            "signature": plan.signature,
            "fallback": plan.fallback,
            "args": " ".join(plan.args),
            "env_file": self.env_file or "",
        }
        out: list[str] = []
        for arg in self.argv:
            if arg == "{args}":
                out.extend(plan.args)
                continue
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out

    def restart(self, plan: Plan, target_pid: int | None) -> str:
        if self.env_file:
            write_env_file(self.env_file, plan)
        argv = self.expand(plan)
        env = {**os.environ, **dict(plan.env)}
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RestartError(f"{argv[0]}: {exc}") from exc
        if done.returncode != 0:
            raise RestartError(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return f"ran {' '.join(argv)}"


def make_restarter(
    cfg: RemediationConfig, supervisor: Supervised | None, child_env: EnvFilter
) -> Restarter:
    """The restarter `cfg.restarter` names; ConfigError when its settings are missing."""
    if cfg.restarter == "supervise":
        if supervisor is None:
            raise ConfigError(
                "key 'restarter': 'supervise' needs `run -- COMMAND`; for a server you attach "
                "to, use systemd, kubernetes or command"
            )
        return SuperviseRestarter(supervisor, cfg.stop_grace_s, child_env)
    if cfg.restarter in ("systemd", "kubernetes") and not cfg.fallback_file:
        raise ConfigError(
            f"key 'fallback_file': restarter {cfg.restarter!r} needs the file the server reads "
            "its fallback from (e.g. /var/lib/hang-watchdog/fallback.env)"
        )
    if cfg.restarter == "systemd":
        if not cfg.systemd_unit:
            raise ConfigError("key 'systemd_unit': restarter 'systemd' needs the vLLM unit name")
        return SystemdRestarter(cfg.systemd_unit, str(cfg.fallback_file))
    if cfg.restarter == "kubernetes":
        return KubernetesRestarter(str(cfg.fallback_file), cfg.stop_grace_s)
    try:
        return CommandRestarter(cfg.restart_command, cfg.fallback_file)
    except ValueError as exc:
        raise ConfigError(f"key 'restart_command': {exc}") from exc


class RestartJob:
    """One restart in a background thread (begun by `start`): the daemon loop never waits on
    a stop grace."""

    def __init__(self, restarter: Restarter, plan: Plan, pid: int | None) -> None:
        self.result: str | None = None
        self.error: str | None = None

        def work() -> None:
            try:
                self.result = restarter.restart(plan, pid)
            except RestartError as exc:
                self.error = str(exc)
            except Exception as exc:  # a bug or an unexpected failure must still end as failed
                log.exception("restarter %s raised", restarter.name)
                self.error = f"{type(exc).__name__}: {exc}"

        self.thread = threading.Thread(target=work, name="hang-watchdog-restart", daemon=True)

    def start(self) -> None:
        self.thread.start()
