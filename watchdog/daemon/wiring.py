"""Builds the daemon's sources and hooks from a Config: the one place that knows constructors."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from watchdog import __version__
from watchdog.config import Config, ConfigError
from watchdog.configcheck import check_stale_after, check_watchdog_interval
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import Observation
from watchdog.daemon.episodes import EpisodeHook
from watchdog.daemon.heap import release_free_heap
from watchdog.daemon.loop import Daemon
from watchdog.daemon.supervise import Supervisor
from watchdog.engines.detect import EngineInForce
from watchdog.engines.loader import EngineSet
from watchdog.knowledge import Knowledge
from watchdog.outputs.emit import Emitter
from watchdog.remediation.settings import RemediationConfig
from watchdog.sources.base import Source

if TYPE_CHECKING:  # built on demand: the default daemon must not import what it does not run
    from watchdog.outputs.export import MetricsSink
    from watchdog.outputs.metrics_http import MetricsServer
    from watchdog.remediation.hook import RemediationHook
    from watchdog.sources.canary import CanarySource
    from watchdog.sources.conns import ConnSource
    from watchdog.sources.facts import FactsSource
    from watchdog.sources.gpu.source import AnyGpuSource
    from watchdog.sources.logs.source import BlockReader, LogSource, StreamReader
    from watchdog.sources.nccl_ras import RasSource
    from watchdog.sources.procs import ProcSource, TargetFinder
    from watchdog.sources.server import ServerSource
    from watchdog.sources.stacks.capture import StackCapturer

log = logging.getLogger("hang_watchdog.wiring")


@dataclass
class Built:
    """A ready-to-run daemon and what the CLI needs to manage it."""

    daemon: Daemon
    # The engine profiles in force (shipped + --engines files); the engine detected among them
    # travels in each tick (daemon.engine is the latest).
    engines: EngineSet
    supervisor: Supervisor | None = None
    server: MetricsServer | None = None
    metrics: MetricsSink | None = None
    episodes: EpisodeHook | None = None
    stdin: StreamReader | None = None  # the reader of `--log-file -`: its EOF means the pipe closed
    capturer: StackCapturer | None = None  # its py-spy runs are killed at shutdown
    remediation: RemediationHook | None = None  # when remediation is on

    @property
    def restarting(self) -> bool:
        """A restart is under way: the supervised server's exit now is the restart's doing,
        not the end of the run (`run -- COMMAND` must not stop with it)."""
        return bool(self.remediation is not None and self.remediation.restarting)

    def close(self) -> None:
        if self.capturer is not None:
            self.capturer.close()
        self.daemon.close()
        if self.server is not None:
            self.server.stop()


def build(
    cfg: Config, *, knowledge: Knowledge | None = None, emitter: Emitter | None = None
) -> Built:
    """Sources, sinks and hooks for `cfg`; ConfigError for settings that cannot work.

    The knowledge (shipped plus cfg's `signatures` and `engines` files) is loaded here, once,
    unless given, and each part gets what it reads of it."""
    kb = knowledge or load_for(cfg)
    sigs = kb.signatures
    engine = _engine(cfg, kb)
    remedy = RemediationConfig.of(cfg)  # built once: remediation reads only its own keys
    supervisor = Supervisor(cfg.command, death_pattern=_death(sigs)) if cfg.command else None
    logs, stdin = _logs(cfg, sigs, supervisor, kb.engines)
    procs = _procs(cfg, supervisor, kb.engines)
    emitter = emitter or Emitter(cfg.log_format)
    gpu = _gpu(cfg)
    # Polled in this order: the procs source first, its target and tree in the tick for the
    # others; the facts source reads the environment the others reuse. The log source comes
    # before the server scrape: its first poll starts at the end of the file (`tail -F`), so a
    # line written while the scrape waits would be missed.
    listed: tuple[Source | None, ...] = (
        procs,
        _facts(kb),
        gpu,
        logs,
        _server(cfg, kb.engines),
        _conns(cfg) if procs is not None else None,
        _ras(cfg),
        _canary(cfg, emitter),
    )
    sources: list[Source] = [s for s in listed if s is not None]
    daemon = Daemon(cfg, sigs, sources, emitter=emitter, engine=engine)
    if emitter.remediation is None:  # the verdict block says what --remediate does about it
        from watchdog.remediation.describe import remediation_note

        emitter.remediation = lambda v: remediation_note(
            remedy, sigs, v, daemon.window.progress.facts, engine=daemon.engine.profile
        )
    built = Built(daemon=daemon, engines=kb.engines, supervisor=supervisor, stdin=stdin)
    _metrics(cfg, sigs, built)
    _episodes(cfg, remedy, built, kb.packages, logs=logs, gpu=gpu)
    _remediation(cfg, remedy, sigs, built)
    _notify(built)
    # Start-up's freed C heap back to the kernel (daemon/heap.py says how much).
    release_free_heap()
    return built


def _death(sigs: SignatureSet) -> re.Pattern[str] | None:
    """The engine_dead signature's log pattern: a child that printed it and exited 0 failed."""
    sig = sigs.get("engine_dead")
    pats = [r.pattern.pattern for r in sig.evidence if r.pattern] if sig is not None else []
    return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None


def _gpu(cfg: Config) -> AnyGpuSource | None:
    from watchdog.sources.gpu.source import make_gpu_source

    if cfg.gpu_source.strip() == "none":
        # Off on purpose: no source at all, so no `source_up{source="gpu"} 0` for
        # HangWatchdogBlind to fire on, and no poll deadline to miss.
        return None
    try:
        return make_gpu_source(cfg.gpu_source)
    except ValueError as exc:
        raise ConfigError(f"key 'gpu_source': {exc}") from exc


def load_for(cfg: Config) -> Knowledge:
    """The shipped knowledge plus cfg's operator files: SignatureError for a bad signature
    file (the CLI exits 2), ConfigError naming `engines` for a bad engine profile file."""
    from watchdog.engines.loader import EngineError, load_engines

    sigs = load_signatures(cfg.signatures)
    try:
        engines = load_engines(cfg.engines)
    except EngineError as exc:
        raise ConfigError(f"key 'engines': {exc}") from exc
    return Knowledge.of(sigs, engines)


def _engine(cfg: Config, kb: Knowledge) -> EngineInForce:
    """The engine in force at start: the one forced by --engine, else none recognised yet."""
    try:
        return EngineInForce.at_start(kb.engines, cfg.engine)
    except ValueError as exc:
        raise ConfigError(f"key 'engine': {exc}") from exc


def _logs(
    cfg: Config, sigs: SignatureSet, supervisor: Supervisor | None, engines: EngineSet
) -> tuple[LogSource | None, StreamReader | None]:
    """The log source, and the standard-input reader when `--log-file -` (its EOF counts)."""
    from watchdog.sources.logs.parse import LogPatterns
    from watchdog.sources.logs.source import FileFollower, LogSource, StreamReader

    readers: list[BlockReader] = []
    stdin = None
    for path in cfg.log_files:
        if path == "-":
            stdin = stdin or StreamReader(sys.stdin.buffer, "stdin")
            readers.append(stdin)
        else:
            readers.append(FileFollower(path))
    if cfg.journal_unit:
        from watchdog.sources.logs.journal import JournalReader

        readers.append(JournalReader(cfg.journal_unit))
    if supervisor is not None:
        readers.append(supervisor.reader())
    if not readers:
        return None, None
    patterns = LogPatterns.from_engines(engines)  # operator profiles' lines too
    # Half a tick for parsing, at most 0.3 s: the loop stays under its tick through a burst
    # (what the budget leaves is carried to the next tick, not dropped).
    budget = min(0.3, cfg.tick_s / 2)
    source = LogSource(
        readers,
        keep=sigs.log_keep_pattern(),
        ops=sigs.ops,
        patterns=patterns,
        budget_s=budget,
        compile_in_child=True,  # the compiler's memory leaves with the child (~3 MiB RSS)
    )
    return source, stdin


def _server(cfg: Config, engines: EngineSet) -> ServerSource | None:
    if not cfg.server_url:
        return None
    from watchdog.sources.server import ServerSource

    try:
        return ServerSource(cfg.server_url, engines=engines)
    except ValueError as exc:
        raise ConfigError(f"key 'server_url': {exc}") from exc


def _procs(cfg: Config, supervisor: Supervisor | None, engines: EngineSet) -> ProcSource | None:
    from watchdog.sources import procs

    try:
        finder: TargetFinder
        if supervisor is not None:
            finder = procs.ChildTarget(supervisor.current)
        elif cfg.pid is not None:
            finder = procs.PidTarget(cfg.pid)
        elif cfg.match:
            finder = procs.MatchTarget(cfg.match)
        elif cfg.systemd_unit:
            finder = procs.SystemdTarget(cfg.systemd_unit)
        else:
            return None
    except (ValueError, re.error) as exc:
        raise ConfigError(f"target: {exc}") from exc
    return procs.ProcSource(finder, engines=engines)


def _conns(cfg: Config) -> ConnSource:
    from watchdog.sources.conns import DEFAULT_CDN, CdnHosts, ConnSource, Resolver

    try:
        hosts = CdnHosts(cfg.cdn_hosts, default=DEFAULT_CDN if cfg.cdn_default else None)
    except ValueError as exc:
        raise ConfigError(f"key 'cdn_hosts': {exc}") from exc
    # The default CDN not resolving is normal on an air-gapped host: said once, quietly.
    quiet = frozenset({DEFAULT_CDN[0]}) if cfg.cdn_default else frozenset()
    return ConnSource(hosts, Resolver(quiet=quiet))


def _facts(kb: Knowledge) -> FactsSource:
    from watchdog.sources.facts import FactsSource

    # Operator profiles' distributions are recorded too (--engines FILE).
    return FactsSource(packages=kb.packages, modules=kb.modules)


def _ras(cfg: Config) -> RasSource | None:
    if cfg.nccl_ras == "off":
        return None
    from watchdog.sources.nccl_ras import DEFAULT_ADDR, RasClient, RasSource

    client = RasClient(cfg.nccl_ras_addr or DEFAULT_ADDR, deadline_s=cfg.nccl_ras_deadline_s)
    configured = bool(cfg.nccl_ras_addr) or cfg.nccl_ras == "on"
    return RasSource(
        client, mode=cfg.nccl_ras, interval_s=cfg.nccl_ras_interval_s, configured=configured
    )


def _canary(cfg: Config, emitter: Emitter) -> CanarySource | None:
    """The idle canary (None when `canary` is off): a source whose answer is the
    Observation's `canary` field."""
    if not cfg.canary:
        return None
    if not cfg.server_url:
        raise ConfigError("key 'canary': needs server_url (the server's OpenAI-compatible API)")
    # Imported here: the default daemon must not load httpx through the canary.
    from watchdog.sources.canary import CanarySource

    return CanarySource(
        cfg.server_url,
        idle_s=cfg.canary_idle_s,
        timeout_s=cfg.canary_timeout_s,
        event=emitter.event,
    )


def _metrics(cfg: Config, sigs: SignatureSet, built: Built) -> None:
    from watchdog.outputs.export import MetricsSink
    from watchdog.outputs.metrics_http import MetricsServer, parse_addr

    try:
        addr = parse_addr(cfg.metrics_addr)
    except ValueError as exc:
        raise ConfigError(f"key 'metrics_addr': {exc}") from exc
    from watchdog.outputs.fleet import FleetLabels

    sink = MetricsSink(
        sigs.ids,
        version=__version__,
        stale_after_s=cfg.metrics_stale_s,
        fleet=FleetLabels.resolve(cfg.deployment, cfg.node),
    )
    built.metrics = sink
    from watchdog.outputs.metrics_hook import MetricsHook

    built.daemon.hooks.append(MetricsHook(sink))  # log skips reach it in each Observation
    if addr is not None:
        check_stale_after(cfg, built.daemon.worst_tick_s())
        built.server = MetricsServer(sink, cfg.metrics_addr)


def _episodes(
    cfg: Config,
    remedy: RemediationConfig,
    built: Built,
    packages: tuple[str, ...],
    *,
    logs: LogSource | None,
    gpu: AnyGpuSource | None,
) -> None:
    capturer = None
    if cfg.stacks and built.daemon.source("procs") is not None:
        from watchdog.sources.stacks.capture import StackCapturer

        capturer = StackCapturer(
            pyspy=cfg.pyspy,
            native=cfg.stack_native,
            with_locals=cfg.stack_locals,
            deadline_s=cfg.stack_deadline_s,
            second_after_s=cfg.stack_second_after_s,
        )
        built.capturer = capturer
    from watchdog.remediation.factory import incident_dir

    writer = None
    bundles = incident_dir(remedy)  # remediation defaults it: evidence before any restart
    if bundles:
        from watchdog.outputs.incident import IncidentWriter

        writer = IncidentWriter(
            _incident_root(bundles, defaulted=not cfg.incident_dir),
            max_incidents=cfg.max_incidents,
            max_bytes=cfg.max_incident_bytes,
        )
    hook = EpisodeHook(
        capturer=capturer,
        writer=writer,
        log_tail=(lambda: logs.tail(500)) if logs is not None else (lambda: ()),
        environment=lambda obs: _environment(built.daemon, gpu, obs, packages),
        metrics=built.metrics,
        capture_wait_s=cfg.stack_deadline_s * 3 + cfg.stack_second_after_s + 5,
    )
    built.episodes = hook
    built.daemon.hooks.append(hook)


def _incident_root(path: str, *, defaulted: bool = False) -> Path:
    """The bundle directory, created and probed now: a bad path must not wait for a hang."""
    from watchdog.outputs.incident import DIR_MODE

    root = Path(path)
    key = "key 'incident_dir'" + (" (by default state_dir/incidents)" if defaulted else "")
    if root.exists() and not root.is_dir():
        raise ConfigError(
            f"{key}: {root} is a file, not a directory; give a directory for incident bundles "
            "with --incident-dir (it is created if missing)"
        )
    try:
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".tmp-", dir=root))  # as IncidentWriter.write does
    except OSError as exc:
        raise ConfigError(
            f"{key}: cannot write incident bundles to {root}: {exc.strerror or exc}; "
            "give a writable directory with --incident-dir"
        ) from exc
    return root


