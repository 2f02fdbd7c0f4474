"""Who says work is pending, and how long each word holds (pure: the window feeds it).

Work is pending when any witness says so, not only the engine's gauges: SGLang writes its
scheduler gauges after a batch returns (srt/managers/scheduler_components/metrics_reporter.py),
so a first batch that hangs leaves them at the warm-up's 0. Each witness has its own lifetime:
a stats line's claim holds until the next line is due (the interval learnt from the lines'
own timestamps) or until a fresher witness (/metrics at 0 with its counters at rest, after the
work it claimed moved on) says the server drained; a CDN socket or a blocking stack holds while
it is seen; a failed health check until the engine answers again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from watchdog.core.knowledge.rankrules import RankRules
from watchdog.core.model import Connection, LogEvent, ServerSample, StackSample
from watchdog.core.state.rankroles import blocking_frame
from watchdog.core.thresholds import Thresholds

# `INFO 07-15 15:32:47 [loggers.py:273]` (vLLM), `[2026-01-02 12:00:00 TP0]` (SGLang),
# `[01/02/2026-12:00:00] [TRT-LLM]` (TensorRT-LLM): the time of day near the start of the line.
_CLOCK = re.compile(r"(?<!\d)(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?(?!\d)")
_CLOCK_HEAD = 64  # characters searched: a timestamp inside the message is not the line's own
DAY_S = 86400.0
MIN_INTERVAL_S = 1.0  # lines closer than this are one burst (DP engines log together)
# How long a stats line's claim and a "not generating" line hold are Thresholds'
# (stats_due_factor, stats_due_slack_s, not_generating_hold_s): they change a verdict.


def line_clock(line: str) -> float | None:
    """Seconds into the day of the line's own timestamp, or None when it carries none."""
    m = _CLOCK.search(line[:_CLOCK_HEAD])
    if m is None:
        return None
    h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if h > 23 or mi > 59 or s > 60:
        return None
    frac = float("0." + m.group(4)) if m.group(4) else 0.0
    return h * 3600 + mi * 60 + s + frac


@dataclass
class StatsClaim:
    """What the newest stats (batch) line said about pending work."""

    t: float  # when the watchdog read it
    pending: bool
    moving: bool  # the line showed throughput: the next one is due (vLLM logs it at INFO)
    moved_after: bool = False  # the server's counters advanced since the line
    drained: str = ""  # why a fresher witness overruled it


@dataclass
class Witnesses:
    """The witnesses of pending work other than progress bars, gauges and canaries."""

    claim: StatsClaim | None = None
    interval_s: float | None = None  # the stats interval, learnt from the lines' timestamps
    last_clock: float | None = None
    last_clock_t: float | None = None
    ready_milestone: bool = False  # the engine logged that it is ready to serve
    not_generating_t: float | None = None  # the engine's own "not generating" line
    health_failing: bool = False  # /health says the engine does not generate
    cdn_socket: str = ""
    blocking: str = ""  # a serving thread unchanged across dumps in a blocking frame
    unanswered: str = ""  # requests the server's sockets hold with no answer yet
    th: Thresholds = field(default_factory=Thresholds)  # how long each witness's word holds

    def on_stats(self, ev: LogEvent, t: float, pending: bool, moving: bool) -> None:
        """A stats or batch line: the claim it makes, and what it says about the interval."""
        self.claim = StatsClaim(t=t, pending=pending, moving=moving)
        clock = line_clock(ev.line)
        stamp, prev = (clock, self.last_clock) if clock is not None else (t, self.last_clock_t)
        if prev is not None:
            gap = (stamp - prev) % DAY_S if clock is not None else stamp - prev
            if gap >= MIN_INTERVAL_S and (self.interval_s is None or gap < self.interval_s):
                self.interval_s = gap
        if clock is not None:
            self.last_clock = clock
        self.last_clock_t = t

    def on_server(self, v: ServerSample, t: float, advanced: bool) -> None:
        """A /metrics scrape: counters that moved after a claim, gauges that say drained;
        the requests its sockets hold unanswered (sources/tcpdiag.py)."""
        self.unanswered = ""
        if v.unanswered:
            oldest = v.unanswered_oldest_s or 0.0
            self.unanswered = f"{v.unanswered} request(s), the oldest waiting {oldest:.0f} s"
        c = self.claim
        if c is None or not c.pending or t <= c.t:
            return
        if advanced:
            c.moved_after = True
            return
        drained = (v.running == 0 or v.running is None) and (v.waiting or 0) == 0
        # The work the line claimed moved on, and now the gauges read 0 with the counters at
        # rest: drained. Without that movement a 0 proves nothing (vllm #46811: running read 0
        # during a real wedge), and the claim stands.
        if drained and v.running is not None and c.moved_after:
            c.drained = "/metrics reads 0 running and 0 waiting with its counters at rest"

    def on_health(self, meaning: str | None, status: int | None, ok_seen: bool) -> None:
        """/health: an engine whose check runs a generation (SGLang) says it does not generate."""
        if status == 200:
            self.health_failing = False
            return
        # Before the ready milestone (or a first 200) it is the warm-up (ServerStatus.Starting).
        self.health_failing = meaning == "not_generating" and (ok_seen or self.ready_milestone)

    def on_not_generating(self, t: float) -> None:
        self.not_generating_t = t

    def on_observation(
        self,
        conns: tuple[Connection, ...],
        stacks: tuple[StackSample, ...],
        ready: bool,
        ranks: RankRules,
    ) -> None:
        """Sockets held to the kernel CDN while serving; stacks parked in a blocking frame."""
        self.cdn_socket = ""
        if ready and conns:
            c = max(conns, key=lambda c: c.age_s)
            self.cdn_socket = f"pid {c.pid} holds a socket to {c.host} ({c.state})"
        if stacks:
            self.blocking = blocking_frame(stacks, ranks)

    def on_progress(self) -> None:
        """The server moved on: what the stacks and the failed checks said is over."""
        self.blocking = ""
        self.not_generating_t = None
        if self.claim is not None and self.claim.pending:
            self.claim.moved_after = True

    def stats_says(self, t: float) -> str:
        """The stats line's claim while it holds, else ""."""
        c = self.claim
        if c is None or not c.pending or c.drained:
            return ""
        if c.moving and self.interval_s is not None:
            due = c.t + self.th.stats_due_factor * self.interval_s + self.th.stats_due_slack_s
            if t > due:
                return ""  # the next line was due and did not come, or came and said 0
        return "requests running or waiting (stats line)"

    def active(self, t: float) -> list[str]:
        """Every witness that says work is pending now, strongest first."""
        out = []
        if self.blocking:
            out.append(f"a serving thread blocked ({self.blocking})")
        if self.cdn_socket:
            out.append(f"a socket to the kernel CDN held open while serving ({self.cdn_socket})")
        if self.unanswered:
            out.append(f"requests accepted and not answered ({self.unanswered})")
        if self.health_failing:
            out.append("/health's one-token generation got no answer")
        held = self.th.not_generating_hold_s
        if self.not_generating_t is not None and t - self.not_generating_t <= held:
            out.append("the engine logged that it is not generating (failed health check)")
        return out
