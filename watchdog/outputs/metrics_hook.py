"""The metrics hook: hands each loop's observation and verdict to the Prometheus sink."""

from __future__ import annotations

from typing import Protocol

from watchdog.core.model import Observation, Verdict
from watchdog.core.state.tick import Tick


class LoopSink(Protocol):
    """What the hook feeds (outputs/export.py MetricsSink)."""

    def observe(
        self,
        obs: Observation,
        verdict: Verdict,
        loop_seconds: float | None,
        lag_seconds: float | None = None,
    ) -> None: ...

    def log_lines_skipped(self, reason: str, count: int) -> None: ...


class MetricsHook:
    """Per tick: the loop's series, and the log lines skipped since the last tick (the
    observation carries the log source's running totals; the sink counts increases)."""

    def __init__(self, sink: LoopSink) -> None:
        self.sink = sink
        self._skipped: dict[str, int] = {}  # totals already counted, by reason

    def on_tick(self, tick: Tick) -> None:
        self.sink.observe(tick.obs, tick.verdict, tick.last_loop_s, lag_seconds=tick.lag_s)
        for reason, total in tick.obs.log_skipped.items():
            new = total - self._skipped.get(reason, 0)
            if new > 0:
                self.sink.log_lines_skipped(reason, new)
                self._skipped[reason] = total
