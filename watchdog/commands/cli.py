"""Command line: `hang-watchdog run|diagnose|signatures|replay|preflight|demo|fallback`.

`main(argv) -> int` returns the exit code: 0 ok, 1 hang found / check failed, 2 usage or
config error.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from watchdog import __version__
from watchdog.config import KEYS, Config, ConfigError, load_config
from watchdog.core.model import to_dict
from watchdog.core.signatures import SignatureError, load_signatures
from watchdog.outputs.emit import format_verdict

# Config keys whose flag name differs from the key, and keys with no flag of their own.
FLAG_NAMES = {
    "log_files": "--log-file",
    "cdn_hosts": "--cdn-host",
    "signatures": "--signatures",
    "engines": "--engines",
}
NO_FLAG = {"command", "fallback_overrides", "restart_command"}


class UsageError(Exception):
    """Bad command-line usage (exit 2); printed once as `PROG: message`."""

    def __init__(self, message: str, prog: str = "hang-watchdog") -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits on its own; we want exit code 2 via main
        raise UsageError(message, prog=self.prog)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if command and args.cmd != "run":
            raise UsageError("only `run` takes `-- COMMAND ...` to supervise")
        args.command = command
        if not hasattr(args, "config"):  # daemon commands set it up once their config is read
            _setup_logging("text")
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the BrokenPipeError handler
        return code
    except UsageError as exc:
        print(f"{exc.prog}: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, SignatureError) as exc:
        print(f"hang-watchdog: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hang-watchdog signatures | head`: the reader left, nothing to say
        _drop_stdout()
        return 128 + signal.SIGPIPE


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hang-watchdog",
        description="Tells operators that an LLM inference server (vLLM first) is hung, why, "
        "and what to do; restarts it with a fallback when allowed.",
        epilog="Exit codes: 0 ok, 1 hang found or check failed, 2 usage or config error.",
    )
    parser.add_argument("--version", action="version", version=f"hang-watchdog {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "run", help="watch a server (attach with --pid/--match/--systemd-unit, or `run -- COMMAND`)"
    )
    _daemon_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "diagnose",
        help="sample for a while, print the verdict with evidence and fix; exit 1 if hung",
    )
    _daemon_flags(p)
    p.add_argument("--duration", type=float, default=30.0, help="seconds to sample (default 30)")
    p.add_argument(
        "--until-hang",
        action="store_true",
        help="stop as soon as a hang is found (and its incident written)",
    )
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser(
        "signatures", help="list the known hang signatures, or validate an operator file"
    )
    p.add_argument(
        "--check", metavar="FILE", help="validate FILE; exit 2 with the error if it is invalid"
    )
    p.add_argument(
        "--signatures", action="append", default=[], metavar="FILE", help="operator signature file"
    )
    p.set_defaults(func=cmd_signatures)

    _feature(
        sub,
        "replay",
        "watchdog.commands.replay",
        "re-classify an incident bundle, a timeline, or a plain server log",
    )
    _feature(
        sub,
        "preflight",
        "watchdog.preflight",
        "check a host before the server starts; exit 1 on failure",
    )
    _feature(
        sub,
        "demo",
        "watchdog.commands.demo",
        "simulate a hanging vLLM and watch the watchdog catch it",
    )
    _feature(
        sub,
        "fallback",
        "watchdog.remediation.cli",
        "show or clear the fallback applied by remediation",
    )
    return parser


def _feature(sub: Any, name: str, module: str, help: str) -> None:
    """A subcommand whose flags and body live in `module` (`add_arguments`, `run`)."""
    mod = importlib.import_module(module)
    p = sub.add_parser(name, help=help, description=help)
    mod.add_arguments(p)
    p.set_defaults(func=mod.run)


def _daemon_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (every key has a default; flags override)",
    )
    for f in dataclasses.fields(Config):
        if f.name in NO_FLAG:
            continue
        flag = FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        helptext = f"{f.metadata['help']} (default: {_default(f)})"
        kind = str(f.type)
        if "bool" in kind:
            p.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=helptext,
            )
        elif "list" in kind:
            p.add_argument(flag, dest=f.name, action="append", default=None, help=helptext)
        else:
            tp = int if "int" in kind and "float" not in kind else float if "float" in kind else str
            p.add_argument(flag, dest=f.name, type=tp, default=None, help=helptext)


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def config_from_args(args: argparse.Namespace) -> Config:
    """The config file and the flags merged (flags win)."""
    overrides = {k: getattr(args, k, None) for k in KEYS}
    overrides["command"] = getattr(args, "command", []) or None
    return load_config(getattr(args, "config", None), overrides)


def _setup_logging(fmt: str) -> None:
    """One stderr handler in `fmt` (text or json); a second call replaces the first's handler."""
    root = logging.getLogger("hang_watchdog")
    for old in [h for h in root.handlers if getattr(h, "hang_watchdog_cli", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.hang_watchdog_cli = True  # type: ignore[attr-defined]
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s hang-watchdog %(levelname)s: %(message)s")
        )
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


class _JsonFormatter(logging.Formatter):
    """Log records as JSON objects shaped like the Emitter's (`ts`, `event`, `message`)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
                "event": "log",
                "level": record.levelname,
                "message": record.getMessage(),
            }
        )


def cmd_run(args: argparse.Namespace) -> int:
    from watchdog.daemon.supervise import StopError
    from watchdog.daemon.wiring import build

    cfg = config_from_args(args)
    _setup_logging(cfg.log_format)  # the file's log_format counts too, not only the flag
    _check_pid(cfg.pid, "--match/--systemd-unit", "hang-watchdog run")
    if not (
        cfg.pid
        or cfg.match
        or cfg.systemd_unit
        or cfg.command
        or cfg.vllm_url
        or cfg.log_files
        or cfg.journal_unit
    ):
        raise UsageError(
            "nothing to watch; give --pid, --match, --systemd-unit, --vllm-url, "
            "--log-file or `-- COMMAND`",
            prog="hang-watchdog run",
        )
    built = build(cfg)
    stop = threading.Event()
    _on_signals(stop)
    try:
        if built.server is not None:
            try:
                host, port = built.server.start()
            except OSError as exc:  # the message names the address and what to do
                raise ConfigError(f"key 'metrics_addr': {exc.strerror or exc}") from exc
            logging.getLogger("hang_watchdog").info("metrics on http://%s:%d/metrics", host, port)
        sup = built.supervisor
        if sup is not None:
            sup.start()

        def child_gone(_verdict: Any) -> bool:
            assert sup is not None
            return sup.returncode() is not None and not getattr(built, "restarting", False)

        until = child_gone if sup is not None else None
        built.daemon.run(stop=stop, until=until)
        if sup is not None:
            if stop.is_set():
                try:
                    sup.shutdown(cfg.stop_grace_s)
                except StopError as exc:
                    logging.getLogger("hang_watchdog").error("stopping the server: %s", exc)
                    return 1
            code = sup.returncode()
            return 0 if code is None else (code if code >= 0 else 128 - code)
        return 0
    finally:
        built.close()


def _check_pid(pid: int | None, instead: str, prog: str) -> None:
    """UsageError when --pid names no process: watching it would only ever report `dead`."""
    import psutil

    if pid is not None and (pid <= 0 or not psutil.pid_exists(pid)):
        raise UsageError(f"no process with PID {pid}; check the PID or use {instead}", prog=prog)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from watchdog.daemon.wiring import build

    if args.metrics_addr is None:
        args.metrics_addr = "off"
    cfg = config_from_args(args)
    _setup_logging(cfg.log_format)
    _check_pid(cfg.pid, "--match", "hang-watchdog diagnose")
    built = build(cfg)
    stop = threading.Event()
    _on_signals(stop)

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
        print("no verdict: the watchdog made no observation", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_dict(verdict), indent=2))
    else:
        print(format_verdict(verdict))
        for path in built.episodes.incidents if built.episodes is not None else ():
            print(f"incident: {path}")
    return 1 if verdict.is_hang else 0


def cmd_signatures(args: argparse.Namespace) -> int:
    if args.check:  # in context: its fallbacks may be shipped or in the --signatures files
        load_signatures([*args.signatures, args.check])
        print(f"{args.check}: ok")
        return 0
    sigs = load_signatures(args.signatures)
    for s in sigs.signatures:
        print(f"{s.id:28s} {s.when:8s} fallback={s.fallback or '-':26s} {s.title}")
    for k in sigs.known_bad:
        print(f"known_bad {k.id:40s} {k.severity:5s} {k.title}")
    return 0


def _on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
