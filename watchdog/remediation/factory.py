"""Builds the remediation hook from the config: the restarter, the persisted state, the canary."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from watchdog.config import Config, ConfigError
from watchdog.core.signatures import SignatureSet

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


def make_remediation_hook(cfg: Config, sigs: SignatureSet, built: Any) -> Any:
    """The hook for `cfg` (None when remediation, dry run and canary are all off)."""
    if not (cfg.remediate or cfg.dry_run or cfg.canary):
        return None
    # Imported here: the default daemon (all three off) reads incident_dir() from this module
    # and must not load the hooks, or httpx through the canary and the smoke test.
    from watchdog.remediation.canary import CanaryHook
    from watchdog.remediation.hook import RemediationHook
    from watchdog.remediation.limits import CLEAR_HINT
    from watchdog.remediation.restarters import SuperviseRestarter, make_restarter
    from watchdog.remediation.state import StateError, StateStore

    canary = None
    if cfg.canary:
        if not cfg.server_url:
            raise ConfigError("key 'canary': needs server_url (the server's OpenAI-compatible API)")
        canary = CanaryHook(
            cfg.server_url, idle_s=cfg.canary_idle_s, timeout_s=cfg.canary_timeout_s
        )
    if not (cfg.remediate or cfg.dry_run):
        return canary
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
    restarter = make_restarter(cfg, built)
    if isinstance(restarter, SuperviseRestarter) and state.active and acts(cfg):
        restarter.apply_at_start(state.active)
        built.daemon.emitter.event(
            "remediation",
            f"fallback still active: {','.join(state.active.get('fallbacks') or [])}; {CLEAR_HINT}",
            outcome="active",
        )

    def busy(on: bool) -> None:
        built.restarting = on

    return RemediationHook(
        cfg,
        sigs,
        restarter=restarter,
        store=store,
        metrics=built.metrics,
        episodes=built.episodes,
        busy=busy,
        canary=canary,
        engine=getattr(built, "engine", None),
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
