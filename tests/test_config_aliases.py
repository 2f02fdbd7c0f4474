"""Old config names kept for one release: `vllm_url` / `--vllm-url` read as `server_url` /
`--server-url`, with one deprecation line naming the new name, and a clear exit-2 error when
both names are given with different values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.simfixtures import run_watchdog
from watchdog.commands.cli import build_parser, config_from_args
from watchdog.config import ALIASES, ConfigError, build_config, load_config

URL = "http://127.0.0.1:8000"
# A short real `diagnose`: no GPU, no CDN lookup, a URL nothing listens on (port 9 is discard).
QUIET = ("diagnose", "--duration", "0.5", "--gpu-source", "none", "--no-cdn-default")


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "watchdog.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _from_flags(*argv: str, notes: list[str] | None = None):  # noqa: ANN202
    args = build_parser().parse_args(["run", *argv])
    args.command = []
    return config_from_args(args, notes)


def test_the_old_key_in_a_file_reads_as_the_new_one(tmp_path: Path) -> None:
    notes: list[str] = []
    old = load_config(_toml(tmp_path, f'vllm_url = "{URL}"\n'), notes=notes)
    new = load_config(_toml(tmp_path, f'server_url = "{URL}"\n'))
    assert old == new and old.server_url == URL
    assert len(notes) == 1 and "'vllm_url' is deprecated" in notes[0]
    assert "use 'server_url' instead" in notes[0] and str(tmp_path) in notes[0]


def test_the_old_flag_reads_as_the_new_one() -> None:
    notes: list[str] = []
    assert _from_flags("--vllm-url", URL, notes=notes) == _from_flags("--server-url", URL)
    assert notes == [
        "command line: --vllm-url is deprecated and kept for one release; use --server-url instead"
    ]


def test_the_new_name_says_nothing(tmp_path: Path) -> None:
    notes: list[str] = []
    load_config(_toml(tmp_path, f'server_url = "{URL}"\n'), notes=notes)
    _from_flags("--server-url", URL, notes=notes)
    assert notes == []


def test_both_names_with_the_same_value_are_one_setting(tmp_path: Path) -> None:
    cfg = load_config(_toml(tmp_path, f'server_url = "{URL}"\nvllm_url = "{URL}"\n'))
    assert cfg.server_url == URL
    assert _from_flags("--server-url", URL, "--vllm-url", URL).server_url == URL


def test_both_names_with_different_values_in_a_file_are_refused(tmp_path: Path) -> None:
    path = _toml(tmp_path, f'server_url = "{URL}"\nvllm_url = "http://127.0.0.1:9000"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: 'vllm_url' (the old name of 'server_url')")
    assert "'http://127.0.0.1:9000'" in msg and repr(URL) in msg
    assert msg.endswith("give only 'server_url'")


def test_both_flags_with_different_values_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        _from_flags("--server-url", URL, "--vllm-url", "http://127.0.0.1:9000")
    msg = str(info.value)
    assert "--vllm-url (the old name of --server-url)" in msg and "give only --server-url" in msg


def test_a_flag_overrides_the_other_name_in_the_file(tmp_path: Path) -> None:
    """Flags win over the file whichever name each uses: that is an override, not a conflict."""
    path = _toml(tmp_path, 'vllm_url = "http://127.0.0.1:9000"\n')
    args = build_parser().parse_args(["run", "--config", str(path), "--server-url", URL])
    args.command = []
    assert config_from_args(args).server_url == URL


def test_a_bad_value_under_the_old_name_says_which_name_was_given() -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"vllm_url": "ftp://host"}, origin="site.toml")
    assert "key 'server_url'" in str(info.value)
    assert str(info.value).endswith("(given as 'vllm_url', its old name)")
    with pytest.raises(ConfigError, match=r"\(given as --vllm-url, its old name\)$"):
        _from_flags("--vllm-url", "http://127.0.0.1:notport")


def test_every_alias_names_a_key() -> None:
    from watchdog.config import KEYS

    assert ALIASES and all(new in KEYS and old not in KEYS for old, new in ALIASES.items())


def test_the_conflict_exits_2_through_the_cli() -> None:
    proc = run_watchdog(*QUIET, "--server-url", URL, "--vllm-url", "http://127.0.0.1:9")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--vllm-url (the old name of --server-url)" in proc.stderr


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_old_flag_logs_one_deprecation_line(fmt: str) -> None:
    proc = run_watchdog(*QUIET, "--log-format", fmt, "--vllm-url", "http://127.0.0.1:9")
    assert proc.returncode in (0, 1), proc.stderr  # it ran: a closed port is not a usage error
    lines = [ln for ln in proc.stderr.splitlines() if "deprecated" in ln]
    assert len(lines) == 1, proc.stderr
    if fmt == "json":
        record = json.loads(lines[0])
        assert record["level"] == "WARNING" and "use --server-url instead" in record["message"]
    else:
        assert "hang-watchdog WARNING: command line: --vllm-url is deprecated" in lines[0]
    assert "source server is down" in proc.stderr  # the source's new name in its log line


def test_the_old_key_in_a_file_logs_one_line_and_the_new_one_none(tmp_path: Path) -> None:
    old = run_watchdog(*QUIET, "--config", str(_toml(tmp_path, 'vllm_url = "http://127.0.0.1:9"')))
    assert old.returncode in (0, 1), old.stderr
    assert old.stderr.count("deprecated") == 1 and "use 'server_url' instead" in old.stderr
    new = run_watchdog(*QUIET, "--server-url", "http://127.0.0.1:9")
    assert new.returncode in (0, 1), new.stderr
    assert "deprecated" not in new.stderr


def test_help_lists_the_old_flag_as_an_alias() -> None:
    proc = run_watchdog("run", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--server-url URL" in text
    assert "--vllm-url URL old name of --server-url, kept for one release" in text
