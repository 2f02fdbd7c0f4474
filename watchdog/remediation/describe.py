"""One line for the verdict block: what remediation does, or would do, about a verdict.

The terminal's verdict block ends with it, so an operator reading a hang sees the restart
that `--remediate` makes (or that it is off, a dry run, or below the confidence bar)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import Verdict
from watchdog.engines.profile import EngineProfile
from watchdog.remediation.plan import PlanError, make_plan
from watchdog.remediation.settings import RemediationConfig


def remediation_note(
    cfg: RemediationConfig,
    sigs: SignatureSet,
    verdict: Verdict,
    facts: Mapping[str, Any],
    engine: EngineProfile | None = None,
) -> str:
    """`off; with --remediate it would restart with fallback X: ARGS`, or '' for no plan.

    `engine` is the engine profile in force: the fallback is spelled as that engine takes it.
    """
    if not verdict.is_hang:
        return ""
    try:
        plan = make_plan(verdict, sigs, facts, cfg.fallback_overrides, engine=engine)
    except PlanError as exc:
        return f"no plan: {exc}"
    if plan is None:
        return ""
    if not plan.restart:
        return f"advise only: fallback {plan.fallback} needs an operator; no restart"
    act = plan.describe().split(": ", 1)[1]  # "restart with fallback X: ARGS (why)"
    if not cfg.remediate:
        return f"off; with --remediate it would {act}"
    if cfg.dry_run:
        return f"dry run: would {act}"
    if verdict.confidence < cfg.remediate_min_confidence:
        return (
            f"on, not acting: confidence {verdict.confidence:.2f} is below "
            f"remediate_min_confidence {cfg.remediate_min_confidence:g}"
        )
    return (
        f"on: will {act} (restarter {cfg.restarter}; at most {cfg.max_restarts} restarts per "
        f"{cfg.restart_window_s:g} s, {cfg.cooldown_s:g} s apart)"
    )
