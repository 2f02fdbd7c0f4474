"""The loop: poll every source, append one Observation, classify, hand the verdict to the sinks.

Nothing in a tick may block for long: every source has its own deadline, stack capture runs in
the background, and one last-resort handler keeps the loop alive whatever a sink does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from watchdog.config import Config
from watchdog.core.classify import Thresholds, classify
from watchdog.core.gpuscope import in_container, server_gpus
from watchdog.core.model import (
    GpuSample,
    LogEvent,
    Observation,
    ProcSnapshot,
    StackSample,
    Verdict,
)
from watchdog.core.signatures import SignatureSet
from watchdog.core.window import Window
from watchdog.outputs.emit import Emitter
from watchdog.sources.base import SourceHealth
from watchdog.sources.deadline import DeadlineCall
from watchdog.sources.procenv import read_environ

log = logging.getLogger("hang_watchdog.daemon")


class Hook(Protocol):
    """Something that reacts to each tick (episodes/incidents, remediation, metrics, notify)."""

    def on_tick(self, obs: Observation, verdict: Verdict, daemon: Daemon) -> None: ...


@dataclass
class Sources:
    """The daemon's inputs; any may be None (not configured)."""

    gpu: Any = None
    logs: Any = None
    server: Any = None
    procs: Any = None
    conns: Any = None
    facts: Any = None

    def all(self) -> list[Any]:
        return [
            s
            for s in (self.gpu, self.logs, self.server, self.procs, self.conns, self.facts)
            if s is not None
        ]


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
        sources: Sources,
        *,
        hooks: list[Hook] | None = None,
        emitter: Emitter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.sigs, self.sources = cfg, sigs, sources
        self.hooks: list[Hook] = list(hooks or [])
        self.emitter = emitter or Emitter(cfg.log_format)
        self.clock, self.wall = clock, wall
        self.window = Window(
            span_s=cfg.window_s, max_len=int(cfg.window_s / cfg.tick_s) * 2 + 16, ranks=sigs.ranks
        )
        self.thresholds = Thresholds.from_config(cfg)
        self.verdict: Verdict | None = None
        self.stats = LoopStats()
        self._pending_stacks: tuple[StackSample, ...] = ()
        self._injected: list[LogEvent] = []
        # /proc reads of a process stuck in the driver can block: never in the loop's thread.
        deadline = max(1.0, 2 * cfg.tick_s)
        self._procs_call = DeadlineCall("procs", _health(sources.procs), deadline)
        self._facts_call = DeadlineCall("facts", _health(sources.facts), deadline)
        self._environ_call = DeadlineCall("environ", _health(sources.conns), deadline)
        # httpx's timeouts bound each read, not the whole response: a server (or exporter)
        # that trickles bytes would hold a scrape for ever. Hard deadlines around both.
        self._gpu_call = DeadlineCall("gpu", _health(sources.gpu), _scrape_s(sources.gpu, 1))
        self._server_call = DeadlineCall(
            "server", _health(sources.server), _scrape_s(sources.server, 2)
        )
        # A FIFO or a hung network mount at a log path blocks open() or read() for ever.
        self._logs_call = DeadlineCall(
            "logs",
            _health(sources.logs),
            max(0.5, cfg.tick_s),
            hint="a FIFO or a hung network mount at the log path, or a flood of lines?",
            keep_late=True,
        )
        self._server_environ: dict[str, str] | None = None
        self._gpu_scope: tuple[str, tuple[int, ...]] | None = None
        self._gpu_pick: tuple[int | None, frozenset[str]] | None = None  # (target, GPU ids)
        # NVML reports host PIDs: match them against the server's only outside a container.
        self.host_pids = not in_container()

    def inject(self, event: LogEvent) -> None:
        """An event a hook observed itself (the idle canary) goes into the next observation."""
        self._injected.append(event)

    def attach_stacks(self, stacks: tuple[StackSample, ...]) -> None:
        """Stack dumps that finished in the background go into the next observation."""
        self._pending_stacks = stacks

    def observe(self) -> Observation:
        """One tick's snapshot of every source; a failing source contributes nothing."""
        s = self.sources
        procs: ProcSnapshot | None = _safe(s.procs, lambda: self._procs_call(s.procs.poll))
        pids = (
            list(s.procs.pids())
            if s.procs is not None and procs is not None and procs.alive
            else []
        )
        target = procs.target_pid if procs is not None and procs.alive else None
        facts = dict(_safe(s.facts, lambda: self._facts_call(lambda: s.facts.poll(target))) or {})
        # The facts source reads the target's environment each tick already; reuse it.
        environ = facts.get("environ")
        if environ is None and s.conns is not None and target is not None:
            environ = self._environ_call(lambda: read_environ(target))
        gpus = self._server_gpus(
            _safe(s.gpu, lambda: self._gpu_call(s.gpu.poll)) or (), environ, pids, target
        )
        if gpus:  # recorded in the timeline; survives a restart of the server (window.py)
            facts = {**facts, "gpu_cc": sorted({g.cc for g in gpus if g.cc})}
        obs = Observation(
            t=self.clock(),
            wall=self.wall(),
            gpus=tuple(gpus),
            logs=tuple(_safe(s.logs, lambda: self._logs_call(s.logs.poll)) or ())
            + tuple(self._injected),
            server=_safe(s.server, lambda: self._server_call(s.server.poll)),
            procs=procs,
            conns=tuple(_safe(s.conns, lambda: s.conns.poll(pids, environ)) or ()),
            stacks=self._pending_stacks,
            facts={k: v for k, v in facts.items() if k != "environ"},
            sources=_source_states(s),
        )
        self._pending_stacks = ()
        self._injected = []
        return obs

    def _server_gpus(
        self,
        gpus: Sequence[GpuSample],
        environ: dict[str, str] | None,
        pids: list[int],
        target: int | None,
    ) -> tuple[GpuSample, ...]:
        """Only the watched server's GPUs count (gpuscope.py); say when the choice changes."""
        if environ is not None:
            self._server_environ = environ  # keep the last one seen: the target may be gone
        chosen, how = server_gpus(
            gpus,
            configured=self.cfg.gpus,
            environ=self._server_environ,
            tree_pids=pids,
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
        for hook in self.hooks:
            try:
                hook.on_tick(obs, verdict, self)
            except Exception:  # last resort: a sink must never stop the watching
                self.stats.errors += 1
                log.exception("hook %s failed; the loop carries on", type(hook).__name__)
        self.stats.iterations += 1
        self.stats.last_loop_end = self.clock()
        # The whole iteration, hooks included; the exporter reports it on the next tick.
        self.stats.last_duration_s = self.stats.last_loop_end - start
        return verdict

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
                verdict = self.tick()
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
        s = self.sources
        calls = (
            (s.procs, self._procs_call),
            (s.facts, self._facts_call),
            (s.conns, self._environ_call),
            (s.gpu, self._gpu_call),
            (s.server, self._server_call),
            (s.logs, self._logs_call),
        )
        budget = sum(call.deadline_s for source, call in calls if source is not None)
        return self.cfg.tick_s + budget

    def close(self) -> None:
        # Hooks first: a restart in flight must finish before the sources (the supervised
        # child's readers among them) are closed.
        for obj in (*self.hooks, *self.sources.all()):
            close = getattr(obj, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # closing is best effort
                    log.debug("closing %s failed", obj, exc_info=True)
        for call in (
            self._procs_call,
            self._facts_call,
            self._environ_call,
            self._gpu_call,
            self._server_call,
            self._logs_call,
        ):
            call.close()


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


def _scrape_s(source: Any, requests: int) -> float:
    """A source's own per-request limit times its requests per poll, plus a margin; 0 for a
    source that never waits (`--gpu-source none`)."""
    own = getattr(source, "deadline_s", None)
    if own is None:
        own = getattr(source, "timeout_s", None)
    if own is None:
        own = 2.0
    return requests * float(own) + 1.0 if own else 0.0


def _gpu_id(g: GpuSample) -> str:
    return g.uuid or str(g.index)


def _source_states(s: Sources) -> dict[str, bool]:
    """Each source's up state, with those a source carries inside it (the facts source's NCCL
    RAS query, when configured or once it answered: `sub_sources`)."""
    out: dict[str, bool] = {}
    for src in s.all():
        for each in (src, *getattr(src, "sub_sources", ())):
            if hasattr(each, "health"):
                out[each.name] = bool(each.health.up)
    return out


def _health(source: Any) -> SourceHealth | None:
    return getattr(source, "health", None)


def _safe(source: Any, call: Callable[[], Any]) -> Any:
    """A source's poll, with the last-resort guard: sources should not raise, but if one does,
    it is marked down and the tick goes on."""
    if source is None:
        return None
    try:
        return call()
    except Exception as exc:  # a source bug must not stop the loop
        health = getattr(source, "health", None)
        if health is not None:
            health.down(f"unexpected error: {exc!r}")
        log.debug("source %s raised", getattr(source, "name", source), exc_info=True)
        return None
