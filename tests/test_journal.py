"""Tests for JournalReader against a stand-in `journalctl` script on a temporary PATH."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from watchdog.sources.journal import JournalReader

# The stand-in records its argv, prints what $STANDIN_OUT holds, then follows (sleeps) or exits.
STANDIN = """#!{python}
import json, os, sys, time
with open(os.environ["STANDIN_ARGV"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.stdout.buffer.write(open(os.environ["STANDIN_OUT"], "rb").read())
sys.stdout.flush()
if os.environ.get("STANDIN_EXIT"):
    sys.stderr.write("Failed to open journal: Permission denied\\n")
    sys.exit(int(os.environ["STANDIN_EXIT"]))
time.sleep(60)
"""


class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "journalctl"
    script.write_text(STANDIN.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_ARGV", str(tmp_path / "argv.jsonl"))
    monkeypatch.setenv("STANDIN_OUT", str(tmp_path / "out"))
    return tmp_path


def argvs(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "argv.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_until(reader: JournalReader, want: int, timeout: float = 20.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < want and time.monotonic() < deadline:
        lines += reader.read()
        time.sleep(0.02)
    return lines


def test_cat_output_exact_argv_and_lines(standin: Path) -> None:
    (standin / "out").write_bytes(
        b"(APIServer pid=9) INFO:     Application startup complete.\n"
        b"Processed prompts:   0%|  | 0/4 [00:00<?, ?it/s]\rProcessed prompts:  25%|\n"
    )
    reader = JournalReader("vllm.service")
    try:
        lines = read_until(reader, 3)
        assert argvs(standin) == [["-f", "-o", "cat", "-u", "vllm.service", "--since", "now"]]
        assert lines == [
            "(APIServer pid=9) INFO:     Application startup complete.",
            "Processed prompts:   0%|  | 0/4 [00:00<?, ?it/s]",
            "Processed prompts:  25%|",
        ]
        assert reader.error is None and reader.name == "journal:vllm.service"
    finally:
        reader.close()


def test_json_output_decodes_string_byte_array_and_multiline_messages(standin: Path) -> None:
    coloured = list(b"\x1b[36m(APIServer pid=1)\x1b[0m INFO x \xff")
    records = [
        {"__CURSOR": "s=1", "MESSAGE": "Loading weights took 5.15 seconds"},
        {"__CURSOR": "s=2", "MESSAGE": coloured},
        {"__CURSOR": "s=3", "MESSAGE": None},
        {"__CURSOR": "s=4", "MESSAGE": "Traceback (most recent call last):\n  File x"},
    ]
    out = "".join(json.dumps(r) + "\n" for r in records) + "not json\n"
    (standin / "out").write_text(out)
    reader = JournalReader("vllm.service", output="json")
    try:
        lines = read_until(reader, 4)
        assert argvs(standin)[0][:3] == ["-f", "-o", "json"]
        assert lines == [
            "Loading weights took 5.15 seconds",
            "\x1b[36m(APIServer pid=1)\x1b[0m INFO x \ufffd",
            "Traceback (most recent call last):",
            "  File x",
        ]
        deadline = time.monotonic() + 20
        while reader.bad_records == 0 and time.monotonic() < deadline:
            reader.read()
            time.sleep(0.02)
        assert reader.bad_records == 1
    finally:
        reader.close()


def test_restart_after_exit_is_rate_limited_and_resumes_at_cursor(
    standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_EXIT", "1")
    (standin / "out").write_text(json.dumps({"__CURSOR": "s=abc", "MESSAGE": "one"}) + "\n")
    clock = FakeClock()
    reader = JournalReader("vllm.service", output="json", clock=clock, restart_interval_s=5.0)
    try:
        assert read_until(reader, 1) == ["one"]
        deadline = time.monotonic() + 20
        while reader.restarts == 0 and time.monotonic() < deadline:
            reader.read()
            time.sleep(0.02)
        assert reader.error is not None
        assert "exited with code 1" in reader.error and "Permission denied" in reader.error
        reader.read()
        assert len(argvs(standin)) == 1  # within restart_interval_s: not restarted yet
        clock.now += 5.0
        assert read_until(reader, 1) == ["one"]
        assert argvs(standin)[1] == [
            "-f",
            "-o",
            "json",
            "-u",
            "vllm.service",
            "--after-cursor=s=abc",
        ]
    finally:
        reader.close()


def test_missing_journalctl_is_a_clear_error_not_an_exception(tmp_path: Path) -> None:
    reader = JournalReader("vllm.service", journalctl=str(tmp_path / "no-journalctl"))
    assert reader.read() == []
    assert reader.error is not None
    assert "not found" in reader.error and "--log-file" in reader.error
    reader.close()


@pytest.mark.parametrize(
    ("unit", "output", "match"),
    [("", "cat", "unit"), ("--all", "cat", "unit"), ("vllm.service", "short", "output")],
)
def test_bad_arguments_name_the_problem(unit: str, output: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        JournalReader(unit, output=output)
