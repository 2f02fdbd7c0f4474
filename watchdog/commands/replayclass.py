"""What `replay` of a plain log says when no signature names a cause: the generic class it
shows (core/judge/generic.py), its decisive line, and the live command that would name the cause."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from watchdog.core.judge.generic import ClassVerdict, class_verdict, find_classes, timestamp_s
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import LogEvent
from watchdog.core.thresholds import Thresholds
from watchdog.sources.logs.parse import clean_line, collector_time
from watchdog.sources.logs.split import split_records
from watchdog.sources.logs.unwrap import unwrap_frames

TAIL_LINES = 400  # livelock and a cut traceback are read from the log's last lines only


def tail_records(data: bytes, n: int = TAIL_LINES) -> tuple[list[str], list[float | None]]:
    """The cleaned records of the log's last `n` lines, and the time each one's collector prefix
    gave it (docker -t, journald, a Rust logger's stamp; None without one): a record with no
    time of its own is judged by that one."""
    lines = unwrap_frames(data[-256 * n :]).decode("utf-8", errors="replace").splitlines()[-n:]
    records: list[str] = []
    times: list[float | None] = []
    for line in lines:
        stamp = collector_time(line)
        at = timestamp_s(stamp) if stamp else None
        for rec in split_records(clean_line(line)):
            records.append(rec)
            times.append(at)
    return records, times


def log_classes(
    events: Sequence[LogEvent], data: bytes, sigs: SignatureSet, th: Thresholds | None = None
) -> ClassVerdict | None:
    """The generic class a plain log shows, or None (judged by `th`, else the defaults)."""
    deadline = (th or Thresholds()).load_deadline_s
    tail, times = tail_records(data)
    return class_verdict(find_classes(events, sigs.generic, tail, deadline, times))


def classes_json(verdict: ClassVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    p = verdict.primary
    return {
        "class": p.cls.id,
        "state": verdict.state,
        "title": p.cls.title,
        "rule": p.label,
        "line": p.line,
        "detail": p.detail or None,
        "also": [f.cls.id for f in verdict.findings[1:]],
        "needs": p.cls.needs,
        "commands": list(p.cls.commands),
    }


def print_classes(verdict: ClassVerdict) -> None:
    p = verdict.primary
    detail = f" ({p.detail})" if p.detail else ""
    print(f"{p.cls.id} (state {verdict.state}, no signature names the cause): {p.cls.title}")
    print(f"  {p.label}{detail}: {p.line[:300]}")
    for f in verdict.findings[1:]:
        print(f"  also {f.cls.id}: {f.label}: {f.line[:200]}")
    print(f"  what would name the cause: {p.cls.needs}")
    for cmd in p.cls.commands:
        print(f"  run: {cmd}")
