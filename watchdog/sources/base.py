"""The one interface every source implements, the tick context they share, and down-marking."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from watchdog.engines.detect import EngineInForce

log = logging.getLogger("hang_watchdog.sources")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")

PROC_HINT = "a /proc read blocked by a process stuck in the driver?"


class SourceHealth:
    """Tracks whether a source is up and logs each distinct error once per outage, not once
    per tick: a new outage (after the source was up) is always logged, even with a cause seen
    before, and an error whose text keeps changing is logged at most `max_distinct` times.

    `reported`: whether the source has a `source_up` series at all (an optional service that
    never answered has none)."""

    def __init__(self, name: str, logger: logging.Logger = log, *, max_distinct: int = 5) -> None:
        self.name = name
        self.up = False
        self.reported = True
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


@dataclass
class SourceTick:
    """What sources polled earlier in one tick hand to later ones: the procs source (first in
    the list) sets the target, its tree and the engine in force, the facts source the target's
    environment. The loop starts each with what it knew after the last one: the engine in
    force and the last verdict's state (the idle canary asks only an idle server).

    Each tick gets a fresh one: a poll that returns after its deadline can still write to the
    tick it was given (whole values, one attribute at a time), never to a later one."""

    target_pid: int | None = None
    tree_pids: tuple[int, ...] = ()
    environ: dict[str, str] | None = None
    engine: EngineInForce = field(default_factory=EngineInForce)
    last_state: str | None = None


@dataclass(frozen=True)
class Deadline:
    """How long the loop waits for one poll, and what a late one means.

    keep_late: a poll that returns after its deadline hands its result to the next tick (log
    lines read late are still evidence; a late GPU sample is only stale). inline: the source
    bounds its own waits (its blocking calls run on its own `deadline.Worker`, or it never
    waits), so the loop calls it directly and no call runs on two threads; `seconds` is then
    the longest a poll can take, for the loop's worst case.
    """

    seconds: float
    keep_late: bool = False
    inline: bool = False
    hint: str = PROC_HINT


class Source(Protocol):
    """One signal. `poll(tick)` returns its part of the Observation (the field named `part`),
    or None when it has nothing; a source catches what it expects and marks itself down."""

    name: str
    part: str
    health: SourceHealth

    def deadline(self, tick_s: float) -> Deadline: ...

    def poll(self, tick: SourceTick) -> Any: ...

    def close(self) -> None: ...


def proc_deadline(tick_s: float) -> Deadline:
    """/proc reads of a process stuck in the driver can block: twice a tick, at least 1 s."""
    return Deadline(max(1.0, 2 * tick_s))


def scrape_deadline(per_request_s: float, requests: int) -> Deadline:
    """httpx's timeouts bound each read, not the whole response: a server (or exporter) that
    trickles bytes would hold a scrape for ever. Its limit per request times its requests,
    plus a margin."""
    return Deadline(
        requests * per_request_s + 1.0,
        hint="a server trickling its response, or a DNS lookup that hangs?",
    )
