"""Command line: `hang-watchdog run|diagnose|signatures|replay|preflight|demo|fallback`.

`main(argv) -> int` returns the exit code: 0 ok / not hung, 1 hung, stalled, dead or a check
failed, 2 usage, config or input error; `run -- COMMAND` passes the command's own code through.
Every error is one line: `hang-watchdog CMD: what is wrong; what to do`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from typing import Any

from watchdog import __version__
from watchdog.commands import checks
from watchdog.commands.checks import TargetError
from watchdog.commands.flags import FLAG_NAMES, NO_FLAG, add_config_flags, epilog
from watchdog.config import KEYS, Config, ConfigError, load_config
from watchdog.core.model import to_dict
from watchdog.core.signatures import SignatureError, load_signatures
from watchdog.outputs.emit import STAMP, format_verdict

__all__ = ["FLAG_NAMES", "NO_FLAG", "build_parser", "config_from_args", "main"]

# Verdict states a script must hear about: `diagnose || page` (exit 1).
UNHEALTHY = frozenset({"hung", "stalled", "dead"})


class UsageError(Exception):
    """Bad command-line usage (exit 2); printed once as `PROG: message`."""

    def __init__(self, message: str, prog: str = "hang-watchdog") -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits on its own; we want exit code 2 via main
        raise UsageError(f"{message}; see `{self.prog} --help`", prog=self.prog)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    prog = "hang-watchdog"
    try:
        _check_command_word(argv)
        args, extra = parser.parse_known_args(argv)
        prog = f"hang-watchdog {args.cmd}"
        if extra:
            raise UsageError(
                f"unrecognized arguments: {' '.join(extra)}; see `{prog} --help`", prog=prog
            )
        if command and args.cmd != "run":
            raise UsageError("only `run` takes `-- COMMAND ...` to supervise", prog=prog)
        args.command = command
        if not hasattr(args, "config"):  # daemon commands set it up once their config is read
            _setup_logging("text")
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the BrokenPipeError handler
        return code
    except UsageError as exc:
        print(f"{exc.prog}: {exc}", file=sys.stderr)
        return 2
    except TargetError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, SignatureError) as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hang-watchdog signatures | head`: the reader left, nothing to say
        _drop_stdout()
        return 128 + signal.SIGPIPE


def _check_command_word(argv: list[str]) -> None:
    """The first word must be a command: name what is wrong instead of argparse's `COMMAND`."""
    choose = f"choose one of {', '.join(COMMANDS)} (see `hang-watchdog --help`)"
    if not argv:
        raise UsageError(f"no command given; {choose}")
    first = argv[0]
    if first in COMMANDS or first in ("-h", "--help", "--version"):
        return
    if first.startswith("-"):
        raise UsageError(
            f"{first} must come after the command (hang-watchdog COMMAND {first}); {choose}"
        )
    raise UsageError(f"unknown command {first!r}; {choose}")


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


