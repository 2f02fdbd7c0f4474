"""`replay` of a plain server log: its lines, the stack dumps it holds, and what it ended inside.

Kept apart from replay.py (bundles and timelines) so each stays one job. The open operation is
worded as what it is: the cause if the server is stuck now, not proof that it is; `--stuck`
(the operator says the server is hung now) makes it the verdict.
"""

from __future__ import annotations

import json
from typing import Any

from watchdog.core.logverdict import LogMatch
from watchdog.core.model import LogEvent
from watchdog.core.openops import OpenOp, load_ops, open_operations, stuck_cause
from watchdog.core.signatures import SignatureSet
from watchdog.sources.linesplit import Block, LineSplitter, split_records
from watchdog.sources.logparse import clean_line
from watchdog.sources.logscan import BlockScanner, StackBlocks
from watchdog.sources.logstacks import StackScanner


def read_log(data: bytes, sigs: SignatureSet) -> tuple[list[str], list[LogEvent]]:
    """The cleaned records of a log, and the events they carry (stack dumps included)."""
    splitter = LineSplitter()
    raw = splitter.feed(data) + [x for x in [splitter.flush()] if x]
    records = [rec for line in raw for rec in split_records(clean_line(line))]
    # The events through the live source's block path: the same events as parsing every line
    # (tests/test_logscan.py), with only the lines holding a literal key parsed.
    stacks = StackScanner()
    block = Block(data.replace(b"\x00", b"") if b"\x00" in data else data)
    events, _ = StackBlocks(BlockScanner(sigs.log_keep_pattern())).scan(block, "replay", stacks)
    return records, events + stacks.flush("replay")


def report(
    lines: list[str],
    events: list[LogEvent],
    matches: list[LogMatch],
    sigs: SignatureSet,
    *,
    as_json: bool,
    stuck: bool,
) -> int:
    """Print what the log shows; exit 1 when it names a hang (or --stuck names one)."""
    ops = open_operations(lines, load_ops())
    cause = stuck_cause(ops)
    verdict = cause if stuck and not matches and cause is not None else None
    dumps = [e for e in events if e.kind == "stack"]
    if as_json:
        print(json.dumps(_as_json(matches, ops, cause, verdict, dumps, stuck), indent=2))
    else:
        _print_text(lines, matches, ops, cause, verdict, dumps, sigs, stuck)
    return 1 if matches or verdict is not None else 0


def _op_json(op: OpenOp) -> dict[str, Any]:
    return {
        "operation": op.op.id,
        "what": op.op.what,
        "line": op.line,
        "who": op.who or None,
        "since": op.since,
        "open_s": op.open_s,
        "progress_after": op.progress_after,
        "signature": op.signature,
        "note": op.op.note,
    }


def _as_json(
    matches: list[LogMatch],
    ops: list[OpenOp],
    cause: OpenOp | None,
    verdict: OpenOp | None,
    dumps: list[LogEvent],
    stuck: bool,
) -> dict[str, Any]:
    return {
        "matches": [
            {
                "signature": m.signature.id,
                "confidence": m.confidence,
                "decisive": m.decisive,
                "lines": m.lines,
                "stall": m.stall,
            }
            for m in matches
        ],
        "stacks_in_log": [e.line for e in dumps],
        "open_operations": [_op_json(o) for o in ops],
        "points_to": cause.signature if cause is not None else None,
        "stuck": stuck,
        "stuck_verdict": verdict.signature if verdict is not None else None,
    }


def _print_text(
    lines: list[str],
    matches: list[LogMatch],
    ops: list[OpenOp],
    cause: OpenOp | None,
    verdict: OpenOp | None,
    dumps: list[LogEvent],
    sigs: SignatureSet,
    stuck: bool,
) -> None:
    if not matches and verdict is None:
        print(
            f"no hang signature found in {len(lines)} log lines "
            "(log evidence alone; GPU and stack evidence need the live watchdog)"
        )
    for m in matches:
        s = m.signature
        decisive = ", decisive line" if m.decisive else ""
        print(f"{s.id} (confidence {m.confidence:.2f}{decisive}): {s.title}")
        if m.stall:
            print(f"  stall: {m.stall}")
        for line in m.lines:
            print(f"  matched: {line[:300]}")
        print(f"  fix: {s.fix}")
    for d in dumps:
        print(f"stack in the log: {d.line}")
    for op in ops:
        print(f"open operation: {op.describe()}")
        print(f"  line: {op.line[:300]}")
        if op.progress_after:
            print("  the server made progress after it started: it is not what blocks it")
        elif op.signature:
            print(
                f"  points to {op.signature}: the cause if the server is stuck now, not proof "
                "that it is (rerun with --stuck if it is hung now)"
            )
        else:
            print(f"  {op.op.note}")
    if verdict is not None:
        sig = sigs.get(verdict.signature or "")
        title = sig.title if sig is not None else ""
        print(f"{verdict.signature} (--stuck: the log ends inside it): {title}")
        print(f"  evidence: {verdict.describe()}")
        if sig is not None:
            print(f"  fix: {sig.fix}")
    elif stuck and not matches:
        why = "no open operation points to a signature" if cause is None else ""
        print(f"--stuck: nothing to name ({why or 'the log names no cause'})")
