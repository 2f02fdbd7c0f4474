"""What a hook sees of one loop iteration: the observation, the verdict, and narrow callbacks
into the loop, instead of the whole daemon (so outputs and remediation never import daemon/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from watchdog.core.model import Observation, StackSample, Verdict
from watchdog.core.state.window import Window
from watchdog.core.thresholds import Thresholds


class EventSink(Protocol):
    """Says one operator event (the emitter's `event`): kind, a sentence, structured fields."""

    def __call__(self, kind: str, message: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Tick:
    """One iteration, as handed to each hook; the window is for reading only."""

    obs: Observation
    verdict: Verdict
    window: Window
    thresholds: Thresholds
    clock: Callable[[], float]  # the loop's monotonic clock
    event: EventSink
    # Stack dumps that finished in the background join the next observation as evidence.
    attach_stacks: Callable[[tuple[StackSample, ...]], None]
    last_loop_s: float | None = None  # the previous iteration's full duration; None before it
    lag_s: float = 0.0  # how late this iteration started against its schedule
    # The engine in force this tick (its profile's name: "unknown" until one is recognised),
    # forced by --engine or detected by the process source; hooks look its profile up.
    engine: str = "unknown"


class Hook(Protocol):
    """Something that reacts to each tick (episodes, remediation, canary, metrics, notify)."""

    def on_tick(self, tick: Tick) -> None: ...
