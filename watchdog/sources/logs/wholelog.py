"""A whole log already in memory (`replay FILE`), read in one pass: events, records, operations.

The events are the live source's (the same prefilter, parser and stack scanner over one
block); the record count and the operations the log ended inside (core/state/openops.py) come from
the same pass, without splitting most of the lines. `log_records` is the full read (every line
split, cleaned and kept), the reference tests/test_replay_scan.py compares scan_bytes with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import LogEvent
from watchdog.core.state.openops import OpenOp, operations_in, trigger_patterns
from watchdog.sources.logs.parse import LogPatterns, clean_line
from watchdog.sources.logs.prefilter import Prefilter, keys_of, spans_at
from watchdog.sources.logs.scan import BlockScanner, StackBlocks
from watchdog.sources.logs.split import Block, LineSplitter, count_lines, split_records
from watchdog.sources.logs.stackdumps import StackScanner
from watchdog.sources.logs.unwrap import unwrap_frames

_SOURCE = "replay"

# Where split_records can find a record glued onto a tqdm bar: after `]`, a date, a vLLM
# `(Proc pid=N) ` prefix or a level word (split._GLUED, loosened to a superset on bytes: any
# non-ASCII byte may start a Unicode digit).
_GLUE_HINT = re.compile(rb"\][ \t]*(?:[0-9(\x80-\xff]|INFO |WARNING |ERROR |DEBUG |CRITICAL )")


@dataclass(frozen=True)
class LogScan:
    """What a whole log holds, read without visiting most of its lines."""

    records: int  # log records (log_records' length), counted, not built
    events: list[LogEvent]
    ops: list[OpenOp]


def scan_bytes(
    data: bytes,
    sigs: SignatureSet,
    patterns: LogPatterns | None = None,
    *,
    ops: Sequence[OpDef] | None = None,
) -> LogScan:
    """The events of a whole log (stack dumps included), its record count and the operations
    it ended inside. `sigs` gives the keep pattern and the operations table, `patterns` the
    engine log formats (None: the engine-neutral formats only), `ops` other operations."""
    ops = sigs.ops if ops is None else ops  # the table loaded with the signatures
    data = data.replace(b"\x00", b"") if b"\x00" in data else data
    data = unwrap_frames(data)  # a pasted traceback's frames, joined where a terminal wrapped
    block = Block(data)
    stacks = StackScanner()
    scanner = BlockScanner(sigs.log_keep_pattern(), patterns=patterns)
    events, _ = StackBlocks(scanner).scan(block, _SOURCE, stacks)
    glued = spans_at(data, [m.start() for m in _GLUE_HINT.finditer(data)] + _escapes(data))
    extra = sum(len(split_records(clean_line(block.text(a, b)))) - 1 for a, b in glued)
    keys = keys_of(trigger_patterns(ops))
    items = [
        (start + j, rec)
        for start, end in Prefilter(keys).spans(data)
        for j, rec in enumerate(split_records(clean_line(block.text(start, end))))
    ]
    found = operations_in(items, ops, lambda: _records_backwards(block))
    return LogScan(count_lines(data) + extra, events + stacks.flush(_SOURCE), found)


def log_records(data: bytes) -> list[str]:
    """Every cleaned record of a log, in order (the full read scan_bytes stands in for)."""
    splitter = LineSplitter()
    raw = splitter.feed(unwrap_frames(data)) + [x for x in [splitter.flush()] if x]
    return [rec for line in raw for rec in split_records(clean_line(line))]


def _escapes(data: bytes) -> list[int]:
    out, i = [], data.find(b"\x1b")
    while i >= 0:
        out.append(i)
        i = data.find(b"\x1b", i + 1)
    return out


def _records_backwards(block: Block) -> Iterator[str]:
    for text in block.last_lines():
        yield from reversed(split_records(clean_line(text)))
