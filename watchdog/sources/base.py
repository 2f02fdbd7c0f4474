"""The small interface every source implements, and the down-marking every source shares."""

from __future__ import annotations

import logging
import re
from typing import Protocol

log = logging.getLogger("hang_watchdog.sources")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


class SourceHealth:
    """Tracks whether a source is up and logs each distinct error once, not once per tick."""

    def __init__(self, name: str, logger: logging.Logger = log) -> None:
        self.name = name
        self.up = False
        self.last_error: str | None = None
        self._seen: set[str] = set()
        self._log = logger

    def ok(self) -> None:
        if not self.up and self.last_error is not None:
            self._log.info("source %s is up again", self.name)
        self.up = True
        self.last_error = None

    def down(self, error: str) -> None:
        self.up = False
        self.last_error = error
        # "no samples for 12 s" and "... for 13 s" are the same error: numbers do not count.
        key = _DIGITS.sub("N", error)
        if key not in self._seen:
            self._seen.add(key)
            self._log.warning("source %s is down: %s", self.name, error)


class Source(Protocol):
    """One signal. `poll()` returns what it could read this tick; it never raises."""

    name: str
    health: SourceHealth

    def poll(self) -> object: ...

    def close(self) -> None: ...
