"""Verdict and state-change output on stderr: short lines and one verdict block for a person,
or one JSON object per event for machines (`--log-format json`, unchanged)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from watchdog.core.model import Verdict, to_dict

STAMP = "%Y-%m-%dT%H:%M:%SZ"  # the one timestamp format of every line the watchdog writes
WIDTH = 100
RULE = "-" * 72
BAD = frozenset({"hung", "stalled", "dead"})
WATCH = frozenset({"suspect", "starting", "loading", "compiling"})
_SGR = {"bad": "1;31", "watch": "33", "good": "32", "head": "1", "dim": "2"}


def use_color(stream: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def paint(text: str, role: str, color: bool) -> str:
    """`text` in the colour of `role` when colour is on."""
    return f"\033[{_SGR[role]}m{text}\033[0m" if color and role in _SGR else text


def state_role(state: str) -> str:
    """Red for a hang, yellow for states worth watching, green for the rest."""
    return "bad" if state in BAD else "watch" if state in WATCH else "good"


class Emitter:
    """Writes one line per event; `--log-format json` makes each line a JSON object."""

    def __init__(
        self,
        fmt: str = "text",
        stream: TextIO | None = None,
        wall: Callable[[], float] = time.time,
        color: bool | None = None,
    ) -> None:
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.wall = wall
        self.color = use_color(self.stream) if color is None else color
        # What remediation does about a verdict (set by the wiring, which knows the config).
        self.remediation: Callable[[Verdict], str] | None = None

    def event(self, kind: str, message: str, **fields: Any) -> None:
        stamp = time.strftime(STAMP, time.gmtime(self.wall()))
        if self.fmt == "json":
            line = json.dumps(
                {"ts": stamp, "event": kind, "message": message, **fields}, default=str
            )
        else:
            line = f"{stamp} hang-watchdog {kind}: {message}"
        self._write(line + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed: nothing better to do than carry on
            pass

    def state_change(self, old: str | None, verdict: Verdict) -> None:
        new = paint(verdict.state, state_role(verdict.state), self.color and self.fmt == "text")
        if verdict.signature:
            cause = f"{verdict.signature} ({verdict.confidence:.2f}) {verdict.title}"
        else:
            cause = verdict.reason
        if self.fmt == "json":
            msg = f"{old or '-'} -> {verdict.state}: {cause}"
            self.event("state", msg, old=old, new=verdict.state, verdict=to_dict(verdict))
        else:
            self.event("state", f"{old or '-'} -> {new}: {cause}")
        if verdict.signature or verdict.state == "stalled":
            self.verdict(verdict)

    def verdict(self, verdict: Verdict) -> None:
        if self.fmt == "json":
            self.event("verdict", verdict.title or verdict.reason, verdict=to_dict(verdict))
            return
        plan = self.remediation(verdict) if self.remediation is not None else ""
        stamp = time.strftime(STAMP, time.gmtime(self.wall()))
        block = format_verdict(verdict, color=self.color, remediation=plan)
        self._write(f"{stamp} hang-watchdog verdict:\n{RULE}\n{block}\n{RULE}\n")


def _wrap(label: str, text: str, width: int = WIDTH) -> list[str]:
    """`label` then `text` wrapped, continuation lines indented under the text."""
    pad = " " * 12
    out: list[str] = []
    for n, para in enumerate(p for p in text.splitlines() if p.strip()):
        first = f"{label:<12}" if n == 0 else pad
        out += _fill(para, width, first, pad) or [first]
    return out or [label]


def _item(text: str, width: int = WIDTH) -> list[str]:
    return _fill(text, width, "  - ", "    ")


def _fill(text: str, width: int, first: str, rest: str) -> list[str]:
    """Wrapped at spaces only: URLs, paths and flags stay whole, so they can be copied."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    )


def format_verdict(v: Verdict, *, color: bool = False, remediation: str = "") -> str:
    """One verdict block: what, why, evidence, fix, the commands, and what remediation does."""
    state = paint(v.state.upper(), state_role(v.state), color)
    if v.signature:
        lines = [f"{state}  {v.signature} (confidence {v.confidence:.2f})"]
        lines += _wrap("what", v.title)
    else:
        lines = [state]
    why = v.reason if v.reason and v.reason != v.title else ""
    if v.seconds_since_progress is not None and "no progress for" not in why:
        why = f"no progress for {v.seconds_since_progress:.0f} s" + (f"; {why}" if why else "")
    if why:
        lines += _wrap("why", why)
    if v.engine and (v.signature or v.evidence):
        lines += _wrap("engine", v.engine)
    if v.witnesses and (v.signature or v.evidence):
        lines += _wrap("pending", "work pending, as said by: " + "; ".join(v.witnesses))
    if v.evidence:
        lines.append(paint("evidence", "head", color))
        lines += [x for e in v.evidence for x in _item(f"[{e.source}] {e.detail}")]
    if v.fix:
        lines += _wrap("fix", v.fix)
    if v.commands:
        lines.append(paint("run", "head", color))
        lines += [f"  $ {c}" for c in v.commands]
    if remediation:
        lines += _wrap("remediation", remediation)
    if v.references:
        lines.append(paint("references", "dim", color))
        lines += [f"  - {r}" for r in v.references]
    return "\n".join(lines)
