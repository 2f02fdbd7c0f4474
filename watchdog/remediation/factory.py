"""Builds the remediation hook and the canary from the config: the restarter, the state."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.config import Config, ConfigError
from watchdog.core.signatures import SignatureSet
from watchdog.core.tick import EventSink
from watchdog.remediation.collaborators import Evidence, RemediationMetrics

if TYPE_CHECKING:  # the default daemon must not import the hooks (httpx, psutil, threads)
    from watchdog.engines.profile import EngineProfile
    from watchdog.remediation.canary import CanaryHook
    from watchdog.remediation.hook import RemediationHook
    from watchdog.remediation.restarters import EnvFilter, Supervised

log = logging.getLogger("hang_watchdog.remediation")


def acts(cfg: Config) -> bool:
    """Whether remediation restarts anything (a dry run only reports)."""
    return cfg.remediate and not cfg.dry_run


def incident_dir(cfg: Config) -> str | None:
    """Where bundles go: `incident_dir`, or `<state_dir>/incidents` when remediation acts, so
    every restart has its evidence on disk first."""
    if cfg.incident_dir or not acts(cfg):
        return cfg.incident_dir
    path = str(Path(cfg.state_dir) / "incidents")
    log.info("remediation is on and incident_dir is not set: incident bundles go to %s", path)
    return path


def make_canary(cfg: Config) -> CanaryHook | None:
    """The idle canary hook for `cfg` (None when `canary` is off)."""
    if not cfg.canary:
        return None
    if not cfg.server_url:
        raise ConfigError("key 'canary': needs server_url (the server's OpenAI-compatible API)")
    # Imported here: the default daemon must not load httpx through the canary.
    from watchdog.remediation.canary import CanaryHook

    return CanaryHook(cfg.server_url, idle_s=cfg.canary_idle_s, timeout_s=cfg.canary_timeout_s)


def make_remediation_hook(
    cfg: Config,
    sigs: SignatureSet,
    *,
    episodes: Evidence,
    event: EventSink,
    supervisor: Supervised | None,
    child_env: EnvFilter,
    metrics: RemediationMetrics | None = None,
    engine: Callable[[], EngineProfile | None] = lambda: None,
    node: str = "",
) -> RemediationHook | None:
    """The hook for `cfg` (None when remediation and dry run are both off). `node` names this
    host in a deployment (outputs/fleet.py FleetLabels); `child_env` strips what a supervised
    child must not inherit (outputs/sdnotify.py child_environ)."""
    if not (cfg.remediate or cfg.dry_run):
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
    if acts(cfg):
        try:
            store.check_writable()
        except OSError as exc:
            raise ConfigError(
                f"key 'state_dir': cannot create or write {store.dir} "
                f"({exc.strerror or exc}); remediation must record each restart before it "
                "acts: make it a directory the watchdog can write, or set state_dir elsewhere"
            ) from exc
    restarter = make_restarter(cfg, supervisor, child_env)
    if isinstance(restarter, SuperviseRestarter) and state.active and acts(cfg):
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
        engine=engine,
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