COMMANDS = ("run", "diagnose", "signatures", "replay", "preflight", "demo", "fallback")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hang-watchdog",
        description="Tells operators that an LLM inference server (vLLM, SGLang, TensorRT-LLM)\n"
        "is hung, why, and what to do; restarts it with a fallback when allowed.",
        epilog=epilog(
            [
                ("see a detection on a simulated server (no GPU needed)", "hang-watchdog demo"),
                ("supervise a server", "hang-watchdog run -- vllm serve MODEL"),
                ("is this server hung right now?", "hang-watchdog diagnose --pid 1234"),
            ],
            supervise=True,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hang-watchdog {__version__}")
    sub = parser.add_subparsers(
        dest="cmd", metavar="COMMAND", title="commands", required=True, parser_class=_Parser
    )
    _run_parser(sub)
    _diagnose_parser(sub)
    _signatures_parser(sub)
    for name, module, text, examples in FEATURES:
        _feature(sub, name, module, text, examples)
    return parser


def _subparser(sub: Any, name: str, text: str, examples: list[tuple[str, str]], **kw: Any) -> Any:
    """A subcommand with a description, examples and the exit codes in its --help."""
    return sub.add_parser(
        name,
        help=text,
        description=textwrap.fill(text[:1].upper() + text[1:] + ".", 79),
        epilog=epilog(examples, supervise=kw.pop("supervise", False)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )


def _run_parser(sub: Any) -> None:
    p = _subparser(
        sub,
        "run",
        "watch a server until stopped: attach with --pid/--match/--systemd-unit, or "
        "supervise it with `run -- COMMAND`",
        [
            (
                "supervise a server: its output is followed and it can be restarted",
                "hang-watchdog run -- vllm serve MODEL --port 8000",
            ),
            (
                "attach to a running server and its HTTP API",
                "hang-watchdog run --pid 1234 --vllm-url http://127.0.0.1:8000",
            ),
            (
                "a systemd service, restarted with a fallback when it hangs",
                "hang-watchdog run --systemd-unit vllm.service --remediate --restarter systemd",
            ),
        ],
        usage="hang-watchdog run [OPTION ...] [-- COMMAND [ARG ...]]",
        supervise=True,
    )
    add_config_flags(p, daemon=True)
    p.set_defaults(func=cmd_run)


def _diagnose_parser(sub: Any) -> None:
    p = _subparser(
        sub,
        "diagnose",
        "sample a server for a while and print one verdict with its evidence and fix",
        [
            ("30 s of a running server", "hang-watchdog diagnose --pid 1234"),
            (
                "stop at the first hang, with an incident bundle",
                "hang-watchdog diagnose --match 'vllm serve' --until-hang --incident-dir /tmp/inc",
            ),
            (
                "for scripts: page when it is not healthy",
                "hang-watchdog diagnose --pid 1234 --json || page-oncall",
            ),
        ],
    )
    add_config_flags(p, daemon=False)
    g = p.add_argument_group("diagnose")
    g.add_argument(
        "--duration",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to sample (default: 30)",
    )
    g.add_argument(
        "--until-hang",
        action="store_true",
        help="stop as soon as a hang is found (and its incident written)",
    )
    g.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=cmd_diagnose)


def _signatures_parser(sub: Any) -> None:
    p = _subparser(
        sub,
        "signatures",
        "list the known hang signatures, or validate an operator signature file",
        [
            ("what the watchdog knows", "hang-watchdog signatures"),
            (
                "check your own rules before deploying them",
                "hang-watchdog signatures --check site.toml",
            ),
        ],
    )
    p.add_argument(
        "--check", metavar="FILE", help="validate FILE; exit 2 with the error if it is invalid"
    )
    p.add_argument(
        "--signatures",
        action="append",
        default=[],
        metavar="FILE",
        help="operator signature file added to the built-in ones; repeatable",
    )
    p.set_defaults(func=cmd_signatures)


# Subcommands whose flags and body live in their own module (`add_arguments`, `run`).
FEATURES: tuple[tuple[str, str, str, list[tuple[str, str]]], ...] = (
    (
        "replay",
        "watchdog.commands.replay",
        "re-classify an incident bundle, a timeline, or a plain server log",
        [
            (
                "today's rules on a past incident",
                "hang-watchdog replay /var/lib/hang-watchdog/incidents/20260101T0000Z-engine_dead",
            ),
            ("which signature does this log show?", "hang-watchdog replay vllm.log"),
            ("test a new rule", "hang-watchdog replay --signatures site.toml timeline.jsonl"),
        ],
    ),
    (
        "preflight",
        "watchdog.preflight",
        "check a host before the server starts (GPUs, kernels, cubins, disk, py-spy)",
        [
            (
                "before starting the server",
                'hang-watchdog preflight --server-args="--attention-config.use_trtllm_attention=0"',
            ),
            ("as an initContainer: warnings fail too", "hang-watchdog preflight --strict --json"),
        ],
    ),
    (
        "demo",
        "watchdog.commands.demo",
        "simulate a hanging vLLM and watch the watchdog catch it (no GPU needed)",
        [
            ("the FlashInfer cubin-download hang", "hang-watchdog demo"),
            ("a healthy server: no hang must be reported", "hang-watchdog demo --scenario healthy"),
        ],
    ),
    (
        "fallback",
        "watchdog.remediation.cli",
        "show or clear the fallback that remediation applied",
        [
            ("what is applied now", "hang-watchdog fallback show"),
            ("go back to the normal configuration", "hang-watchdog fallback clear"),
        ],
    ),
)


def _feature(sub: Any, name: str, module: str, text: str, examples: list[tuple[str, str]]) -> None:
    """A subcommand whose flags and body live in `module` (`add_arguments`, `run`)."""
    mod = importlib.import_module(module)
    p = _subparser(sub, name, text, examples)
    mod.add_arguments(p)
    p.set_defaults(func=mod.run)


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
        handler.setFormatter(_TextFormatter())
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


class _TextFormatter(logging.Formatter):
    """`2026-01-01T12:00:00Z hang-watchdog WARNING: ...`: the Emitter's timestamp and form."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime(STAMP, time.gmtime(record.created))
        return f"{stamp} hang-watchdog {record.levelname}: {record.getMessage()}"


class _JsonFormatter(logging.Formatter):
    """Log records as JSON objects shaped like the Emitter's (`ts`, `event`, `message`)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": time.strftime(STAMP, time.gmtime(record.created)),
                "event": "log",
                "level": record.levelname,
                "message": record.getMessage(),
            }
        )


def cmd_run(args: argparse.Namespace) -> int:
    from watchdog.daemon.wiring import build

    cfg = config_from_args(args)
    _setup_logging(cfg.log_format)  # the file's log_format counts too, not only the flag
    _check_target(cfg, supervise=True)
    checks.check_command(cfg.command)
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
        return (
            sup is not None
            and sup.returncode() is not None
            and not getattr(built, "restarting", False)
        )

    built.daemon.run(stop=stop, until=until)
    if ended.stopped:
        return 1
    if sup is None:
        return 0
    if stop.is_set():
        try:
            sup.shutdown(cfg.stop_grace_s)
        except StopError as exc:
            logging.getLogger("hang_watchdog").error("stopping the server: %s", exc)
            return 1
    code = sup.returncode()
    return 0 if code is None else (code if code >= 0 else 128 - code)


def _stdin_alone(cfg: Config) -> bool:
    """Is standard input all there is to watch (no process, API or other log)?"""
    others = [p for p in cfg.log_files if p != "-"]
    return (
        not (cfg.pid or cfg.match or cfg.systemd_unit or cfg.command or cfg.vllm_url or others)
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
        raise UsageError(
            f"--duration must be more than 0 seconds, got {args.duration:g}; e.g. --duration 30",
            prog="hang-watchdog diagnose",
        )
    args.metrics_addr = "off"  # one sample needs no exporter
    cfg = config_from_args(args)
    _setup_logging(cfg.log_format)
    _check_target(cfg, supervise=False)
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
