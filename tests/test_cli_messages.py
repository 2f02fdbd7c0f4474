"""What each command says before it watches anything: usage errors in one form
(`hang-watchdog CMD: what is wrong; what to do`, exit 2) and --help that an operator can use."""

from __future__ import annotations

import gzip
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simfixtures import REPO_ROOT, run_watchdog, sim_env

COMMANDS = ("run", "diagnose", "signatures", "replay", "preflight", "demo", "fallback")
QUIET = ("--no-cdn-default", "--metrics-addr", "off", "--gpu-source", "none")


def one_error(done: subprocess.CompletedProcess[str], prog: str) -> str:
    """The single stderr line of a usage error, checked for its form and exit code."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback, no second part
    assert lines[0].startswith(f"{prog}: "), lines[0]
    assert "Traceback" not in done.stderr and "cmd" not in lines[0].split()
    return lines[0]


def test_run_of_a_command_that_is_not_installed_is_a_usage_error() -> None:
    line = one_error(run_watchdog("run", *QUIET, "--", "nosuch-vllm", "bench"), "hang-watchdog run")
    assert "cannot start 'nosuch-vllm': no such command on PATH" in line
    assert "give its full path after `--`" in line


def test_run_of_a_file_that_is_not_executable_is_a_usage_error() -> None:
    line = one_error(run_watchdog("run", *QUIET, "--", "/etc/passwd"), "hang-watchdog run")
    assert "cannot start '/etc/passwd': not an executable file" in line


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), "nothing to watch; give --pid, --match, --systemd-unit, --server-url or --log-file"),
        (("--log-file", "/tmp"), "--log-file /tmp is a directory; give the server's log file"),
        (("--log-file", "x.log", "--duration", "0"), "--duration must be more than 0 seconds"),
        (("--log-file", "x.log", "--duration", "-5"), "--duration must be more than 0 seconds"),
        (
            ("--match", "no-such-process-[q]zx"),
            "no process matches --match 'no-such-process-[q]zx'",
        ),
    ],
    ids=["no-target", "directory-log", "duration-0", "duration-negative", "match-nothing"],
)
def test_diagnose_with_nothing_to_watch_exits_2(flags: tuple[str, ...], expected: str) -> None:
    quiet = ("--no-cdn-default", "--gpu-source", "none")
    line = one_error(run_watchdog("diagnose", *quiet, *flags), "hang-watchdog diagnose")
    assert expected in line, line


def test_run_with_a_directory_as_log_file_exits_2() -> None:
    line = one_error(run_watchdog("run", *QUIET, "--log-file", "/tmp"), "hang-watchdog run")
    assert "is a directory" in line


def fake_systemctl(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose PATH finds `systemctl` as `script` first."""
    tool = tmp_path / "bin" / "systemctl"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = sim_env()
    env["PATH"] = f"{tool.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_a_failing_systemctl_is_shown_not_swallowed(tmp_path: Path) -> None:
    env = fake_systemctl(tmp_path, 'echo "Failed to connect to bus: Host is down" >&2; exit 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "watchdog", "run", *QUIET, "--systemd-unit", "vllm.service"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )
    line = one_error(done, "hang-watchdog run")
    assert "systemctl failed: Failed to connect to bus: Host is down" in line
    assert "gone" not in line


def test_replay_of_compressed_or_binary_input_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log.gz"
    log.write_bytes(gzip.compress(b"INFO 01-01 00:00:00 [api_server.py:1] started\n" * 500))
    line = one_error(run_watchdog("replay", str(log)), "hang-watchdog replay")
    assert "is gzip-compressed; decompress it first: `zcat FILE | hang-watchdog replay -`" in line
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(20000))
    line = one_error(run_watchdog("replay", str(noise)), "hang-watchdog replay")
    assert "is binary data, not a text log" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--pid", "3", "run"], "hang-watchdog: --pid must come after the command"),
        (["run", "--bogus"], "hang-watchdog run: unrecognized arguments: --bogus"),
        (["nosuch"], "hang-watchdog: unknown command 'nosuch'; choose one of run, diagnose"),
        ([], "hang-watchdog: no command given; choose one of run, diagnose"),
        (["run", "--log-format", "xml"], "hang-watchdog run: argument --log-format: invalid"),
    ],
    ids=["flag-before-command", "unknown-flag", "unknown-command", "no-command", "bad-choice"],
)
def test_top_level_errors_name_the_bad_word(args: list[str], expected: str) -> None:
    prog = expected.split(":", 1)[0]
    line = one_error(run_watchdog(*args), prog)
    assert line.startswith(expected), line


def help_of(*words: str) -> str:
    done = run_watchdog(*words, "--help")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_has_description_examples_and_exit_codes(command: str) -> None:
    text = help_of(command)
    usage, description = text.split("\n\n", 2)[:2]
    assert usage.startswith(f"usage: hang-watchdog {command}")
    assert len(description.split()) >= 5, description
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    assert examples.count(f"hang-watchdog {command}") >= 2, examples
    assert "exit codes:\n  0  ok" in text and "  2  usage, configuration or input error" in text
    flat = " ".join(text.split())
    assert "(default: None)" not in flat and ") (default:" not in flat  # each default once


def test_run_help_shows_the_supervise_form_choices_and_repeatable_flags() -> None:
    text = help_of("run")
    assert text.startswith("usage: hang-watchdog run [OPTION ...] [-- COMMAND [ARG ...]]")
    assert "--log-format {text,json}" in text
    assert "--restarter {supervise,systemd,kubernetes,command}" in text
    assert "--log-file FILE" in text and "--cdn-host HOST[:PORT]" in text
    for internal in ("LOG_FILES", "CDN_HOSTS", "SIGNATURES", "STALL_AFTER_S"):
        assert internal not in text
    flat = " ".join(text.split())
    assert "('-' is standard input); repeatable" in flat
    assert "Python, then on PATH) (default" not in flat
    assert "N  with `-- COMMAND`: the command's own exit code" in text


def test_diagnose_help_leaves_out_daemon_only_options() -> None:
    text = help_of("diagnose")
    for flag in ("--remediate", "--restarter", "--canary", "--metrics-addr", "--cooldown-s"):
        assert flag not in text, flag
    assert "--duration SECONDS" in text and "--pid PID" in text


def test_top_level_help_lists_the_commands_and_the_exit_codes() -> None:
    text = help_of()
    commands = text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^  (\w+)", commands, flags=re.M)
    assert "COMMAND" not in listed  # no heading line of argparse's own
    for command in COMMANDS:
        assert command in listed, command
    assert "exit codes:" in text and "{run,diagnose" not in text


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_values_in_words_not_internal_names(command: str) -> None:
    usage = help_of(command).split("\n\n", 1)[0]
    internal = [w for w in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", usage)]
    assert internal == [], internal  # e.g. LOG_FILES, WATCH_S, STATE_DIR
