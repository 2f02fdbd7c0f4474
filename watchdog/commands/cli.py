"""Command line: `hang-watchdog run|diagnose|signatures|replay|preflight|demo|fallback`.

`main(argv) -> int` returns the exit code: 0 ok / not hung, 1 hung, stalled, dead or a check
failed, 2 usage, config or input error; `run -- COMMAND` passes the command's own code through.
Every error is one line: `hang-watchdog CMD: what is wrong; what to do`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from watchdog import __version__
from watchdog.commands.checks import TargetError
from watchdog.commands.flags import FLAG_NAMES, NO_FLAG, add_config_flags, epilog
from watchdog.commands.logsetup import setup_logging
from watchdog.commands.watch import cmd_diagnose, cmd_run, config_from_args
from watchdog.config import ConfigError
from watchdog.core.knowledge.signatures import SignatureError, load_signatures
from watchdog.core.knowledge.sigtext import fill

__all__ = ["FLAG_NAMES", "NO_FLAG", "build_parser", "config_from_args", "main"]


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
    # Only the chosen command's module is imported: `run` never loads preflight's checks,
    # replay or the demo (memory a long-running daemon would carry for nothing).
    parser = build_parser(only=argv[0] if argv and argv[0] in COMMANDS else None)
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
            setup_logging("text")
        del parser  # its actions and help text (0.2 MiB) would live as long as `run` does
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


class _TopFormatter(argparse.RawDescriptionHelpFormatter):
    """Lists the commands under `commands:` without argparse's extra `COMMAND` line."""

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return "".join(self._format_action(a) for a in action._get_subactions())
        return super()._format_action(action)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `only`, the other feature commands are listed by name and
    text but their modules are not imported."""
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
        formatter_class=_TopFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hang-watchdog {__version__}")
    sub = parser.add_subparsers(
        dest="cmd", metavar="COMMAND", title="commands", required=True, parser_class=_Parser
    )
    _run_parser(sub)
    _diagnose_parser(sub)
    _signatures_parser(sub)
    for name, module, text, examples in FEATURES:
        if only is None or only == name:
            _feature(sub, name, module, text, examples)
        else:
            _subparser(sub, name, text, examples)
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
                "hang-watchdog run --pid 1234 --server-url http://127.0.0.1:8000",
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
        "watchdog.commands.preflight",
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
        "simulate a hanging vLLM, SGLang or TensorRT-LLM server, watch it caught (no GPU)",
        [
            ("the FlashInfer cubin-download hang", "hang-watchdog demo"),
            ("a healthy server: no hang must be reported", "hang-watchdog demo --scenario healthy"),
        ],
    ),
    (
        "fallback",
        "watchdog.commands.fallback",
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


def cmd_signatures(args: argparse.Namespace) -> int:
    if args.check:  # in context: its fallbacks may be shipped or in the --signatures files
        load_signatures([*args.signatures, args.check])
        print(f"{args.check}: ok")
        return 0
    sigs = load_signatures(args.signatures)
    for s in sigs.signatures:
        print(f"{s.id:28s} {s.when:8s} fallback={s.fallback or '-':26s} {fill(s.title, {})}")
    for k in sigs.known_bad:
        print(f"known_bad {k.id:40s} {k.severity:5s} {k.title}")
    return 0
