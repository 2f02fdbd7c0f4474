"""A bounded ring of observations plus the few facts that outlive it (phase, last progress).

`Window.append` is deterministic in its input: replaying a recorded timeline rebuilds the
same window, which is what lets `classify()` stay pure and `replay` reproduce a verdict.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.knowledge.rankrules import RankRules
from watchdog.core.model import CanaryResult, LogEvent, Observation
from watchdog.core.state.events import (
    STARTUP_KINDS,
    Bar,
    Heartbeat,
    LogKind,
    Milestone,
    Phase,
    ProgressReader,
    StatsLine,
    startup_phase,
    typed,
)
from watchdog.core.state.leases import LeaseScan, OpenLease
from watchdog.core.state.openops import keep_pattern
from watchdog.core.state.witnesses import Witnesses
from watchdog.core.thresholds import Thresholds

# Log text is the window's only input that grows with the server: a logged 64 KB prompt per
# line would otherwise hold ~100 MB. Each kept line is cut to its head and tail,
# and past a budget for the whole window the oldest lines shrink further (their verdict-time
# use is the label and the first words; the full text is in the log itself).
MAX_EVENT_CHARS = 4096
OLD_EVENT_CHARS = 256
MAX_WINDOW_CHARS = 8 << 20
EVENT_OVERHEAD = 400  # bytes a LogEvent, its __dict__ and fields hold beyond its text
# After a restart the old server's last words (its shutdown noise, e.g. SGLang's launcher
# printing "SIGQUIT received ... one child failed" as systemd stops it) can still be unread in
# a shared log file when the new pid appears. The file is written in order, so lines before the
# new server's first startup line are the old server's: they are dropped, for at most
# Thresholds.restart_echo_s, and never taken as the new server's crash.
# The log source name for a pipe only the current server writes (supervise mode names its
# child's stdout and stderr so): its lines are never the old server's after a restart.
OWN_PIPE = "child"


@dataclass
class Progress:
    """What the window has learned about progress; survives the ring's eviction."""

    phase: str = "starting"  # starting | loading | compiling | capturing | ready
    phase_since: float | None = None
    last_progress_t: float | None = None
    last_progress_what: str = ""
    pending_since: float | None = None
    pending: bool = False
    pending_why: str = ""
    reader: ProgressReader = field(default_factory=ProgressReader)  # core/state/events.py
    bar_desc: str | None = None  # the bar that most recently redrew
    ratio: float | None = None
    counters: dict[str, float] = field(default_factory=dict)  # /metrics counters last seen
    stats_pending: bool = False  # last `Engine 000:` line had running or waiting > 0
    metrics_pending: bool | None = None  # None: no /metrics figures
    read_bytes: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    target_pid: int | None = None
    restarted_t: float | None = None  # evidence from before this belongs to the old server
    canary_since: float | None = None  # an idle-canary request got no answer; sent at this time
    # An engine whose /health runs a generation (SGLang) answered "not generating" after it had
    # answered 200 before: its own probe request is work pending with no answer.
    health_ok_seen: bool = False
    health_stall: bool = False
    witnesses: Witnesses = field(default_factory=Witnesses)  # core/state/witnesses.py
    pending_witnesses: tuple[str, ...] = ()  # every witness that says work is pending now
    # A launcher's heartbeat while loading (core/state/events.py Heartbeat): since when it waits.
    heartbeat_since: float | None = None
    heartbeat_what: str = ""

    @property
    def bars(self) -> dict[str, tuple[int, int]]:
        """desc -> (n, total) of each bar seen (kept by the progress reader)."""
        return self.reader.bars


