"""The generic classes' schema: crashed, timed out, stalled, livelock, as data.

`[[generic]]` entries of signatures.toml are parsed into these (core/knowledge/genericparse.py)
and evaluated against log lines by core/judge/generic.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GENERIC_KINDS = frozenset({"line", "repeat", "stats_stall", "same_lines", "traceback_end"})
GENERIC_STATES = frozenset({"dead", "hung", "stalled"})


@dataclass(frozen=True)
class GenericRule:
    """One way a generic class shows in a log."""

    kind: str
    label: str
    pattern: re.Pattern[str] | None = None
    count: int = 1  # repeat / stats_stall / same_lines: how many lines at least
    min_s: float = 0.0  # stats_stall: the span the lines cover by their own timestamps
    # repeat: a line that shows the work moved on (a request answered); only the lines after
    # the last one count
    reset: re.Pattern[str] | None = None


@dataclass(frozen=True)
class GenericClass:
    """A class of failure that generalises across causes (crashed, timed_out, ...)."""

    id: str
    state: str
    title: str
    needs: str  # the live evidence that would name the cause
    commands: tuple[str, ...]
    rules: tuple[GenericRule, ...]
    unless: tuple[re.Pattern[str], ...] = ()  # a line matching one of these is a near miss
    # A traceback whose header (or the record just before it) matches one of these was logged
    # by a handler that answers one request or call with the error and carries on: the server
    # survived it, so a log that ends inside it does not show the end of a process.
    survived: tuple[re.Pattern[str], ...] = ()
    origin: str = ""
