"""Malformed config and signature files give a clear error and exit 2, never a traceback.
Each case is run through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simfixtures import run_watchdog

CONFIGS = {
    "unclosed_ipv6": ('server_url = "http://[::1"', "server_url"),
    # the old name of server_url: the error names the key as the file spells it
    "unclosed_ipv6_old_name": ('vllm_url = "http://[::1"', "given as 'vllm_url', its old name"),
    "pid_too_big": ("pid = 9223372036854775807", "pid"),
    "pid_past_pid_max": ("pid = 99999999", "pid"),
    "regex_overflow": ('match = "a{99999999999}"', "match"),
    "regex_unbalanced": ('match = "(a"', "match"),
    "nested_toml": ("x = " + "[" * 3000 + "]" * 3000, "nested too deeply"),
    "dcgm_without_host": ('gpu_source = "dcgm:http://"', "gpu_source"),
    "dcgm_bad_port": ('gpu_source = "dcgm:http://h:99999/metrics"', "gpu_source"),
    "file_without_path": ('gpu_source = "file:"', "gpu_source"),
    "huge_int": ("max_incidents = " + "9" * 30, "max_incidents"),
    "match_with_command": ('command = ["sleep", "1"]\nmatch = "vllm"', "supervise mode"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bad_config_is_exit_2_naming_the_key(tmp_path: Path, case: str) -> None:
    text, needle = CONFIGS[case]
    cfg = tmp_path / "c.toml"
    cfg.write_text(text + "\n")
    r = run_watchdog("run", "--config", str(cfg), "--no-cdn-default", "--metrics-addr", "off")
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_match_is_refused_in_supervise_mode_on_the_command_line() -> None:
    r = run_watchdog("run", "--match", "vllm", "--no-cdn-default", "--", "sleep", "1")
    assert r.returncode == 2 and "supervise mode" in r.stderr


SIG_HEAD = 'id = "x"\ntitle = "t"\nwhen = "any"\nstate = "hung"\nfix = "f"\n'
SIGNATURES = {
    "kind_is_a_list": (
        f'[[signature]]\n{SIG_HEAD}[[signature.evidence]]\nkind = ["log"]\npattern = "a"\n',
        "'kind'",
    ),
    "benign_state_is_a_list": ('[[benign]]\nid = "b"\nstate = ["idle"]\npattern = "a"\n', "state"),
    "regex_overflow": (
        f'[[signature]]\n{SIG_HEAD}[[signature.evidence]]\nkind = "log"\n'
        'pattern = "a{99999999999}"\n',
        "pattern",
    ),
    "when_is_a_table": (
        '[[signature]]\nid = "x"\ntitle = "t"\nwhen = {a = 1}\nstate = "hung"\nfix = "f"\n'
        '[[signature.evidence]]\nkind = "log"\npattern = "a"\n',
        "when",
    ),
    "nested": ("x = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(SIGNATURES))
def test_bad_signature_file_is_exit_2(tmp_path: Path, case: str) -> None:
    text, needle = SIGNATURES[case]
    path = tmp_path / "s.toml"
    path.write_text(text)
    r = run_watchdog("signatures", "--check", str(path))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
