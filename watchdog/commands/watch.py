"""The bodies of `run` and `diagnose`: check the target, build the daemon, watch, and turn
what was seen into the one exit code (0 ok, 1 hung/stalled/dead, 2 usage; the child's own)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from typing import Any

from watchdog.commands import checks
from watchdog.commands.checks import TargetError
from watchdog.commands.logsetup import setup_logging
from watchdog.config import ALIASES, KEYS, Config, ConfigError, load_config
from watchdog.core.model import to_dict
from watchdog.outputs.emit import format_verdict

# Verdict states a script must hear about: `diagnose || page` (exit 1).
UNHEALTHY = frozenset({"hung", "stalled", "dead"})


def config_from_args(args: argparse.Namespace, notes: list[str] | None = None) -> Config:
    """The config file and the flags merged (flags win); old key names noted in `notes`."""
    overrides = {k: getattr(args, k, None) for k in (*KEYS, *ALIASES)}
    overrides["command"] = getattr(args, "command", []) or None
    return load_config(getattr(args, "config", None), overrides, notes=notes)


def _configure(args: argparse.Namespace) -> Config:
    """The config, then logging in its format, then one line per old key name used."""
    notes: list[str] = []
    cfg = config_from_args(args, notes)
    setup_logging(cfg.log_format)  # the file's log_format counts too, not only the flag
    for note in notes:
        logging.getLogger("hang_watchdog.config").warning(note)
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from watchdog.daemon.wiring import build

    cfg = _configure(args)
    _check_target(cfg, supervise=True)
    checks.check_command(cfg.command)
    built = build(cfg)
    stop = threading.Event()
    _on_signals(stop, built.supervisor, cfg.stop_grace_s)
    try:
        if built.server is not None:
            try:
                host, port = built.server.start()
            except OSError as exc:  # the message names the address and what to do
                raise ConfigError(f"key 'metrics_addr': {exc.strerror or exc}") from exc
            logging.getLogger("hang_watchdog").info("metrics on http://%s:%d/metrics", host, port)
        return _watch(cfg, built, stop)
    finally:
        built.close()


def _check_target(cfg: Config, *, supervise: bool) -> None:
    """Usage errors for a target that cannot be watched, before anything starts."""
    other = "--match/--systemd-unit" if supervise else "--match"
    checks.check_pid(cfg.pid, other)
    checks.check_something(cfg, supervise=supervise)
    checks.check_log_files(cfg.log_files)
    if not cfg.command and cfg.pid is None:
        checks.check_match(cfg.match, wait=supervise)
        if not cfg.match:
            checks.check_systemd_unit(cfg.systemd_unit)


def _watch(cfg: Config, built: Any, stop: threading.Event) -> int:
    """The loop of `run`; its exit code (the child's own in supervise mode)."""
    from watchdog.daemon.supervise import StopError

    sup = built.supervisor
    if sup is not None:
        try:
            sup.start()
        except RuntimeError as exc:  # the command vanished or lost its x bit since the check
            raise TargetError(f"{exc}; check the command after `--`") from exc
    ended = _InputEnd(built.stdin, alone=_stdin_alone(cfg))

    def until(_verdict: Any) -> bool:
        if ended.reached():
            return True
        return sup is not None and sup.returncode() is not None and not built.restarting

    built.daemon.run(stop=stop, until=until)
    if ended.stopped:
        return 1
    if sup is None:
        return 0
    # A stop signal, or the server ended by itself: either way its whole tree is stopped, so
    # a grandchild it forked (setsid, a double fork) does not run on under PID 1. A py-spy
    # dump still running first: it holds the server paused, deaf to its SIGTERM.
    if getattr(built, "capturer", None) is not None:
        built.capturer.close()
    try:
        sup.shutdown(cfg.stop_grace_s)
    except StopError as exc:
        logging.getLogger("hang_watchdog").error("stopping the server: %s", exc)
        return 1
    return sup.exit_code()


def _stdin_alone(cfg: Config) -> bool:
    """Is standard input all there is to watch (no process, API or other log)?"""
    others = [p for p in cfg.log_files if p != "-"]
    return (
        not (cfg.pid or cfg.match or cfg.systemd_unit or cfg.command or cfg.server_url or others)
        and not cfg.journal_unit
    )


class _InputEnd:
    """`--log-file -` at end of input: the piped server is gone. Alone, that ends the watch
    (exit 1, like `dead`); beside other sources it is said once and the watch goes on."""

    def __init__(self, reader: Any, *, alone: bool) -> None:
        self.reader, self.alone = reader, alone
        self.seen = 0  # ticks since EOF: one more tick drains the last queued lines
        self.stopped = False

    def reached(self) -> bool:
        if self.reader is None or not getattr(self.reader, "eof", False):
            return False
        self.seen += 1
        log = logging.getLogger("hang_watchdog")
        if self.seen == 1 and not self.alone:
            log.warning("standard input ended (the piped server exited?); still watching the rest")
        if self.seen < 2 or not self.alone:
            return False
        log.error("standard input ended: the piped server is gone (its output closed); stopping")
        self.stopped = True
        return True


def cmd_diagnose(args: argparse.Namespace) -> int:
    from watchdog.daemon.wiring import build

    if not args.duration > 0:
        raise TargetError(
            f"--duration must be more than 0 seconds, got {args.duration:g}; e.g. --duration 30"
        )
    args.metrics_addr = "off"  # one sample needs no exporter
    cfg = _configure(args)
    _check_target(cfg, supervise=False)
    built = build(cfg)
    stop = threading.Event()
    _on_signals(stop, built.supervisor, cfg.stop_grace_s)

    def done(v: Any) -> bool:
        if not args.until_hang or not v.is_hang:
            return False
        ep = built.episodes.episode if built.episodes is not None else None
        return not cfg.incident_dir or (ep is not None and ep.incident is not None)

    try:
        if built.supervisor is not None:
            built.supervisor.start()
        verdict = built.daemon.run(stop=stop, until=done, max_seconds=args.duration)
    finally:
        if built.supervisor is not None:
            built.supervisor.stop(cfg.stop_grace_s)
        built.close()
    if verdict is None:
        raise TargetError("no verdict: the watchdog made no observation; try a longer --duration")
    if args.json:
        print(json.dumps(to_dict(verdict), indent=2))
    else:
        print(format_verdict(verdict, color=_color(sys.stdout)))
        for path in built.episodes.incidents if built.episodes is not None else ():
            print(f"incident: {path}")
    return 1 if verdict.is_hang or verdict.state in UNHEALTHY else 0


def _color(stream: Any) -> bool:
    from watchdog.outputs.emit import use_color

    return use_color(stream)


def _on_signals(stop: threading.Event, sup: Any = None, grace_s: float = 0.0) -> Any:
    """SIGTERM, SIGINT and SIGHUP stop; a second one hurries (watchdog/daemon/signals.py)."""
    from watchdog.daemon.signals import StopSignals

    def describe() -> str:
        if sup is None or sup.pid is None:
            return "stopping"
        return f"stopping the server (pid {sup.pid}; SIGKILL after {grace_s:.0f} s)"

    signals = StopSignals(stop, describe=describe, hurry_exit=sup is None)
    if sup is not None:
        signals.hurry = sup.hurry
    signals.install()
    return signals
