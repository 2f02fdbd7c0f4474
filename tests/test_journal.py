"""Tests for JournalReader against a stand-in `journalctl` script on a temporary PATH."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fakes import STANDIN, install_journalctl
from watchdog.sources.logs.journal import JournalReader
from watchdog.sources.logs.split import Block


class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_journalctl(tmp_path, monkeypatch, STANDIN)
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
    reader = JournalReader("vllm.service", output="cat")
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


def test_json_messages_are_handed_over_as_blocks_of_their_lines(standin: Path) -> None:
    """The log source reads every reader's blocks; a JSON record's MESSAGE becomes its lines."""
    records = [
        {"__CURSOR": "s=1", "MESSAGE": "EngineDead\u0000Error: gone\r\nsecond line"},
        {"__CURSOR": "s=2", "MESSAGE": "third"},
    ]
    (standin / "out").write_text("".join(json.dumps(r) + "\n" for r in records))
    reader = JournalReader("vllm.service", output="json")
    try:
        blocks: list[Block] = []
        deadline = time.monotonic() + 20
        while sum(b.count() for b in blocks) < 3 and time.monotonic() < deadline:
            blocks += reader.read_blocks()
            time.sleep(0.02)
        assert all(isinstance(b, Block) for b in blocks)
        assert b"".join(b.data for b in blocks) == b"EngineDeadError: gone\nsecond line\nthird\n"
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


# A stand-in journal: JOURNAL holds one JSON entry per line (with __CURSOR and
# __REALTIME_TIMESTAMP). It starts where journalctl would (--since now: after the entries present;
# --since @S: entries from second S; --after-cursor=C: after entry C), prints entries as they are
# appended, and exits 1 ("crashed") when the test creates the CRASH file. It records its argv
# once it knows where to start, so a test that waits for that record knows what "now" was.
MINI_JOURNAL = """#!{python}
import json, os, sys, time
path, crash = os.environ["JOURNAL"], os.environ["CRASH"]
def entries():  # complete lines only: the test may be half-way through appending one
    text = open(path).read()
    return [json.loads(x) for x in text[: text.rfind("\\n") + 1].splitlines() if x.strip()]
args, start = sys.argv[1:], len(entries())
for i, arg in enumerate(args):
    if arg.startswith("--after-cursor="):
        cursors = [e["__CURSOR"] for e in entries()]
        start = cursors.index(arg.split("=", 1)[1]) + 1
    if arg == "--since" and args[i + 1].startswith("@"):
        since = int(args[i + 1][1:]) * 1000000
        start = min([n for n, e in enumerate(entries()) if int(e["__REALTIME_TIMESTAMP"]) >= since]
                    or [len(entries())])
with open(os.environ["STANDIN_ARGV"], "a") as f:  # after `start`: the test may now append
    f.write(json.dumps(sys.argv[1:]) + "\\n")
while True:
    for e in entries()[start:]:
        sys.stdout.write(json.dumps(e) + "\\n")
        start += 1
    sys.stdout.flush()
    if os.path.exists(crash):
        os.unlink(crash)
        sys.exit(1)
    time.sleep(0.02)
"""

WALL = 1_764_000_000.0  # the reader's injected wall clock, in seconds


def append_entries(journal: Path, *numbers: int) -> None:
    with journal.open("a") as f:
        for n in numbers:
            entry = {
                "__CURSOR": f"s=c{n}",
                "__REALTIME_TIMESTAMP": str(int((WALL + n) * 1_000_000)),
                "MESSAGE": f"line {n}",
            }
            f.write(json.dumps(entry) + "\n")


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_journalctl(tmp_path, monkeypatch, MINI_JOURNAL)
    monkeypatch.setenv("JOURNAL", str(tmp_path / "journal.jsonl"))
    monkeypatch.setenv("CRASH", str(tmp_path / "crash"))
    (tmp_path / "journal.jsonl").write_text("")
    return tmp_path


def wait_started(reader: JournalReader, tmp_path: Path, runs: int) -> None:
    """Read until the stand-in has been started `runs` times and has chosen where to start."""
    deadline = time.monotonic() + 20
    while len(argvs(tmp_path)) < runs and time.monotonic() < deadline:
        assert reader.read() == []
        time.sleep(0.02)
    assert len(argvs(tmp_path)) == runs


def crash_and_wait(reader: JournalReader, tmp_path: Path) -> None:
    """Make the stand-in journalctl exit and wait until the reader has noticed."""
    restarts = reader.restarts
    (tmp_path / "crash").touch()
    deadline = time.monotonic() + 20
    while reader.restarts == restarts and time.monotonic() < deadline:
        assert reader.read() == []
        time.sleep(0.02)
    assert reader.restarts == restarts + 1 and "exited with code 1" in (reader.error or "")


def test_default_json_output_loses_no_line_across_a_journalctl_restart(journal: Path) -> None:
    """What the wiring builds (`JournalReader(unit)`) resumes at the cursor after a restart."""
    append_entries(journal / "journal.jsonl", 1, 2)  # before the watchdog started: not read
    clock = FakeClock()
    reader = JournalReader("vllm.service", clock=clock, wall=lambda: WALL)
    try:
        wait_started(reader, journal, 1)
        append_entries(journal / "journal.jsonl", 3, 4)
        lines = read_until(reader, 2)
        crash_and_wait(reader, journal)
        append_entries(journal / "journal.jsonl", 5, 6)  # written while journalctl was down
        clock.now += 5.0
        lines += read_until(reader, 2)
        append_entries(journal / "journal.jsonl", 7)
        lines += read_until(reader, 1)
        assert lines == ["line 3", "line 4", "line 5", "line 6", "line 7"]
        assert argvs(journal) == [
            ["-f", "-o", "json", "-u", "vllm.service", "--since", "now"],
            ["-f", "-o", "json", "-u", "vllm.service", "--after-cursor=s=c4"],
        ]
    finally:
        reader.close()


def test_restart_before_any_entry_resumes_from_the_first_start(journal: Path) -> None:
    clock = FakeClock()
    reader = JournalReader("vllm.service", clock=clock, wall=lambda: WALL)
    try:
        wait_started(reader, journal, 1)
        crash_and_wait(reader, journal)
        append_entries(journal / "journal.jsonl", 1)  # no cursor yet to resume from
        clock.now += 5.0
        assert read_until(reader, 1) == ["line 1"]
        assert argvs(journal)[1][-2:] == ["--since", f"@{int(WALL)}"]
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
