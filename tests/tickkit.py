"""The loop's side of a hook's Tick, for hook tests: a real Window and Thresholds, and the
callbacks recorded (events as the emitter writes them, injected log events, attached stacks)."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

from watchdog.core.judge.classify import Thresholds
from watchdog.core.model import Observation, StackSample, Verdict
from watchdog.core.state.tick import Tick
from watchdog.core.state.window import Window
from watchdog.outputs.emit import Emitter


class TickKit:
    """Builds each Tick a hook sees, as the daemon would, and keeps what hooks sent back."""

    def __init__(
        self,
        facts: dict[str, Any] | None = None,
        *,
        fmt: str = "text",
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = io.StringIO()
        self.emitter = Emitter(fmt, stream=self.out, wall=wall)
        self.window = Window()
        self.window.progress.facts.update(facts or {})
        self.thresholds = Thresholds()
        self.clock = clock
        self.attached: list[tuple[StackSample, ...]] = []

    def tick(self, obs: Observation, verdict: Verdict, **timing: Any) -> Tick:
        return Tick(
            obs=obs,
            verdict=verdict,
            window=self.window,
            thresholds=self.thresholds,
            clock=self.clock,
            event=self.emitter.event,
            attach_stacks=self.attached.append,
            **timing,
        )
