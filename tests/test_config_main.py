"""Config errors through `main(argv)` in this process: exit code 2 and one line that names the
key, for a bad key, a bad value in the file, and a bad value on the command line.

`diagnose` is the command: it reads the same config as `run`, and were a config accepted by
mistake it would stop at "no target" instead of starting a daemon.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.commands.cli import main

PROG = "hang-watchdog diagnose: configuration error: "


def _diagnose(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["diagnose", "--no-cdn-default", "--gpu-source", "none", *argv])
    return code, capsys.readouterr().err


def test_an_unknown_key_in_the_file_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "watchdog.toml"
    path.write_text("stall_afer_s = 5\n", encoding="utf-8")
    code, err = _diagnose(capsys, "--config", str(path))
    assert code == 2
    assert err == (
        f"{PROG}{path}: unknown key 'stall_afer_s'; run `hang-watchdog run --help` for the keys\n"
    )


def test_a_bad_value_in_the_file_is_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "watchdog.toml"
    path.write_text('stall_after_s = 20\nlog_format = "xml"\n', encoding="utf-8")
    code, err = _diagnose(capsys, "--config", str(path))
    assert code == 2
    assert err.startswith(f"{PROG}{path}: key 'log_format': ") and "'xml'" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_flag_value_is_exit_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _diagnose(capsys, "--gpu-spin-sm", "1.5")
    assert code == 2
    assert err.startswith(PROG) and "key 'gpu_spin_sm'" in err and "1.5" in err, err


def test_a_good_config_gets_past_the_config_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cases above fail on the config, not on something that fails every diagnose."""
    path = tmp_path / "watchdog.toml"
    path.write_text("stall_after_s = 20\n", encoding="utf-8")
    code, err = _diagnose(capsys, "--config", str(path))
    assert code == 2 and "configuration error" not in err and err, err
