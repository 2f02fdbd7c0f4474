"""The remediation hook's phases as an explicit state machine: watching for a hang, restarting
(the restarter runs in its thread), verifying (the verifier follows the ticks), and back.

A restart that fails goes straight back to watching; a verified one (either outcome) too.
Any other move is a bug and raises, rather than leaving a half-set attempt behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from watchdog.remediation.plan import Plan
from watchdog.remediation.restarters import RestartJob
from watchdog.remediation.verify import Verifier


class Phase(Enum):
    """Where the hook is with the current restart, if any."""

    WATCHING = "watching"  # no restart in flight: a hang is considered
    RESTARTING = "restarting"  # the restarter runs in its background thread
    VERIFYING = "verifying"  # the server was restarted: did it recover?


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.WATCHING: frozenset({Phase.RESTARTING}),
    Phase.RESTARTING: frozenset({Phase.VERIFYING, Phase.WATCHING}),
    Phase.VERIFYING: frozenset({Phase.WATCHING}),
}


class TransitionError(RuntimeError):
    """A move the machine does not allow (a bug in the hook)."""


@dataclass
class Attempt:
    """One restart from its start to its verdict: what it does and where it is recorded."""

    plan: Plan
    job: RestartJob
    bundle: Path | None = None  # the incident bundle the attempt is written into
    record: dict[str, Any] = field(default_factory=dict)  # the bundle's remediation record
    verifier: Verifier | None = None  # set on entering VERIFYING


class Machine:
    """The phase and the attempt it belongs to (none while watching)."""

    def __init__(self) -> None:
        self.phase = Phase.WATCHING
        self._attempt: Attempt | None = None

    @property
    def attempt(self) -> Attempt:
        """The attempt in flight; TransitionError while watching."""
        if self._attempt is None:
            raise TransitionError("no restart in flight while watching")
        return self._attempt

    def begin(self, attempt: Attempt) -> None:
        """A restart started: WATCHING -> RESTARTING."""
        self._move(Phase.RESTARTING)
        self._attempt = attempt

    def verify(self, verifier: Verifier) -> None:
        """The restart finished: RESTARTING -> VERIFYING."""
        self._move(Phase.VERIFYING)
        self.attempt.verifier = verifier

    def end(self) -> Attempt:
        """The attempt failed or was verified: back to WATCHING; returns it."""
        attempt = self.attempt
        self._move(Phase.WATCHING)
        self._attempt = None
        return attempt

    def _move(self, to: Phase) -> None:
        if to not in ALLOWED[self.phase]:
            raise TransitionError(f"remediation cannot go from {self.phase.value} to {to.value}")
        self.phase = to
