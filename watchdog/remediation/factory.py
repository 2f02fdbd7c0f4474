"""Builds the remediation hook from the config: the restarter, the persisted state, the canary."""

from __future__ import annotations

from typing import Any

from watchdog.config import Config, ConfigError
from watchdog.remediation.canary import CanaryHook
from watchdog.remediation.hook import RemediationHook
from watchdog.remediation.limits import CLEAR_HINT
from watchdog.remediation.restarters import SuperviseRestarter, make_restarter
from watchdog.remediation.state import StateError, StateStore
from watchdog.signatures import SignatureSet


def make_remediation_hook(cfg: Config, sigs: SignatureSet, built: Any) -> Any:
    """The hook for `cfg` (None when remediation, dry run and canary are all off)."""
    if not (cfg.remediate or cfg.dry_run or cfg.canary):
        return None
    canary = None
    if cfg.canary:
        if not cfg.vllm_url:
            raise ConfigError("key 'canary': needs vllm_url (the server's OpenAI-compatible API)")
        canary = CanaryHook(cfg.vllm_url, idle_s=cfg.canary_idle_s, timeout_s=cfg.canary_timeout_s)
    if not (cfg.remediate or cfg.dry_run):
        return canary
    store = StateStore(cfg.state_dir)
    try:
        state = store.load()
    except StateError as exc:
        raise ConfigError(f"key 'state_dir': {exc}") from exc
    restarter = make_restarter(cfg, built)
    if isinstance(restarter, SuperviseRestarter) and state.active and not cfg.dry_run:
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
    )
