"""The prefiltered block path keeps exactly the events of the line-by-line path.

The old path (LineSplitter, then clean_line, split_records and parse_line on every line) and
the new one (BlockSplitter, prefilter over whole blocks, parse only candidate lines) run over the
same input: every real sample in tests/data/logs/ plus noise made to trip a prefilter up (keys
split by ANSI colour codes or NULs, over-long lines, invalid UTF-8, bare `\\r` redraws, CRLF
split across chunks, blank lines), fed in random chunk sizes.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.fakes import DATA, STACKS, workload
from tests.shipped import PATTERNS
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import LogEvent
from watchdog.core.state.openops import keep_with_ops
from watchdog.sources.logs.parse import clean_line, literal_keys, parse_line
from watchdog.sources.logs.prefilter import Prefilter, required_literals
from watchdog.sources.logs.scan import (
    BlockScanner,
    StackBlocks,
    parse_lines,
    parse_text,
    prefilter_for,
    tail_lines,
)
from watchdog.sources.logs.source import FileFollower, LogSource, StreamReader
from watchdog.sources.logs.split import BlockSplitter, LineSplitter, count_lines, split_records
from watchdog.sources.logs.stackdumps import StackScanner

KEEP = keep_with_ops(load_signatures().log_keep_pattern(), load_ops())  # what LogSource keeps


def chunks(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.choice([1, 2, 7, 100, 4096, 65536, 1 << 20])
        out.append(data[i : i + n])
        i += n
    return out


def old_path(pieces: list[bytes], source: str = "t") -> tuple[list[LogEvent], int]:
    """The line path: every line split, decoded, cleaned, fed to the stack scanner, parsed."""
    splitter, stacks = LineSplitter(), StackScanner()
    lines = [line for piece in pieces for line in splitter.feed(piece)]
    lines += [x for x in [splitter.flush()] if x]
    events: list[LogEvent] = []
    for raw in lines:
        line = clean_line(raw)
        events += stacks.feed(line, source)
        if line:
            events += parse_text(line, source, KEEP, PATTERNS)
    return events + stacks.flush(source), len(lines)


def new_path(pieces: list[bytes], prefilter: Prefilter) -> tuple[list[LogEvent], int]:
    splitter, stacks = BlockSplitter(), StackScanner()
    walker = StackBlocks(BlockScanner(KEEP, prefilter=prefilter, patterns=PATTERNS))
    events: list[LogEvent] = []
    count = 0
    blocks = [splitter.feed(piece) for piece in pieces] + [splitter.flush()]
    for block in blocks:
        if block is not None:
            found, rest = walker.scan(block, "t", stacks)
            assert rest is None
            events += found
            count += block.count()
    return events + stacks.flush("t"), count


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("hyperscan", [True, False])
def test_block_path_keeps_exactly_the_events_of_the_line_path(seed: int, hyperscan: bool) -> None:
    pieces = chunks(workload(seed), seed)
    prefilter = prefilter_for(KEEP, hyperscan=hyperscan, patterns=PATTERNS)
    assert prefilter.engine == ("hyperscan" if hyperscan else "find")
    old_events, old_count = old_path(pieces)
    new_events, new_count = new_path(pieces, prefilter)
    assert len(old_events) > 100  # the samples carry many events; the comparison means something
    assert {e.kind for e in old_events} >= {
        "stats",
        "jit",
        "milestone",
        "line",
        "progress",
        "stack",
    }
    assert new_events == old_events
    assert new_count == old_count


def test_the_verdict_of_a_replayed_log_is_unchanged(tmp_path: Path) -> None:
    from watchdog.core.judge.logverdict import name_signatures

    sigs = load_signatures()
    pieces = [workload(7)]
    old = name_signatures(old_path(pieces)[0], sigs)
    new = name_signatures(new_path(pieces, prefilter_for(KEEP, patterns=PATTERNS))[0], sigs)
    assert [(m.signature.id, m.confidence, m.lines) for m in new] == [
        (m.signature.id, m.confidence, m.lines) for m in old
    ]
    assert old  # the samples name at least one signature


class LinePath:
    """LogSource.poll done line by line over a FileFollower's lines: every line cleaned, fed to
    the stack scanner and parsed; dumps that got no line since the last poll end; an
    unterminated bar is reported once per distinct text. The reference for the block path."""

    def __init__(self, follower: FileFollower) -> None:
        self._f = follower
        self._stacks = StackScanner()
        self._held = ""
        self.tail: list[str] = []

    def poll(self) -> list[LogEvent]:
        name, events = self._f.name, []
        for raw in self._f.read():
            line = clean_line(raw)
            events += self._stacks.feed(line, name)
            if line:
                self.tail.append(line[:8192])
                events += parse_text(line, name, KEEP, PATTERNS)
        events += self._stacks.tick(name)
        for raw in self._f.partials():
            line = clean_line(raw)
            if line and line != self._held:
                self._held = line
                event = parse_line(line, source=name, patterns=PATTERNS)
                if event is not None and event.kind in ("progress", "loading", "capture"):
                    events.append(event)
        return events


def test_live_source_keeps_the_same_events_and_tail_as_the_line_path(tmp_path: Path) -> None:
    data = workload(4) + STACKS
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    keep = load_signatures().log_keep_pattern()
    kw = {"keep": keep, "patterns": PATTERNS, "ops": load_ops(), "max_events_per_tick": 10**6,
          "tail_lines": 300}  # fmt: skip
    new = LogSource([FileFollower(log)], **kw)  # type: ignore[arg-type]
    old = LinePath(FileFollower(log))
    assert new.poll() == () and old.poll() == []
    new_events: list[LogEvent] = []
    old_events: list[LogEvent] = []
    for piece in chunks(data, 4):
        with log.open("ab") as f:
            f.write(piece)
        new_events += new.poll()
        old_events += old.poll()
    while new.carried:  # a loaded machine can spend the budget: the rest comes next poll
        new_events += new.poll()
    assert len(old_events) > 100 and any(e.kind == "stack" for e in old_events)
    assert new_events == old_events
    assert new.tail(300) == old.tail[-300:]


@pytest.mark.parametrize("seed", range(20))
def test_count_lines_counts_what_line_splitter_returns(seed: int) -> None:
    rng = random.Random(seed)
    data = bytes(rng.choice(b"ab\r\n\n ") for _ in range(rng.randint(0, 300)))
    splitter = LineSplitter()
    lines = splitter.feed(data) + [x for x in [splitter.flush()] if x]
    assert count_lines(data) == len(lines)


def test_tail_lines_are_the_last_cleaned_lines() -> None:
    block = BlockSplitter().feed(b"a\n\x1b[31m\x1b[0m\nb\rc\r\n\nd\n")
    assert block is not None
    assert tail_lines(block, 2, 100) == ["c", "d"]
    assert tail_lines(block, 10, 100) == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        (r"ab\d+cd", ("ab",)),
        (r"(x|yz)q", ("q",)),
        (r"(Fetching|Downloading) file", ("Fetching", "Downloading")),
        (r"(EngineDeadError|RPC call to \S+ timed out)", ("EngineDeadError", "RPC call to ")),
        (r"ProcessGroupNCCL.*[Tt]imeout", ("ProcessGroupNCCL",)),
        (r"foo(bar)+", ("foo",)),
        (r"\d+ reqs", (" reqs",)),
        (r"\d+", None),
        (r"(?i)enginedead", None),
        (r"a|\d", None),
        (r"(x)?", None),
    ],
)
def test_required_literals(pattern: str, literals: tuple[str, ...] | None) -> None:
    assert required_literals(re.compile(pattern)) == literals


def test_every_kept_sample_line_holds_a_key() -> None:
    """The keys really are necessary conditions on the real samples."""
    keys = [*literal_keys(PATTERNS), *(required_literals(KEEP) or ())]
    lines = [ln for p in sorted(DATA.glob("*.log")) for ln in p.read_text().splitlines()]
    kept = [e.line for e in parse_lines(lines, "t", KEEP, PATTERNS)]
    assert kept and all(any(k in line for k in keys) for line in kept)


def test_a_keep_rule_without_a_literal_turns_the_prefilter_off() -> None:
    assert prefilter_for(re.compile(r"\d{3} errors")).engine != "off"
    assert prefilter_for(re.compile(r"(?i)engine dead")).engine == "off"
    block = BlockSplitter().feed(b"x ENGINE DEAD y\nother\n")
    assert block is not None
    scanner = BlockScanner(re.compile(r"(?i)engine dead"))
    assert [e.line for e in scanner.scan(block, "t")[0]] == ["x ENGINE DEAD y"]


def test_parsing_stops_at_the_deadline_and_carries_what_it_left() -> None:
    lines = b"".join(b"EngineDeadError number %d\nnoise %d\n" % (i, i) for i in range(1000))
    block = BlockSplitter().feed(lines)
    assert block is not None
    ticks = iter(range(10**6))
    scanner = BlockScanner(KEEP, clock=lambda: float(next(ticks)))
    events, rest = scanner.scan(block, "t", deadline=3.0)
    assert 0 < len(events) < 1000 and rest is not None
    assert b"noise" not in rest.data  # lines no key is in cannot matter: not carried
    later, none = BlockScanner(KEEP).scan(rest, "t")
    assert none is None
    assert [e.line for e in events + later] == [f"EngineDeadError number {i}" for i in range(1000)]


def test_a_flood_over_the_budget_is_carried_reported_and_bounded(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    calls: list[tuple[str, int]] = []
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # every look at the clock costs a millisecond
        return now[0]

    follower = FileFollower(log, max_bytes_per_read=1 << 20, max_lag_bytes=2 << 20)
    source = LogSource(
        [follower],
        keep=KEEP,
        patterns=PATTERNS,
        budget_s=0.05,
        clock=clock,
        on_skip=lambda r, n: calls.append((r, n)),
    )
    source.poll()
    line = b"(EngineCore pid=1) ERROR EngineDeadError: flood\n"
    with log.open("ab") as f:
        f.write(line * ((8 << 20) // len(line)))  # 8 MiB: four times the lag bound
    events = list(source.poll())
    assert events  # the newest lines are still read and parsed
    assert source.carried > 0  # the budget ran out: the rest waits for the next polls
    polls = 1
    while source.carried and polls < 10_000:
        events += source.poll()
        polls += 1
    assert source.carried == 0
    assert follower.skipped > 0 and source.skipped["lag"] == follower.skipped
    assert source.skipped["budget"] == 0  # carried, not dropped
    assert dict(calls) == {"lag": source.skipped["lag"]}
    lines_in_file = log.stat().st_size // len(line)
    parsed = len(events) + source.dropped_events
    assert parsed + source.skipped["lag"] == lines_in_file


def test_stream_reader_drop_is_reported_through_the_hook() -> None:
    import subprocess
    import sys

    code = "import sys\nfor i in range(5000): print(f'line {i} EngineDeadError')\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    reader = StreamReader(proc.stdout, "child", max_lines=100)  # type: ignore[arg-type]
    proc.wait(timeout=20)
    assert reader.wait(timeout=20)
    calls: list[tuple[str, int]] = []
    source = LogSource(
        [reader], keep=KEEP, patterns=PATTERNS, on_skip=lambda r, n: calls.append((r, n))
    )
    events = source.poll()
    assert len(events) + source.dropped_events == 100
    assert calls == [("dropped", 4900)] and source.skipped["dropped"] == 4900


def test_replay_reads_the_same_records_and_events_as_the_line_path() -> None:
    from watchdog.commands.replaylog import read_log

    sigs = load_signatures()
    keep = sigs.log_keep_pattern()
    data = workload(9) + STACKS
    splitter, stacks = LineSplitter(), StackScanner()
    records: list[str] = []
    events: list[LogEvent] = []
    for line in splitter.feed(data) + [x for x in [splitter.flush()] if x]:  # main's read_log
        cleaned = clean_line(line)
        events += stacks.feed(cleaned, "replay")
        for rec in split_records(cleaned):
            records.append(rec)
            ev = parse_line(rec, "replay", keep, PATTERNS)
            if ev is not None:
                events.append(ev)
    events += stacks.flush("replay")
    assert any(e.kind == "stack" for e in events)
    assert read_log(data, sigs, PATTERNS) == (records, events)
