"""Builds the remediation hook from its config: the restarter, the state, the fleet rule."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.config import ConfigError
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.state.tick import EventSink
from watchdog.remediation.collaborators import Evidence, RemediationMetrics
from watchdog.remediation.settings import RemediationConfig

if TYPE_CHECKING:  # the default daemon must not import the hooks (httpx, psutil, threads)
    from watchdog.engines.loader import EngineSet
    from watchdog.remediation.hook import RemediationHook
    from watchdog.remediation.restarters import EnvFilter, Supervised

log = logging.getLogger("hang_watchdog.remediation")


def incident_dir(cfg: RemediationConfig) -> str | None:
    """Where bundles go: `incident_dir`, or `<state_dir>/incidents` when remediation acts, so
    every restart has its evidence on disk first."""
    if cfg.incident_dir or not cfg.acts:
        return cfg.incident_dir
    path = str(Path(cfg.state_dir) / "incidents")
    log.info("remediation is on and incident_dir is not set: incident bundles go to %s", path)
    return path


def make_remediation_hook(
    cfg: RemediationConfig,
    sigs: SignatureSet,
    *,
    episodes: Evidence,
    event: EventSink,
    supervisor: Supervised | None,
    child_env: EnvFilter,
    metrics: RemediationMetrics | None = None,
    engines: EngineSet | None = None,
    node: str = "",
) -> RemediationHook | None:
    """The hook for `cfg` (None when remediation and dry run are both off). `node` names this
    host in a deployment (outputs/fleet.py FleetLabels); `child_env` strips what a supervised
    child must not inherit (outputs/sdnotify.py child_environ); `engines`: the profiles the
    tick's engine in force is looked up in, for its spelling of each fallback."""
    if not cfg.on:
        return None
    # Imported here: the default daemon (both off) reads incident_dir() from this module
    # and must not load the hook, or httpx through the smoke test.
    from watchdog.remediation.deployment import decider_for
    from watchdog.remediation.hook import RemediationHook
    from watchdog.remediation.limits import CLEAR_HINT
    from watchdog.remediation.restarters import SuperviseRestarter, make_restarter
    from watchdog.remediation.state import StateError, StateStore

    check_overrides(cfg.fallback_overrides, sigs)
    store = StateStore(cfg.state_dir)
    try:
        state = store.load()
    except StateError as exc:
        raise ConfigError(f"key 'state_dir': {exc}") from exc
    if cfg.acts:
        try:
            store.check_writable()
        except OSError as exc:
            raise ConfigError(
                f"key 'state_dir': cannot create or write {store.dir} "
                f"({exc.strerror or exc}); remediation must record each restart before it "
                "acts: make it a directory the watchdog can write, or set state_dir elsewhere"
            ) from exc
    restarter = make_restarter(cfg, supervisor, child_env)
    if isinstance(restarter, SuperviseRestarter) and state.active and cfg.acts:
        restarter.apply_at_start(state.active)
        event(
            "remediation",
            f"fallback still active: {','.join(state.active.get('fallbacks') or [])}; {CLEAR_HINT}",
            outcome="active",
        )
    return RemediationHook(
        cfg,
        sigs,
        restarter=restarter,
        store=store,
        metrics=metrics,
        episodes=episodes,
        engines=engines,
        fleet=decider_for(cfg, node),
    )


def check_overrides(overrides: Mapping[str, str], sigs: SignatureSet) -> None:
    """Each override names a known signature and a fallback that exists, checked at start:
    a typo found only when the server hangs is found too late."""
    known = {"none", "restart", *sigs.fallbacks}
    for sig_id, fallback in overrides.items():
        if sig_id not in sigs.ids:
            raise ConfigError(
                f"key 'fallback_overrides': {sig_id!r} is not a signature id; "
                f"known: {', '.join(sigs.ids)}"
            )
        if fallback not in known:
            raise ConfigError(
                f"key 'fallback_overrides': {sig_id} = {fallback!r} names no fallback; "
                f"use one of {', '.join(sorted(known))} (or define [fallback.{fallback}] in a "
                "--signatures file)"
            )