class Window:
    """Observations of the last `span_s` seconds (at most `max_len`) and the Progress facts."""

    def __init__(
        self,
        span_s: float = 600.0,
        max_len: int = 4000,
        max_chars: int = MAX_WINDOW_CHARS,
        *,
        ranks: RankRules | None = None,
        thresholds: Thresholds | None = None,
        ops: Sequence[OpDef] = (),
    ) -> None:
        """`thresholds`: the numbers the witnesses and the restart echo use (the ones
        classify() is given: the daemon's config, or a bundle's recorded ones in `replay`).
        `ops`: the known long operations (SignatureSet.ops) whose leases outlive the ring."""
        self.span_s = span_s
        self.th = thresholds if thresholds is not None else Thresholds()
        # The rank rules (SignatureSet.ranks) that name a blocking frame in the stacks; none:
        # stacks are never a witness of pending work.
        self.ranks = ranks if ranks is not None else RankRules()
        self._obs: deque[Observation] = deque(maxlen=max_len)
        self._sizes: deque[int] = deque()  # log characters held by each observation
        self._trimmed = 0  # how many of the oldest observations have been shrunk already
        self.max_chars = max_chars
        self.chars = 0
        self.progress = self._fresh_progress()
        # The lease state of the observations the ring dropped (core/state/leases.py): a 40-minute
        # autotune keeps its start line and its last progress past the window's span. Bounded
        # by the number of operations; the lines that open or close one survive the shrink.
        self.ops = tuple(ops)
        self._carry = LeaseScan(self.ops)
        self._lease_lines = keep_pattern([op for op in self.ops if op.quiet_s is not None])
        self._echo_until: float | None = None  # the old server's lines may still arrive
        self.echo_dropped = 0  # lines dropped as the old server's after a restart

    def __iter__(self) -> Iterator[Observation]:
        return iter(self._obs)

    def __len__(self) -> int:
        return len(self._obs)

    @property
    def latest(self) -> Observation | None:
        return self._obs[-1] if self._obs else None

    def last(self, n: int) -> list[Observation]:
        """The newest `n` observations, oldest first (without copying the whole ring)."""
        return list(islice(reversed(self._obs), n))[::-1]

    def since(self, t: float) -> list[Observation]:
        return [o for o in self._obs if o.t >= t]

    def append(self, obs: Observation) -> None:
        """Add one tick and update the progress facts from it."""
        obs = self._without_old_server_lines(_cap_logs(obs, MAX_EVENT_CHARS))
        if self._obs.maxlen is not None and len(self._obs) == self._obs.maxlen:
            self._evict()
        self._obs.append(obs)
        self._sizes.append(_log_chars(obs))
        self.chars += self._sizes[-1]
        while self._obs and self._obs[0].t < obs.t - self.span_s:
            self._evict()
        self._shrink_oldest()
        p = self.progress
        if obs.procs is not None and (obs.procs.restarted or obs.procs.target_pid != p.target_pid):
            if p.target_pid is not None:
                self._rebaseline(obs.t)
                p = self.progress
            p.target_pid = obs.procs.target_pid
        p.facts.update({k: v for k, v in obs.facts.items() if v is not None})
        # This tick's /metrics token counters, when read, say to the tick whether tokens moved.
        v = obs.server
        counted = v is not None and v.up and v.generation_tokens is not None
        for ev in obs.logs:
            self._log_event(ev, obs.t, counted)
        if obs.canary is not None:
            self._canary(obs.canary, obs.t)
        if obs.server is not None and obs.server.up:
            self._metrics(obs)
        if obs.procs is not None and p.phase == "loading":
            self._read_bytes(obs)
        p.witnesses.on_observation(obs.conns, obs.stacks, p.phase == "ready", self.ranks)
        self._update_pending(obs.t)

    def _without_old_server_lines(self, obs: Observation) -> Observation:
        """Drop, after a restart, the lines logged before the new server's first startup line."""
        p, before = obs.procs, self.progress.target_pid
        if p is not None and before is not None and (p.restarted or p.target_pid != before):
            self._echo_until = obs.t + self.th.restart_echo_s
        if self._echo_until is None or not obs.logs:
            return obs
        if obs.t > self._echo_until:
            self._echo_until = None
            return obs
        first = next((i for i, ev in enumerate(obs.logs) if ev.kind in STARTUP_KINDS), None)
        if first is not None:
            self._echo_until = None
        end = len(obs.logs) if first is None else first
        # A supervised child's output comes on its own pipe ("child"): never the old server's.
        kept = tuple(ev for i, ev in enumerate(obs.logs) if i >= end or ev.source == OWN_PIPE)
        self.echo_dropped += len(obs.logs) - len(kept)
        return replace(obs, logs=kept)

    @property
    def carried(self) -> Mapping[str, OpenLease]:
        """The operations open in the observations the ring dropped (their lease state)."""
        return self._carry.opened

    def carried_observations(self) -> list[Observation]:
        """The lines that rebuild the carried leases, as observations in time order: a
        bundle's timeline holds them ahead of the ring, so `replay` finds what the live window
        found (an operation opened 40 minutes ago, its latest progress line)."""
        lines: dict[float, tuple[float, list[LogEvent]]] = {}
        seen: set[int] = set()
        for o in self._carry.opened.values():
            for t, wall, ev in [*o.anchors, *([o.latest] if o.latest else [])]:
                if id(ev) not in seen:
                    seen.add(id(ev))
                    lines.setdefault(t, (wall, []))[1].append(ev)
        return [
            Observation(t=t, wall=wall, logs=tuple(evs)) for t, (wall, evs) in sorted(lines.items())
        ]

    def _evict(self) -> None:
        if self._carry.ops:
            self._carry.feed(self._obs[0])
        self._obs.popleft()
        self.chars -= self._sizes.popleft()
        self._trimmed = max(0, self._trimmed - 1)

    def _shrink_oldest(self) -> None:
        """Past max_chars the oldest lines shrink to OLD_EVENT_CHARS; if that is not enough
        (hundreds of lines a tick for thousands of ticks), the oldest ticks lose their lines
        altogether: the window's log memory is bounded in bytes, not in lines per tick."""
        while self.chars > self.max_chars and self._trimmed < len(self._obs) - 1:
            self._resize(self._trimmed, _cap_logs(self._obs[self._trimmed], OLD_EVENT_CHARS))
            self._trimmed += 1
        i = 0
        while self.chars > self.max_chars and i < len(self._obs) - 1:
            if self._obs[i].logs:
                self._resize(i, replace(self._obs[i], logs=self._lease_events(self._obs[i])))
            i += 1

    def _resize(self, i: int, obs: Observation) -> None:
        self._obs[i] = obs
        size = _log_chars(obs)
        self.chars += size - self._sizes[i]
        self._sizes[i] = size

    def _lease_events(self, obs: Observation) -> tuple[LogEvent, ...]:
        """The lines of `obs` a lease reads (an operation's start, progress, end; the ready
        milestone): kept when the tick's other lines are dropped for memory."""
        keep = self._lease_lines
        if keep is None:
            return ()
        return tuple(
            ev
            for ev in obs.logs
            if ev.kind == "milestone" or (ev.kind != "stack" and keep.search(ev.line))
        )

    def _fresh_progress(self, **known: Any) -> Progress:
        return Progress(witnesses=Witnesses(th=self.th), **known)

    def _rebaseline(self, t: float) -> None:
        facts = self.progress.facts
        self._carry = LeaseScan(self.ops)  # the new server's operations start afresh
        self.progress = self._fresh_progress(
            phase_since=t, last_progress_t=t, last_progress_what="server restarted", restarted_t=t
        )
        self.progress.facts = {k: v for k, v in facts.items() if k in ("gpu_cc",)}

    def _advance(self, t: float, what: str) -> None:
        self.progress.last_progress_t = t
        self.progress.last_progress_what = what
        self.progress.witnesses.on_progress()

    def _set_phase(self, phase: str, t: float) -> None:
        p = self.progress
        if p.phase != phase:
            p.phase, p.phase_since = phase, t
            self._advance(t, f"entered {phase}")

    def _log_event(self, ev: LogEvent, t: float, counted: bool) -> None:
        """One line's meaning (core/state/events.py) applied: its phase, progress, witness."""
        p = self.progress
        te = typed(ev)
        phase = startup_phase(te)
        if phase is not None and not (phase is Phase.READY and p.phase == "ready"):
            self._set_phase(phase.value, t)
        what = p.reader.of(te)
        if what is not None and not (isinstance(te, StatsLine) and counted):
            # A stats line's throughput is the average over its interval (vLLM logs it every
            # VLLM_LOG_STATS_INTERVAL, 10 s): it says tokens moved at some time in the last
            # interval, not now. Where the counters are read each tick they say when; the line
            # logged 6 s into a hang must not restart the stall clock.
            self._advance(t, what)
        if isinstance(te, Milestone) and te.ready:
            p.witnesses.ready_milestone = True
            p.heartbeat_since = None
        elif isinstance(te, Bar) and te.kind == LogKind.PROGRESS:
            p.bar_desc = te.desc
            p.ratio = te.n / te.total if te.total else None
        elif isinstance(te, StatsLine):
            p.stats_pending = te.pending > 0
            p.witnesses.on_stats(ev, t, p.stats_pending, te.moving)
        elif isinstance(te, Heartbeat):
            self._heartbeat(te, t)
        elif ev.kind == "not_generating":
            p.witnesses.on_not_generating(t)

    def _heartbeat(self, hb: Heartbeat, t: float) -> None:
        """A launcher still waiting while the server loads: the phase is loading, and the wait
        is timed from its first heartbeat (the loading deadline judges it: core/judge/context.py).
        """
        p = self.progress
        if p.phase == "ready":
            return
        if p.phase == "starting":
            self._set_phase(hb.phase.value, t)
        if p.heartbeat_since is None:
            p.heartbeat_since, p.heartbeat_what = t, hb.waits_for

    def _canary(self, answer: CanaryResult, t: float) -> None:
        """A request the watchdog sent itself: unanswered, it is work pending since it was sent
        (an old timeline's `canary` log event reaches here through Observation too)."""
        if answer.timed_out:
            self.progress.canary_since = t - answer.waited_s
        else:
            self.progress.canary_since = None
            self._advance(t, "canary request answered")

    def _metrics(self, obs: Observation) -> None:
        p, v = self.progress, obs.server
        assert v is not None
        advanced = False
        for name in ("iterations", "prompt_tokens", "generation_tokens"):
            value = getattr(v, name)
            if value is None:
                continue
            prev = p.counters.get(name)
            if prev is not None and value > prev:
                self._advance(obs.t, f"server {name} advanced")
                advanced = True
            p.counters[name] = value  # a drop means a restart: the new value is the new baseline
        p.witnesses.on_server(v, obs.t, advanced)
        if v.running is not None or v.waiting is not None:
            p.metrics_pending = (v.running or 0) + (v.waiting or 0) > 0
        if v.health_status == 200:
            p.health_ok_seen = True
        # Before the first 200 or the ready milestone it is SGLang's warm-up
        # (ServerStatus.Starting), not a stall.
        p.witnesses.on_health(v.health_meaning, v.health_status, p.health_ok_seen)
        p.health_stall = p.witnesses.health_failing
        # vLLM's API server answers only once the engine is up, so /health 200 means ready even
        # when the watchdog attached after the startup lines went by.
        served = (p.counters.get("iterations") or 0) > 0 or v.health_status == 200
        if p.phase in ("starting", "compiling", "capturing") and served:
            self._set_phase("ready", obs.t)

    def _read_bytes(self, obs: Observation) -> None:
        assert obs.procs is not None
        total = sum(pi.read_bytes or 0 for pi in obs.procs.procs)
        if self.progress.read_bytes is not None and total > self.progress.read_bytes:
            self._advance(obs.t, "weights being read from disk")
        self.progress.read_bytes = total

    def _update_pending(self, t: float) -> None:
        """Work is pending while any witness says so (core/state/witnesses.py); each is listed."""
        p = self.progress
        said: list[str] = []
        if p.bar_desc is not None:
            n, total = p.bars[p.bar_desc]
            if total and n < total:
                said.append(f"'{p.bar_desc}' at {n}/{total}")
        if p.metrics_pending:
            said.append("requests running or waiting (/metrics)")
        # /metrics can read running=0 during a hang (vllm #46811), so the stats line counts too,
        # for as long as its claim holds.
        stats = p.witnesses.stats_says(t)
        if stats:
            said.append(stats)
        said += p.witnesses.active(t)
        since = t
        if p.canary_since is not None:
            said.append("a canary request got no answer")
            if len(said) == 1:
                since = p.canary_since
        if said and not p.pending:
            p.pending_since = since
        p.pending, p.pending_why = bool(said), said[0] if said else ""
        p.pending_witnesses = tuple(said)


def shorten(line: str, limit: int) -> str:
    """`line` cut to about `limit` characters, keeping its head and its tail."""
    if len(line) <= limit:
        return line
    head = limit * 3 // 4
    tail = limit - head
    return f"{line[:head]} [... {len(line) - limit} characters ...] {line[-tail:]}"


def _cap_logs(obs: Observation, limit: int) -> Observation:
    if all(len(ev.line) <= limit for ev in obs.logs):
        return obs
    logs = tuple(
        ev if len(ev.line) <= limit else replace(ev, line=shorten(ev.line, limit))
        for ev in obs.logs
    )
    return replace(obs, logs=logs)


def _log_chars(obs: Observation) -> int:
    """The memory an observation's log events hold, about: text plus the event objects."""
    return sum(len(ev.line) + EVENT_OVERHEAD for ev in obs.logs)
