"""The server's states, one enum: a typo in a state is an error, not a new label.

Each member is its own string ("hung" == State.HUNG, and str/format/JSON give "hung"), so the
`hang_watchdog_state` labels, `incident.json` and the timeline read exactly as before.
"""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    """What the watchdog says the server is doing (docs/signatures-and-engines.md)."""

    # `str, Enum` rather than StrEnum: the package still supports Python 3.10.
    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    IDLE = "idle"
    SERVING = "serving"
    CRAWLING = "crawling"  # a known long operation progressing slower than its bound
    STALLED = "stalled"
    HUNG = "hung"
    DEAD = "dead"

    # The value wherever the state is printed (f-strings, logs, label values), on every Python.
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


__all__ = ["State"]
