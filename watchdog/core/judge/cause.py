"""A root cause read from a log (core/judge/rootcause.py and the readings it calls)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    """A root cause read from the log: what it is, its fix, and the line that says it."""

    kind: str  # cuda | toolchain | collective_setup | transport | engine_loop | signal
    summary: str
    fix: str
    line: str
    stage: str = ""  # collective_setup: bootstrap | init | first collective

    def text(self) -> str:
        return self.summary + (f" (stage: {self.stage})" if self.stage else "")
