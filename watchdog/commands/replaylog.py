"""`replay` of a plain server log: its lines, the stack dumps it holds, and what it ended inside.

The log is read by the logs package (`scan_bytes`); this module says what that read found.
Kept apart from replay.py (bundles and timelines) so each stays one job. The open operation is
worded as what it is: the cause if the server is stuck now, not proof that it is; `--stuck`
(the operator says the server is hung now) makes it the verdict.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

from watchdog.core.judge.generic import ClassVerdict
from watchdog.core.judge.logverdict import LogMatch
from watchdog.core.judge.rootcause import cause_json, cause_of, print_cause
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.knowledge.sigtext import fill
from watchdog.core.model import LogEvent
from watchdog.core.state.openops import OpenOp, stuck_cause
from watchdog.sources.logs import LogPatterns, log_records, scan_bytes


def read_log(
    data: bytes, sigs: SignatureSet, patterns: LogPatterns | None = None
) -> tuple[list[str], list[LogEvent]]:
    """Every cleaned record of a log, and the events it carries (stack dumps included): the
    full read, for callers that need the records themselves (`replay` only counts them)."""
    return log_records(data), scan_bytes(data, sigs, patterns).events


def report(
    records: int,
    ops: list[OpenOp],
    matches: list[LogMatch],
    sigs: SignatureSet,
    *,
    as_json: bool,
    stuck: bool,
    events: Sequence[LogEvent] = (),
    classes: ClassVerdict | None = None,
) -> int:
    """Print what the log shows; exit 1 when it names a hang (or --stuck names one) or shows a
    generic class (crashed, timed out, stalled, livelock: a signature that matches wins)."""
    from watchdog.commands.replayclass import classes_json

    cause = stuck_cause(ops)
    verdict = cause if stuck and not matches and cause is not None else None
    shown = classes if not matches and verdict is None else None
    dumps = [e for e in events if e.kind == "stack"]
    root = cause_of(events) if matches or shown is not None else None
    if as_json:
        doc = _as_json(matches, ops, cause, verdict, dumps, stuck)
        doc["generic"] = classes_json(shown)
        doc["cause"] = cause_json(root, shown is not None)
        doc["parsed"] = dict(sorted(collections.Counter(e.kind for e in events).items()))
        print(json.dumps(doc, indent=2))
    else:
        _print_text(records, matches, ops, cause, verdict, dumps, sigs, stuck, shown)
        if matches or shown is not None:
            print_cause(root, shown is not None)
    return 1 if matches or verdict is not None or shown is not None else 0


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


def _print_match(m: LogMatch) -> None:
    s = m.signature
    decisive = ", decisive line" if m.decisive else ""
    print(f"{s.id} (confidence {m.confidence:.2f}{decisive}): {fill(s.title, {})}")
    if m.stall:
        print(f"  stall: {m.stall}")
    for line in m.lines:
        print(f"  matched: {line[:300]}")
    print(f"  fix: {s.fix}")


def _print_op(op: OpenOp) -> None:
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


def _print_text(
    records: int,
    matches: list[LogMatch],
    ops: list[OpenOp],
    cause: OpenOp | None,
    verdict: OpenOp | None,
    dumps: list[LogEvent],
    sigs: SignatureSet,
    stuck: bool,
    classes: ClassVerdict | None = None,
) -> None:
    from watchdog.commands.replayclass import print_classes

    if not matches and verdict is None and classes is None:
        print(
            f"no hang signature found in {records} log lines "
            "(log evidence alone; GPU and stack evidence need the live watchdog)"
        )
    for m in matches:
        _print_match(m)
    if classes is not None:  # the verdict first, then what the log holds
        print_classes(classes)
    for d in dumps:
        print(f"stack in the log: {d.line}")
    for op in ops:
        _print_op(op)
    if verdict is not None:
        sig = sigs.get(verdict.signature or "")
        title = fill(sig.title, {}) if sig is not None else ""
        print(f"{verdict.signature} (--stuck: the log ends inside it): {title}")
        print(f"  evidence: {verdict.describe()}")
        if sig is not None:
            print(f"  fix: {sig.fix}")
    elif stuck and not matches:
        why = "no open operation points to a signature" if cause is None else ""
        print(f"--stuck: nothing to name ({why or 'the log names no cause'})")
