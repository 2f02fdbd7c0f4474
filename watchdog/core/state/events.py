"""What a parsed log line means, decided once: its kind, its startup phase, and whether it is
progress.

The log parser (sources/logs/parse.py) makes a `LogEvent` whose `fields` dict is what timelines
and bundles record; this module reads those fields into typed events (`typed`) and holds the
one definition of progress (`ProgressReader`) and of startup phase (`MILESTONE_PHASE`,
`READY_MILESTONES`) that the live window, the generic classes, the log verdicts and the log's
stack dumps all use. A reader never re-reads the raw fields itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from watchdog.core.model import LogEvent


class LogKind(str, Enum):
    """Every kind a LogEvent may carry (str-valued: timelines record the plain string)."""

    PROGRESS = "progress"  # a tqdm bar of work (requests, prompts)
    STATS = "stats"  # an engine's periodic stats line
    LOADING = "loading"  # a weight-shard bar
    CAPTURE = "capture"  # a CUDA-graph capture bar
    MILESTONE = "milestone"  # a named step of startup (or of serving: ready)
    COMPILE = "compile"  # a torch.compile step
    JIT = "jit"  # FlashInfer's `flashinfer.jit:` logger
    VERSION = "version"
    TRTLLM = "trtllm"
    WAIT = "wait"  # an engine's own "still waiting on my workers" warning
    HEARTBEAT = "heartbeat"  # a launcher's periodic "still waiting for X to be ready"
    CRASH = "crash"
    WATCHDOG = "watchdog"
    STACKDUMP = "stackdump"
    STACK = "stack"  # a stack dump found in the log (LogEvent.stack)
    NOT_GENERATING = "not_generating"
    CANARY = "canary"
    LINE = "line"  # any other line kept for the signatures


class Phase(str, Enum):
    """The server's startup phase, in order; `ready` once it serves."""

    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    CAPTURING = "capturing"
    READY = "ready"


# Each milestone an engine profile names (`set = { name = ... }`), with the phase it belongs
# to. A name not listed is a startup step of the phase the server is in.
MILESTONE_PHASE: dict[str, Phase] = {
    "weights_loaded": Phase.LOADING,
    "model_loaded": Phase.LOADING,
    "shard_ready": Phase.LOADING,
    "compile_done": Phase.COMPILING,
    "aot_saved": Phase.COMPILING,
    "warmup_started": Phase.COMPILING,
    "warmup_done": Phase.COMPILING,
    "profiling_done": Phase.COMPILING,
    "kv_cache_allocated": Phase.COMPILING,
    "autotune_done": Phase.COMPILING,
    "graph_captured": Phase.CAPTURING,
    "engine_ready": Phase.READY,
    "startup_complete": Phase.READY,
}
# Milestones after which the server is ready to serve. `graph_captured` is not one: vLLM logs
# it inside `init engine (profile, create kv cache, warmup model)`, before the engine is up.
READY_MILESTONES = frozenset(n for n, ph in MILESTONE_PHASE.items() if ph is Phase.READY)
# Kinds that are the server's own startup (after a restart, the first of them is the new
# server's first line).
STARTUP_KINDS = frozenset({LogKind.LOADING, LogKind.MILESTONE, LogKind.VERSION})


def _num(f: dict[str, Any], key: str) -> float | None:
    v = f.get(key)
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StatsLine:
    """An engine's stats line: counts and throughputs (None: the line has no such figure)."""

    running: float
    waiting: float
    prompt_tps: float | None
    gen_tps: float | None
    stepped: bool  # the line itself reports a step it ran (SGLang batch, TRT-LLM iteration)

    @property
    def pending(self) -> float:
        return self.running + self.waiting

    @property
    def has_throughput(self) -> bool:
        return self.prompt_tps is not None or self.gen_tps is not None

    @property
    def moving(self) -> bool:
        """The line shows the server moving: a step it ran, or throughput above zero."""
        return self.stepped or (self.prompt_tps or 0.0) + (self.gen_tps or 0.0) > 0

    @property
    def stalled(self) -> bool:
        """Work pending at zero throughput, by the line's own figures."""
        return not self.stepped and self.has_throughput and self.pending > 0 and not self.moving


@dataclass(frozen=True)
class Milestone:
    """A named step of startup, with the phase it belongs to (None: not a known name)."""

    name: str
    phase: Phase | None

    @property
    def ready(self) -> bool:
        return self.name in READY_MILESTONES


@dataclass(frozen=True)
class Bar:
    """A tqdm bar: loading (weights), capture (CUDA graphs) or progress (requests)."""

    kind: LogKind
    desc: str
    n: int
    total: int


@dataclass(frozen=True)
class WaitLine:
    """An engine's own warning that it still waits on its workers (vLLM's shm broadcast)."""

    waits_for: str


@dataclass(frozen=True)
class Heartbeat:
    """A launcher's periodic "still waiting for X to be ready": liveness of the launcher, no
    progress of what it waits for; while loading it is loading, judged by the load deadline."""

    waits_for: str
    phase: Phase
    every_s: float | None = None  # how often the launcher prints it (its profile says)


