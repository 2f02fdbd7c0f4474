"""Verdict and state-change lines on stderr: one readable line, or one JSON object per event."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from watchdog.core.model import Verdict, to_dict


class Emitter:
    """Writes one line per event; `--log-format json` makes each line a JSON object."""

    def __init__(
        self,
        fmt: str = "text",
        stream: TextIO | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.wall = wall

    def event(self, kind: str, message: str, **fields: Any) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))
        if self.fmt == "json":
            line = json.dumps(
                {"ts": stamp, "event": kind, "message": message, **fields}, default=str
            )
        else:
            line = f"{stamp} hang-watchdog {kind}: {message}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed: nothing better to do than carry on
            pass

    def state_change(self, old: str | None, verdict: Verdict) -> None:
        if verdict.signature:
            cause = f"{verdict.signature} ({verdict.confidence:.2f}) {verdict.title}"
            msg = f"{old or '-'} -> {verdict.state}: {cause}"
        else:
            msg = f"{old or '-'} -> {verdict.state}: {verdict.reason}"
        self.event("state", msg, old=old, new=verdict.state, verdict=to_dict(verdict))
        if verdict.signature or verdict.state == "stalled":
            self.verdict(verdict)

    def verdict(self, verdict: Verdict) -> None:
        if self.fmt == "json":
            self.event("verdict", verdict.title or verdict.reason, verdict=to_dict(verdict))
            return
        self.event("verdict", one_line(verdict))


def one_line(v: Verdict) -> str:
    """A verdict as one stderr line: state, cause, evidence and fix, separated by ' | '."""
    head = (
        f"{v.state}: {v.signature} ({v.confidence:.2f}) {v.title}"
        if v.signature
        else f"{v.state}: {v.reason}"
    )
    parts = [head]
    if v.evidence:
        parts.append("evidence: " + "; ".join(f"[{e.source}] {e.detail}" for e in v.evidence))
    if v.fix:
        parts.append(f"fix: {v.fix}")
    if v.commands:
        parts.append("run: " + " ;; ".join(v.commands))
    return " | ".join(p.replace("\n", " ") for p in parts)


def format_verdict(v: Verdict) -> str:
    """A verdict as a few readable lines: state, cause, evidence, fix."""
    lines = [f"state: {v.state}"]
    if v.signature:
        lines.append(f"cause: {v.signature} (confidence {v.confidence:.2f}): {v.title}")
    elif v.reason:
        lines.append(f"why: {v.reason}")
    if v.seconds_since_progress is not None:
        lines.append(f"seconds since progress: {v.seconds_since_progress:.0f}")
    if v.evidence:
        lines.append("evidence:")
        lines += [f"  - [{e.source}] {e.detail}" for e in v.evidence]
    if v.fix:
        lines.append(f"fix: {v.fix}")
    if v.commands:
        lines.append("commands:")
        lines += [f"  $ {c}" for c in v.commands]
    if v.references:
        lines.append("references: " + ", ".join(v.references))
    return "\n".join(lines)
