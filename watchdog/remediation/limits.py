"""The restart limits as a pure rule: exhausted, cooldown, then the cap within a window.

Blind restart loops are the failure peers ship (DLRover #1749 killed a job every 30 minutes
forever), so the cap latches: once reached, nothing restarts until an operator clears it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.remediation.state import RemediationState

CLEAR_HINT = "clear it with `hang-watchdog fallback clear`"


@dataclass(frozen=True)
class Gate:
    """Whether a restart may happen now; `exhausts` is set when this check reached the cap."""

    blocked: str = ""  # why not ("" when allowed)
    exhausts: str = ""  # the reason to latch into the state, once
    rule: str = ""  # which limit blocked: exhausted, cooldown or cap (the text may change)


class SteadyWall:
    """Unix seconds that advance with the monotonic clock: restart times persist as wall
    time (they must survive a watchdog restart), but an NTP step or a manual `date -s` while
    running must not end a cooldown early or keep the cap from ever counting down."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall0, self._mono0, self._monotonic = wall(), monotonic(), monotonic

    def __call__(self) -> float:
        return self._wall0 + (self._monotonic() - self._mono0)


def clamp_future(state: RemediationState, now: float) -> None:
    """Restarts stamped in the future (the clock was set back since) count from now: else the
    cooldown would hold until the clock catches up, and the cap would count them twice."""
    state.restarts = [min(t, now) for t in state.restarts]


def gate(
    state: RemediationState,
    now: float,
    *,
    cooldown_s: float,
    window_s: float,
    max_restarts: int,
) -> Gate:
    """Check the limits against the persisted restart times (Unix seconds)."""
    if state.exhausted:
        return Gate(
            f"remediation exhausted ({state.exhausted_reason}); {CLEAR_HINT}", rule="exhausted"
        )
    recent = state.recent(now, window_s)
    if recent and now - max(recent) < cooldown_s:
        ago = now - max(recent)
        why = f"cooldown: last restart {ago:.0f} s ago (cooldown_s {cooldown_s:.0f})"
        return Gate(why, rule="cooldown")
    if len(recent) >= max_restarts:
        reason = f"{len(recent)} restarts within {window_s:.0f} s (max_restarts {max_restarts})"
        return Gate(f"remediation exhausted: {reason}", exhausts=reason, rule="cap")
    return Gate()