@dataclass(frozen=True)
class CompileStep:
    """A torch.compile step (Dynamo transform, a graph compiled or loaded from the cache)."""


@dataclass(frozen=True)
class JitLine:
    """A FlashInfer JIT line and its action (fetching, downloaded, attempt_failed, ...)."""

    action: str


@dataclass(frozen=True)
class Other:
    """Any other kind: its meaning is the kind itself (and the line, for the signatures)."""

    kind: str


Typed = StatsLine | Milestone | Bar | WaitLine | Heartbeat | CompileStep | JitLine | Other


def typed(ev: LogEvent) -> Typed:
    """The typed event a LogEvent carries (read from its recorded fields)."""
    f, kind = ev.fields, ev.kind
    if kind == LogKind.STATS:
        return StatsLine(
            running=_num(f, "running") or 0.0,
            waiting=_num(f, "waiting") or 0.0,
            prompt_tps=_num(f, "prompt_tps"),
            gen_tps=_num(f, "gen_tps"),
            stepped=bool(f.get("stepped")),
        )
    if kind == LogKind.MILESTONE:
        name = str(f.get("name", ""))
        return Milestone(name, MILESTONE_PHASE.get(name))
    if kind in (LogKind.LOADING, LogKind.CAPTURE, LogKind.PROGRESS):
        desc = str(f.get("desc") or kind)
        return Bar(LogKind(kind), desc, int(f.get("n") or 0), int(f.get("total") or 0))
    if kind == LogKind.WAIT:
        return WaitLine(str(f.get("waits_for") or "workers"))
    if kind == LogKind.HEARTBEAT:
        phase = str(f.get("phase") or "loading")
        known = phase if phase in Phase._value2member_map_ else Phase.LOADING.value
        return Heartbeat(str(f.get("waits_for") or ""), Phase(known), _num(f, "every_s"))
    if kind == LogKind.COMPILE:
        return CompileStep()
    if kind == LogKind.JIT:
        return JitLine(str(f.get("action") or "other"))
    return Other(kind)


def startup_phase(ev: Typed) -> Phase | None:
    """The startup phase an event puts the server in, or None (it says nothing of the phase)."""
    if isinstance(ev, Bar):
        if ev.kind == LogKind.LOADING:
            return Phase.LOADING
        return Phase.CAPTURING if ev.kind == LogKind.CAPTURE else Phase.READY
    if isinstance(ev, CompileStep):
        return Phase.COMPILING
    if isinstance(ev, Milestone):
        return Phase.READY if ev.ready else None
    if isinstance(ev, StatsLine):
        return Phase.READY
    return None


@dataclass
class ProgressReader:
    """The one definition of progress, read over a log's events in order.

    Progress is: a stats line that shows the server moving (throughput, or a step it ran); any
    startup milestone (weights loaded, compile done, graph capture, KV-cache allocation,
    profiling run, ready); a torch.compile step; a bar that moved since it last drew; a file
    FlashInfer fetched. Not progress: an engine's wait warning, a launcher's heartbeat (they
    say something waits), a bar redrawn at the same count, a stats line at zero throughput.
    Bars need the previous count, so the reader keeps it (`bars`)."""

    bars: dict[str, tuple[int, int]] = field(default_factory=dict)  # desc -> (n, total)

    def progress(self, ev: LogEvent) -> str | None:
        """What progress `ev` shows (a short description), or None."""
        return self.of(typed(ev))

    def of(self, t: Typed) -> str | None:
        if isinstance(t, StatsLine):
            if (t.prompt_tps or 0.0) + (t.gen_tps or 0.0) > 0:
                return "throughput in the stats line"
            # Engines that log a line per finished batch (SGLang's Prefill/Decode batch,
            # TensorRT-LLM's iteration line): the line itself is a step.
            return "a batch finished (stats line)" if t.stepped else None
        if isinstance(t, Milestone):
            return f"milestone {t.name}"
        if isinstance(t, Bar):
            prev = self.bars.get(t.desc)
            self.bars[t.desc] = (t.n, t.total)
            if prev is None or prev != (t.n, t.total):
                return f"{t.desc} {t.n}/{t.total}"
            return None
        if isinstance(t, CompileStep):
            return "a torch.compile step"
        if isinstance(t, JitLine) and t.action in ("downloaded", "loading"):
            return "FlashInfer fetched a file"
        return None


def serving_progress(ev: LogEvent) -> bool:
    """Progress of serving itself: a stats line that shows the server moving. The subset of
    progress that says threads caught in a stack dump moved on (core/state/logdumps.py)."""
    t = typed(ev)
    return isinstance(t, StatsLine) and t.moving


def progress_flags(events: list[LogEvent]) -> list[bool]:
    """For each event in log order: is it progress (one ProgressReader over the log)?"""
    reader = ProgressReader()
    return [reader.progress(ev) is not None for ev in events]
