"""Tests for FileFollower, StreamReader and LogSource with real files and real pipes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.shipped import PATTERNS
from watchdog.sources.logs.source import FileFollower, LogSource, StreamReader
from watchdog.sources.logs.split import Block

DATA = Path(__file__).parent / "data" / "logs"


def poll_until(read: Callable[[], list[str]], want: int, timeout: float = 20.0) -> list[str]:
    """Collect lines from `read` until `want` have arrived or the (generous) deadline passes."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < want and time.monotonic() < deadline:
        lines += read()
        if len(lines) < want:
            time.sleep(0.02)
    return lines


class ListReader:
    """A block reader over a fixed list of lines, for LogSource tests that are not about I/O."""

    def __init__(self, name: str, lines: list[str], error: str | None = None) -> None:
        self.name = name
        self.error = error
        self._lines = lines
        self.closed = False

    def read_blocks(self) -> list[Block]:
        lines, self._lines = self._lines, []
        return [Block("".join(f"{x}\n" for x in lines).encode())] if lines else []

    def close(self) -> None:
        self.closed = True


def test_follower_skips_existing_content_unless_from_start(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("old 1\nold 2\n")
    tail = FileFollower(log)
    head = FileFollower(log, from_start=True)
    assert tail.read() == []
    assert head.read() == ["old 1", "old 2"]
    with log.open("a") as f:
        f.write("new\n")
    assert tail.read() == ["new"]
    assert head.read() == ["new"]
    assert tail.error is None


def test_follower_waits_for_a_file_that_appears_later(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    follower = FileFollower(log)
    assert follower.read() == []
    assert follower.error is not None and str(log) in follower.error
    log.write_text("first\nsecond\n")  # created after start: read from its beginning
    assert follower.read() == ["first", "second"]
    assert follower.error is None


def test_follower_holds_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_text("")
    follower = FileFollower(log)
    follower.read()
    with log.open("a") as f:
        f.write("Loading weights took 5")
        f.flush()
        assert follower.read() == []
        f.write(".15 seconds\n")
    assert follower.read() == ["Loading weights took 5.15 seconds"]


def test_follower_follows_rotation_by_rename(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("")
    follower = FileFollower(log)
    follower.read()
    with log.open("a") as f:
        f.write("before\n")
    assert follower.read() == ["before"]
    with log.open("a") as old:
        old.write("late write to old file\npartial")
        old.flush()
        os.rename(log, tmp_path / "r.log.1")
        # Between rename and re-create, the follower keeps the old file.
        assert follower.read() == ["late write to old file"]
        old.write(" end\n")
        old.flush()
    log.write_text("new file line\n")
    assert follower.read() == ["partial end", "new file line"]
    with log.open("a") as f:
        f.write("more\n")
    assert follower.read() == ["more"]


def test_follower_restarts_after_truncation(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("")
    follower = FileFollower(log)
    follower.read()
    log.write_text("a long first line that makes the file big\n")
    assert follower.read() == ["a long first line that makes the file big"]
    with log.open("r+") as f:  # copytruncate-style: same inode, size back to 0
        f.truncate(0)
    with log.open("a") as f:
        f.write("after\n")
    assert follower.read() == ["after"]


def test_follower_reports_unreadable_file(tmp_path: Path) -> None:
    log = tmp_path / "dir.log"
    log.mkdir()  # opening a directory raises IsADirectoryError (an OSError)
    follower = FileFollower(log)
    assert follower.read() == []
    assert follower.error is not None and "dir.log" in follower.error


def test_stream_reader_reads_a_real_child_pipe_with_tqdm_redraws() -> None:
    code = (
        "import sys\n"
        "w = sys.stdout.buffer.write\n"
        "w(b'Processed prompts:   0%|  | 0/2 [00:00<?, ?it/s]\\r')\n"
        "w(b'Processed prompts:  50%|# | 1/2 [00:01<00:01, 1.00it/s]\\r')\n"
        "w(b'(APIServer pid=1) INFO:     Application startup complete.\\n')\n"
        "w(b'no newline at exit')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    tee = io.BytesIO()
    reader = StreamReader(proc.stdout, "child", tee=tee)  # type: ignore[arg-type]
    lines = poll_until(reader.read, 4)
    proc.wait(timeout=20)
    assert reader.wait(timeout=20)
    assert lines == [
        "Processed prompts:   0%|  | 0/2 [00:00<?, ?it/s]",
        "Processed prompts:  50%|# | 1/2 [00:01<00:01, 1.00it/s]",
        "(APIServer pid=1) INFO:     Application startup complete.",
        "no newline at exit",
    ]
    assert reader.eof and reader.error is None
    assert tee.getvalue().endswith(b"no newline at exit")  # output passed through unchanged


def test_stream_reader_drops_oldest_when_consumer_falls_behind() -> None:
    code = "import sys\nfor i in range(500): print(f'line {i}')\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    reader = StreamReader(proc.stdout, "child", max_lines=100)  # type: ignore[arg-type]
    proc.wait(timeout=20)
    assert reader.wait(timeout=20)
    lines = reader.read()
    assert len(lines) == 100
    assert lines[-1] == "line 499"
    assert reader.dropped == 400


def test_log_source_parses_real_file_and_keeps_tail(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    source = LogSource(
        [FileFollower(log)], keep=re.compile("EngineDeadError"), tail_lines=50, patterns=PATTERNS
    )
    assert source.poll() == ()
    assert source.health.up
    sample = (DATA / "f_tt3359_docker_timestamp_prefix.log").read_bytes()
    dead = (DATA / "e_vllm41647_apiserver_enginedeaderror.log").read_bytes()
    with log.open("ab") as f:
        f.write(sample + dead)
    events = source.poll()
    assert [ev.kind for ev in events] == ["stats"] * 4 + ["line"]
    assert all(ev.source == str(log) for ev in events)
    tail = source.tail(3)
    assert len(tail) == 3 and "EngineDeadError" in tail[-1]
    assert not tail[0].startswith("2026-")  # cleaned: docker timestamps stripped
    assert len(source.tail(10_000)) == 13
    source.close()


def test_log_source_marks_itself_down_for_a_missing_file(tmp_path: Path) -> None:
    source = LogSource([FileFollower(tmp_path / "nope.log")], patterns=PATTERNS)
    assert source.poll() == ()
    assert not source.health.up
    assert source.health.last_error is not None and "nope.log" in source.health.last_error


def test_log_source_cap_keeps_important_events_and_last_redraw_per_bar() -> None:
    redraws = [
        f"Processed prompts:  {i % 100:2d}%|  | {i}/9999 [00:01<00:01, 1.0it/s]" for i in range(900)
    ]
    capture = [f"Capturing CUDA graphs:  {i}%|  | {i}/67 [00:01<00:01, 1.0it/s]" for i in range(50)]
    important = [
        "2026-03-30 10:00:00,000 - INFO - cubin_loader.py:90 - flashinfer.jit: Fetching x from "
        "https://edge.urm.nvidia.com/a/x",
        "INFO 04-09 02:05:52 [loader.py:447] Loading weights took 33.15 seconds",
    ]
    lines = redraws[:450] + important[:1] + capture + redraws[450:] + important[1:]
    source = LogSource([ListReader("child", lines)], max_events_per_tick=10, patterns=PATTERNS)
    events = source.poll()
    assert [ev.kind for ev in events] == ["jit", "capture", "progress", "milestone"]
    assert events[1].fields["n"] == 49 and events[2].fields["n"] == 899
    assert source.dropped_events == len(lines) - 4


def test_log_source_cap_still_bounded_when_important_events_flood() -> None:
    lines = [
        f"INFO 04-09 02:05:52 [loader.py:447] Loading weights took {i}.0 seconds" for i in range(30)
    ]
    source = LogSource([ListReader("f", lines)], max_events_per_tick=5, patterns=PATTERNS)
    events = source.poll()
    assert [ev.fields["seconds"] for ev in events] == [25.0, 26.0, 27.0, 28.0, 29.0]


def test_log_source_reports_reader_errors_and_closes_readers() -> None:
    bad = ListReader("bad", ["Application startup complete."], error="cannot read x")
    good = ListReader("good", [])
    source = LogSource([bad, good], patterns=PATTERNS)
    events = source.poll()
    assert [ev.fields["name"] for ev in events] == ["startup_complete"]
    assert not source.health.up and source.health.last_error == "cannot read x"
    source.close()
    assert bad.closed and good.closed


def test_a_bar_frozen_before_attach_is_still_seen(tmp_path: Path) -> None:
    """Attaching to a server already hung: its last tqdm redraw was never terminated, and it
    is the server's state now, although everything before it is skipped."""
    from watchdog.sources.logs.source import LogSource

    log = tmp_path / "vllm.log"
    bar = "Processed prompts:   0%|          | 0/768 [00:00<?, ?it/s]"
    log.write_text(
        "(EngineCore pid=1) ERROR 11-30 08:00:00 [core.py:1] EngineDeadError: old news\n"
        f"Processed prompts:   0%|          | 0/768 [00:00<?, ?it/s]\r{bar}"
    )
    events = LogSource([FileFollower(log)], patterns=PATTERNS).poll()
    assert [(e.kind, e.fields.get("n"), e.fields.get("total")) for e in events] == [
        ("progress", 0, 768)
    ]