def _environment(
    daemon: Daemon, gpu: AnyGpuSource | None, obs: Observation, packages: tuple[str, ...]
) -> dict[str, Any]:
    from watchdog.outputs.incident import build_environment
    from watchdog.sources.pyenv import COMMON

    driver = None
    if gpu is not None and hasattr(gpu, "driver_version"):
        try:
            driver = gpu.driver_version()
        except Exception:  # best effort: a lost GPU must not stop the bundle
            driver = None
    target = obs.procs.target_pid if obs.procs is not None else None
    facts = daemon.window.progress.facts
    if obs.nccl_ras is not None:  # the bundle's facts carried NCCL's view before it had a field
        facts = {**facts, "nccl_ras": obs.nccl_ras}
    env = build_environment(
        target_pid=target,
        gpus=obs.gpus,
        facts=facts,
        driver=driver,
        engine_packages=tuple(p for p in packages if p not in COMMON),
    )
    # replay re-classifies with the thresholds this daemon used
    env["watchdog"] = {"version": __version__, "thresholds": dataclasses.asdict(daemon.thresholds)}
    return env


def _remediation(cfg: Config, remedy: RemediationConfig, sigs: SignatureSet, built: Built) -> None:
    if not remedy.on:
        return  # factory's own rule for "no hook"; not importing it saves about 1 MiB RSS
    from watchdog.outputs.fleet import FleetLabels
    from watchdog.outputs.sdnotify import child_environ
    from watchdog.remediation.factory import make_remediation_hook

    assert built.episodes is not None  # _episodes ran first: evidence before any restart
    hook = make_remediation_hook(
        remedy,
        sigs,
        episodes=built.episodes,
        event=built.daemon.emitter.event,
        supervisor=built.supervisor,
        child_env=child_environ,
        metrics=built.metrics,
        engines=built.engines,
        node=FleetLabels.resolve(cfg.deployment, cfg.node).node,
    )
    if hook is not None:
        built.daemon.hooks.append(hook)
        built.remediation = hook


def _notify(built: Built) -> None:
    from watchdog.outputs.sdnotify import Notifier

    notifier = Notifier.from_env()
    interval = notifier.watchdog_interval_s()
    if interval is not None:
        check_watchdog_interval(built.daemon.cfg, built.daemon.worst_tick_s(), interval)
    if notifier.enabled:
        from watchdog.outputs.notify_hook import NotifyHook

        built.daemon.hooks.append(NotifyHook(notifier))
