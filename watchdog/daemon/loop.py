"""The loop: poll every source, append one Observation, classify, hand the verdict to the sinks.

Nothing in a tick may block for long: every source has its own deadline, stack capture runs in
the background, and one last-resort handler keeps the loop alive whatever a sink does. The
sources are a list, polled in order (the procs source first: later ones read its target from
the tick); each fills the Observation field it names (`Source.part`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.config import Config
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import GpuSample, Observation, StackSample, Verdict
from watchdog.core.state.gpuscope import in_container, server_gpus
from watchdog.core.state.tick import Hook, Tick
from watchdog.core.state.window import Window
from watchdog.engines.detect import EngineInForce
from watchdog.outputs.emit import Emitter
from watchdog.sources.base import Source, SourceTick
from watchdog.sources.deadline import DeadlineCall
from watchdog.sources.schedstat import RunQueueMeter

log = logging.getLogger("hang_watchdog.daemon")

# The Observation fields a source can fill; the loop itself sets the others.
PARTS = frozenset(f.name for f in dataclasses.fields(Observation)) - {
    "t",
    "wall",
    "stacks",
    "sources",
    "log_skipped",
}


class Polled:
    """One source under its deadline: a DeadlineCall around its poll, or none for a source that
    bounds its own waits (`Deadline.inline`), so that no call runs on two threads."""

    def __init__(
        self, source: Source, tick_s: float, run_queue: Callable[[], float | None]
    ) -> None:
        self.source = source
        spec = source.deadline(tick_s)
        self.deadline_s = spec.seconds
        self._call = (
            None
            if spec.inline
            else DeadlineCall(
                source.name,
                source.health,
                spec.seconds,
                hint=spec.hint,
                keep_late=spec.keep_late,
                run_queue=run_queue,
            )
        )

    def poll(self, tick: SourceTick) -> Any:
        """The source's part this tick; None past the deadline (the source marked down) or when
        it raised (a source bug must not stop the loop: marked down too)."""
        try:
            if self._call is None:
                return self.source.poll(tick)
            return self._call(lambda: self.source.poll(tick))
        except Exception as exc:  # last resort: sources should not raise
            self.source.health.down(f"unexpected error: {exc!r}")
            log.debug("source %s raised", self.source.name, exc_info=True)
            return None

    def close(self) -> None:
        if self._call is not None:
            self._call.close()


@dataclass
class LoopStats:
    """What the loop itself did, for the exporter and the self-watchdog."""

    iterations: int = 0
    last_loop_end: float | None = None
    last_duration_s: float = 0.0
    # How late the last iteration started against its schedule (tick_s after the previous
    # start): seconds of CPU starvation or of a slow previous tick.
    last_lag_s: float = 0.0
    errors: int = 0


class Daemon:
    """One watched server: sources in, verdicts out."""

    def __init__(
        self,
        cfg: Config,
        sigs: SignatureSet,
        sources: Sequence[Source],
        *,
        hooks: list[Hook] | None = None,
        emitter: Emitter | None = None,
        engine: EngineInForce | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`engine`: the engine in force at start (forced by --engine, else none yet); each
        tick's sources get the latest one and the process source may detect another."""
        self.cfg, self.sigs = cfg, sigs
        self.sources: list[Source] = list(sources)
        _check_parts(self.sources)
        self._run_queue = RunQueueMeter()  # read before each poll: its files stay open
        self._polled = [Polled(src, cfg.tick_s, self._run_queue.wait_s) for src in self.sources]
        self.hooks: list[Hook] = list(hooks or [])
        self.emitter = emitter or Emitter(cfg.log_format)
        self.clock, self.wall = clock, wall
        self.thresholds = Thresholds.from_config(cfg)
        self.window = Window(
            span_s=cfg.window_s,
            max_len=int(cfg.window_s / cfg.tick_s) * 2 + 16,
            ranks=sigs.ranks,
            thresholds=self.thresholds,
            ops=sigs.ops,
        )
        self.verdict: Verdict | None = None
        self.engine = engine if engine is not None else EngineInForce()
        self.stats = LoopStats()
        self._pending_stacks: tuple[StackSample, ...] = ()
        self._server_environ: dict[str, str] | None = None
        self._gpu_scope: tuple[str, tuple[int, ...]] | None = None
        self._gpu_pick: tuple[int | None, frozenset[str]] | None = None  # (target, GPU ids)
        # NVML reports host PIDs: match them against the server's only outside a container.
        self.host_pids = not in_container()

    def source(self, name: str) -> Any:
        """The source called `name`, or None when there is none (for wiring and hooks)."""
        return next((s for s in self.sources if s.name == name), None)

    def attach_stacks(self, stacks: tuple[StackSample, ...]) -> None:
        """Stack dumps that finished in the background go into the next observation."""
        self._pending_stacks = stacks

    def _log_skipped(self) -> dict[str, int]:
        """The log source's running skip counts (reasons that occurred), for the metrics hook."""
        logs = self.source("logs")
        skipped: dict[str, int] = getattr(logs, "skipped", None) or {}
        return {k: n for k, n in skipped.items() if n}

    def observe(self) -> Observation:
        """One tick's snapshot of every source; a failing source contributes nothing."""
        last_state = self.verdict.state if self.verdict is not None else None
        tick = SourceTick(engine=self.engine, last_state=last_state)
        parts: dict[str, Any] = {}
        for polled in self._polled:
            got = polled.poll(tick)
            if got is not None:
                parts[polled.source.part] = tuple(got) if isinstance(got, list) else got
        self.engine = tick.engine  # the process source's detection, for the next tick and hooks
        gpus = self._server_gpus(parts.get("gpus", ()), tick)
        facts = dict(parts.get("facts", {}))
        if gpus:  # recorded in the timeline; survives a restart of the server (window.py)
            facts["gpu_cc"] = sorted({g.cc for g in gpus if g.cc})
        obs = Observation(
            t=self.clock(),
            wall=self.wall(),
            **{
                **parts,
                "gpus": tuple(gpus),
                "logs": tuple(parts.get("logs", ())),
                "facts": facts,
            },
            stacks=self._pending_stacks,
            sources={s.name: bool(s.health.up) for s in self.sources if s.health.reported},
            log_skipped=self._log_skipped(),
        )
        self._pending_stacks = ()
        return obs

    def _server_gpus(self, gpus: Sequence[GpuSample], tick: SourceTick) -> tuple[GpuSample, ...]:
        """Only the watched server's GPUs count (gpuscope.py); say when the choice changes."""
        if tick.environ is not None:
            self._server_environ = tick.environ  # keep the last one seen: the target may be gone
        target = tick.target_pid
        chosen, how = server_gpus(
            gpus,
            configured=self.cfg.gpus,
            environ=self._server_environ,
            tree_pids=list(tick.tree_pids),
            same_pid_namespace=self.host_pids,
        )
        if how != "all":
            self._gpu_pick = (target, frozenset(_gpu_id(g) for g in chosen))
        elif self._gpu_pick is not None and target in (None, self._gpu_pick[0]):
            # The evidence is gone just when it matters (the process source is stuck behind a
            # driver hang, the server died): keep judging the same GPUs, not every GPU.
            kept = tuple(g for g in gpus if _gpu_id(g) in self._gpu_pick[1])
            if kept:
                chosen, how = kept, "the last choice, its evidence unavailable now"
        key = (how, tuple(g.index for g in chosen))
        if gpus and key != self._gpu_scope:
            self._gpu_scope = key
            log.info("%s", judging_line(chosen, len(gpus), how))
        return chosen

    def tick(self) -> Verdict:
        """Observe, classify, run the hooks; returns the verdict."""
        start = self.clock()
        obs = self.observe()
        self.window.append(obs)
        verdict = classify(self.window, self.sigs, self.thresholds)
        old = self.verdict
        self.verdict = verdict
        if old is None or old.state != verdict.state or old.signature != verdict.signature:
            self.emitter.state_change(old.state if old else None, verdict)
        ctx = self._tick(obs, verdict)
        for hook in self.hooks:
            try:
                hook.on_tick(ctx)
            except Exception:  # last resort: a sink must never stop the watching
                self.stats.errors += 1
                log.exception("hook %s failed; the loop carries on", type(hook).__name__)
        self.stats.iterations += 1
        self.stats.last_loop_end = self.clock()
        # The whole iteration, hooks included; the exporter reports it on the next tick.
        self.stats.last_duration_s = self.stats.last_loop_end - start
        return verdict

    def _tick(self, obs: Observation, verdict: Verdict) -> Tick:
        """What the hooks see of this iteration: no handle on the daemon itself."""
        return Tick(
            obs=obs,
            verdict=verdict,
            window=self.window,
            thresholds=self.thresholds,
            clock=self.clock,
            event=self.emitter.event,
            engine=self.engine.profile.name,
            attach_stacks=self.attach_stacks,
            # The previous iteration's full duration (this one is still running its hooks).
            last_loop_s=self.stats.last_duration_s if self.stats.iterations else None,
            lag_s=self.stats.last_lag_s,
        )

    def run(
        self,
        stop: threading.Event | None = None,
        until: Callable[[Verdict], bool] | None = None,
        max_seconds: float | None = None,
    ) -> Verdict | None:
        """Tick every `tick_s` until `stop` is set, `until(verdict)` holds or time runs out."""
        stop = stop or threading.Event()
        began = self.clock()
        due: float | None = None
        while not stop.is_set():
            t0 = self.clock()
            self.stats.last_lag_s = max(0.0, t0 - due) if due is not None else 0.0
            due = t0 + self.cfg.tick_s
            try:
                verdict: Verdict | None = self.tick()
            except Exception:  # last resort: log and keep watching
                self.stats.errors += 1
                log.exception("loop iteration failed; carrying on")
                verdict = self.verdict
            if verdict is not None and until is not None and until(verdict):
                break
            if max_seconds is not None and self.clock() - began >= max_seconds:
                break
            stop.wait(max(0.0, self.cfg.tick_s - (self.clock() - t0)))
        return self.verdict

    def worst_tick_s(self) -> float:
        """How long one loop can take when every probe hangs at once (each costs its deadline
        once, then is skipped until it returns): what WatchdogSec= and /healthz must allow."""
        return self.cfg.tick_s + sum(p.deadline_s for p in self._polled)

    def close(self) -> None:
        # Hooks first: a restart in flight must finish before the sources (the supervised
        # child's readers among them) are closed.
        for obj in (*self.hooks, *self.sources):
            close = getattr(obj, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # closing is best effort
                    log.debug("closing %s failed", obj, exc_info=True)
        for polled in self._polled:
            polled.close()
        self._run_queue.close()


def judging_line(chosen: Sequence[GpuSample], total: int, how: str) -> str:
    """`judging GPUs 0, 1 of 8 (the server processes' GPUs)`: which GPUs count, and why."""
    which = ", ".join(str(g.index) for g in chosen) or "none"
    noun = "GPU" if len(chosen) == 1 else "GPUs"
    why = {
        "all": "every GPU on the host: the server's own could not be told apart",
        "configured": "the --gpus setting",
        "server processes": "the GPUs the server's processes use",
        "CUDA_VISIBLE_DEVICES indices": "the server's CUDA_VISIBLE_DEVICES",
    }.get(how, how if how.startswith("the ") else f"chosen by {how}")
    return f"judging {noun} {which} of {total} ({why})"


def _gpu_id(g: GpuSample) -> str:
    return g.uuid or str(g.index)


def _check_parts(sources: Sequence[Source]) -> None:
    """Each source fills one Observation field, and no two the same one."""
    seen: dict[str, str] = {}
    for src in sources:
        if src.part not in PARTS:
            raise ValueError(f"source {src.name!r}: {src.part!r} is not an Observation field")
        if src.part in seen:
            raise ValueError(f"sources {seen[src.part]!r} and {src.name!r} both fill {src.part!r}")
        seen[src.part] = src.name
