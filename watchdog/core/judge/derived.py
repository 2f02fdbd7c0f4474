"""Lines the log implies but no process wrote, read once for live and `replay` alike (pure).

Two readings of many lines become one line each, which a signature's log rule matches like any
other: ranks whose NCCL watchdogs disagree on the collective (core/judge/divergence.py), and a
communicator that never came up, as the root-cause reading finds it (core/judge/setupcause.py
setup_cause: NCCL's error trail into init.cc, an NCCL error before init completed, an NVSHMEM
endpoint or bootstrap failure, a rendezvous that timed out). The set-up failure is read in one
place, so the verdict's name and the root cause under it cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from watchdog.core.judge.divergence import divergence
from watchdog.core.judge.rootcause import cause_of
from watchdog.core.judge.setupcause import setup_hinted
from watchdog.core.model import LogEvent

SETUP_PREFIX = "communicator set-up failed (read from the log): "


def setup_line(events: Sequence[LogEvent]) -> tuple[str, str] | None:
    """(the derived line, the log line it was read from) when the log's root cause is a
    communicator set-up failure, else None. A log without a word of a set-up reading is not
    read further: the live watch derives its lines on every tick."""
    if not any(_hinted(e) for e in events):
        return None
    cause = cause_of(events)
    if cause is None or cause.kind != "collective_setup":
        return None
    return f"{SETUP_PREFIX}{cause.text()}", cause.line


def _hinted(ev: LogEvent) -> bool:
    exc = ev.fields.get("exception") if ev.kind == "stack" else None
    return setup_hinted(ev.line) or (bool(exc) and setup_hinted(str(exc)))


def with_derived(events: Sequence[LogEvent]) -> list[LogEvent]:
    """`events` with the derived lines in place: the set-up failure right after the line it was
    read from (a cause before the death it led to), the divergence at the end."""
    out = list(events)
    setup = setup_line(out)
    if setup is not None:
        line, source = setup
        at = next((i for i, e in enumerate(out) if e.line == source), len(out) - 1)
        out.insert(at + 1, LogEvent(kind="line", line=line, source="derived"))
    found = divergence(e.line for e in events)
    if found is not None:
        out.append(LogEvent(kind="line", line=found, source="derived"))
    return out


def derived_lines(events: Sequence[LogEvent]) -> tuple[str, ...]:
    """The derived lines alone (the live window's view)."""
    return tuple(e.line for e in with_derived(events) if e.source == "derived")
