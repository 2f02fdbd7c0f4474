"""The small interface every source implements, and the down-marking every source shares."""

from __future__ import annotations

import logging
import re
from typing import Protocol

log = logging.getLogger("hang_watchdog.sources")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


class SourceHealth:
    """Tracks whether a source is up and logs each distinct error once per outage, not once
    per tick: a new outage (after the source was up) is always logged, even with a cause seen
    before, and an error whose text keeps changing is logged at most `max_distinct` times."""

    def __init__(self, name: str, logger: logging.Logger = log, *, max_distinct: int = 5) -> None:
        self.name = name
        self.up = False
        self.last_error: str | None = None
        self.outages = 0
        self._seen: set[str] = set()
        self._max_distinct = max_distinct
        self._log = logger

    def ok(self) -> None:
        if not self.up and self.last_error is not None:
            self._log.info("source %s is up again", self.name)
        self.up = True
        self.last_error = None
        self._seen.clear()  # the next outage is news, whatever its cause

    def down(self, error: str) -> None:
        if self.up or self.last_error is None:
            self.outages += 1
        self.up = False
        self.last_error = error
        # "no samples for 12 s" and "... for 13 s" are the same error: numbers do not count.
        key = _DIGITS.sub("N", error)
        if key in self._seen or len(self._seen) > self._max_distinct:
            return
        self._seen.add(key)
        if len(self._seen) > self._max_distinct:
            self._log.warning(
                "source %s is still down: %s (further errors of this outage are not logged)",
                self.name,
                error,
            )
        else:
            self._log.warning("source %s is down: %s", self.name, error)


class Source(Protocol):
    """One signal. `poll()` returns what it could read this tick; it never raises."""

    name: str
    health: SourceHealth

    def poll(self) -> object: ...

    def close(self) -> None: ...
