"""Build Observation sequences for the pure-core tests: one tick a second from a fake clock.

Log events come from the REAL parser (`watchdog.sources.logs.parse.parse_line`) over real-format
lines under tests/data/logs/ (or tests/data/classify/ where no real line exists), so a
classifier test also proves the parser and the signature regexes agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.shipped import PATTERNS
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.rankrules import load_rank_rules
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import (
    Connection,
    Frame,
    GpuSample,
    LogEvent,
    Observation,
    ProcInfo,
    ProcSnapshot,
    ServerSample,
    StackSample,
    ThreadStack,
    Verdict,
)
from watchdog.core.state.openops import keep_with_ops
from watchdog.core.state.window import Window
from watchdog.sources.logs.parse import parse_line
from watchdog.sources.logs.split import LineSplitter

DATA = Path(__file__).resolve().parent / "data"
LOGS = DATA / "logs"
CDN_HOST = "edge.urm.nvidia.com"  # FlashInfer's default FLASHINFER_CUBINS_REPOSITORY host
SERVER_PID = 4242


def sample_lines(name: str) -> list[str]:
    """The lines of a sample file (relative to tests/data/), split the way the log source does."""
    splitter = LineSplitter()
    lines = splitter.feed((DATA / name).read_bytes())
    tail = splitter.flush()
    return lines + ([tail] if tail else [])


def events(lines: Iterable[str], sigs: SignatureSet | None = None) -> tuple[LogEvent, ...]:
    """The LogEvents the real parser makes of `lines` (in the shipped engines' formats, as the
    daemon's log source reads them), keeping what the signatures need."""
    sigs = sigs or load_signatures()
    keep = keep_with_ops(sigs.log_keep_pattern(), sigs.ops)  # as sources/logs/source.py does
    parsed = (parse_line(line, "test", keep, PATTERNS) for line in lines)
    return tuple(ev for ev in parsed if ev is not None)


def gpu(
    sm: float = 0.0,
    dram: float = 0.0,
    *,
    index: int = 0,
    cc: str = "9.0",
    procs: int | None = 1,
    name: str = "NVIDIA H100 80GB HBM3",
) -> GpuSample:
    """One GPU sample; defaults to an idle H100 with one compute process."""
    pids = (SERVER_PID,) * (procs or 0)
    return GpuSample(
        index, f"GPU-{index:04d}", name, cc, sm, dram, 300.0, 1980.0, procs, pids, "gpm"
    )


def spin(cc: str = "9.0", procs: int | None = 1) -> GpuSample:
    """The hang shape: SM busy, no memory traffic, low power (spinning kernels drew 136-164 W
    of an H200's 700 W limit; a compute-bound kernel draws near the limit and is no spin)."""
    name = "NVIDIA GB300" if cc == "10.3" else "GPU"
    g = gpu(0.99, 0.0, cc=cc, procs=procs, name=name)
    return replace(g, power_w=140.0, power_limit_w=700.0)


def procs(
    pid: int = SERVER_PID,
    *,
    alive: bool = True,
    compilers: Sequence[str] = (),
    read_bytes: int | None = None,
    restarted: bool = False,
) -> ProcSnapshot:
    """The server's tree: the API server and one EngineCore child."""
    tree = (
        ProcInfo(pid, 1, "python3", "vllm serve model", 10.0, read_bytes, "sleeping"),
        ProcInfo(pid + 1, pid, "python3", "VLLM::EngineCore", 50.0, None, "running"),
    )
    return ProcSnapshot(pid, alive, tree if alive else (), tuple(compilers), restarted)


def cdn_socket(age_s: float, pid: int = SERVER_PID + 1) -> Connection:
    """A socket from the engine to FlashInfer's kernel CDN, stuck in SYN_SENT."""
    return Connection(pid, CDN_HOST, "203.0.113.7", 443, "SYN_SENT", age_s)


def stack(
    *frames: tuple[str, str], unchanged: bool = True, pid: int = SERVER_PID + 1
) -> StackSample:
    """One process's stack: `frames` are (function, file) pairs, innermost first."""
    fr = tuple(Frame(name, path, 10 + i) for i, (name, path) in enumerate(frames))
    thread = ThreadStack(1, "MainThread", fr, active=True, unchanged=unchanged)
    return StackSample(pid, "VLLM::EngineCore", (thread,))


DOWNLOAD_STACK = (
    ("download_file", "/usr/lib/python3.12/site-packages/flashinfer/jit/cubin_loader.py"),
    ("get_cubin", "/usr/lib/python3.12/site-packages/flashinfer/jit/cubin_loader.py"),
    ("get_cubin_callback", "/usr/lib/python3.12/site-packages/flashinfer/jit/cubin_loader.py"),
)
ALL_REDUCE_STACK = (
    ("all_reduce", "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"),
    ("all_reduce", "/usr/lib/python3.12/site-packages/vllm/distributed/parallel_state.py"),
)
SYNC_STACK = (
    ("synchronize", "/usr/lib/python3.12/site-packages/torch/cuda/streams.py"),
    ("execute_model", "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py"),
)


@dataclass
class Timeline:
    """Observations one `step` apart from a fake clock, with defaults repeated each tick."""

    t0: float = 1000.0
    step: float = 1.0
    gpus: tuple[GpuSample, ...] = ()
    procs: ProcSnapshot | None = None
    server: ServerSample | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    obs: list[Observation] = field(default_factory=list)

    @property
    def now(self) -> float:
        """The time the next tick will carry."""
        return self.t0 + self.step * len(self.obs)

    def tick(self, **kw: Any) -> Observation:
        """Append one observation; keywords override the timeline's defaults for this tick."""
        t = self.now
        base = Observation(
            t=t,
            wall=1.7e9 + t,
            gpus=self.gpus,
            procs=self.procs,
            server=self.server,
            facts=dict(self.facts),
            sources={"gpu": bool(self.gpus), "logs": True},
        )
        obs = replace(base, **kw)
        self.obs.append(obs)
        return obs

    def ticks(self, n: int, **kw: Any) -> None:
        """`n` identical ticks."""
        for _ in range(n):
            self.tick(**kw)


RANKS = load_rank_rules()  # the shipped rank rules, as the daemon's window holds them


def window_of(obs: Iterable[Observation], span_s: float = 600.0) -> Window:
    """A window holding `obs`, in order."""
    w = Window(span_s=span_s, ranks=RANKS)
    for o in obs:
        w.append(o)
    return w


def verdicts(
    obs: Iterable[Observation], sigs: SignatureSet, th: Thresholds | None = None
) -> list[tuple[Observation, Verdict]]:
    """The verdict after each tick, as the daemon would see them."""
    th = th or Thresholds()
    w = Window(ranks=sigs.ranks, thresholds=th, ops=sigs.ops)
    out = []
    for o in obs:
        w.append(o)
        out.append((o, classify(w, sigs, th)))
    return out


def final(obs: Iterable[Observation], sigs: SignatureSet, th: Thresholds | None = None) -> Verdict:
    """The verdict after the last tick."""
    return classify(window_of(obs), sigs, th or Thresholds())


def first_hang(pairs: Sequence[tuple[Observation, Verdict]]) -> tuple[Observation, Verdict] | None:
    """The first tick whose verdict is a hang, or None."""
    return next(((o, v) for o, v in pairs if v.is_hang), None)


FROZEN_BAR_LOG = "logs/g_vllm16301_offline_startup_then_stuck_0pct.log"  # ends on a 0/1 bar


def frozen_bar(
    tl: Timeline,
    seconds: int,
    *,
    cdn: bool = False,
    stacks: tuple[StackSample, ...] = (),
    stacks_after: int = 8,
    first_logs: tuple[LogEvent, ...] = (),
) -> float:
    """vLLM's `Processed prompts: 0%` bar (real log), then `seconds` ticks with no progress.

    Returns the onset time (the tick the bar froze). `cdn` adds a CDN socket aged from the
    onset; `stacks` arrive from `stacks_after` s on, as the daemon takes them once suspicious.
    """
    onset = tl.now
    bar = events(sample_lines(FROZEN_BAR_LOG))
    for i in range(seconds):
        tl.tick(
            logs=(bar + first_logs) if i == 0 else (),
            conns=(cdn_socket(float(i)),) if cdn else (),
            stacks=stacks if i >= stacks_after else (),
        )
    return onset


def sources(v: Verdict) -> set[str]:
    """The sources the verdict's evidence names."""
    return {e.source for e in v.evidence}


def assert_never_hung(pairs: Sequence[tuple[Observation, Verdict]]) -> None:
    """No tick was reported as a hang (or a dead server)."""
    hung = [(o.t, v.signature) for o, v in pairs if v.is_hang or v.state in ("hung", "dead")]
    assert not hung, f"false hang verdicts: {hung[:3]}"
