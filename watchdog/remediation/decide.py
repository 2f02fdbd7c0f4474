"""What to do about a hang verdict, as a pure rule chain: inputs in, one Decision out.

The order is the safety argument: nothing before the evidence is on disk, one decision per
episode, no restart without a plan that restarts, below the confidence floor, on a node that
does not hold a deployment's cause, in a dry run, or past the limits (limits.py). Rules that
can change within an episode (confidence, fleet, cooldown) leave it open for later ticks.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

from watchdog.remediation.limits import Gate
from watchdog.remediation.plan import Plan


class Kind(Enum):
    """The decision's kind; the hook carries out each."""

    NOTHING = "nothing"  # no report (evidence not on disk yet, episode done, no plan)
    SKIP = "skip"  # report why not (once per episode and reason)
    ASK_FLEET = "ask_fleet"  # the deployment's decider must answer first (it is not pure)
    DRY_RUN = "dry_run"  # report the plan, act on nothing
    RESTART = "restart"  # record the restart in the state, then start it


class Unasked(Enum):
    """The fleet decider has not been asked this tick (it queries Prometheus)."""

    UNASKED = "unasked"


UNASKED = Unasked.UNASKED


@dataclass(frozen=True)
class Facts:
    """Everything a decision depends on, already read."""

    episode: Hashable | None  # the current episode once its evidence is on disk
    handled: Hashable | None  # the episode already decided for good
    plan: Plan | None  # make_plan's answer (None: the signature has no remediation)
    plan_error: str = ""  # why make_plan refused ("" when it did not)
    fix: str = ""  # the verdict's fix text, for an advise-only plan
    confidence: float = 0.0
    min_confidence: float = 0.0
    fleet: str | None | Unasked = UNASKED  # why the deployment forbids it (None: it allows)
    dry_run: bool = False
    limits: Gate = Gate()


@dataclass(frozen=True)
class Decision:
    """One tick's decision; `handled` closes the episode (it is not reconsidered)."""

    kind: Kind
    handled: bool = False
    why: str = ""
    action: str = ""  # the metric's action label: the plan's, "?" without one
    outcome: str = "skipped"
    rule: str = ""  # a reason whose text changes (a cooldown counts down) is said once per rule
    exhausts: str = ""  # the cap was reached: latch it into the state


def decide(f: Facts) -> Decision:
    """The first rule that applies, in the order of the module docstring."""
    if f.episode is None or f.episode == f.handled:
        return Decision(Kind.NOTHING)
    if f.plan_error:
        return Decision(Kind.SKIP, handled=True, why=f"no plan: {f.plan_error}", action="?")
    plan = f.plan
    if plan is None:
        return Decision(Kind.NOTHING, handled=True)
    if not plan.restart:
        why = f"{plan.describe()}: {f.fix or 'see the incident'}"
        return Decision(Kind.SKIP, handled=True, why=why, action=plan.action)
    if f.confidence < f.min_confidence:
        # Not handled: the confidence may still rise within this episode.
        why = f"confidence {f.confidence:.2f} < remediate_min_confidence {f.min_confidence:.2f}"
        return Decision(Kind.SKIP, why=f"not acting on {plan.signature}: {why}", action=plan.action)
    if f.fleet is UNASKED:
        return Decision(Kind.ASK_FLEET, action=plan.action)
    if f.fleet:
        # Not handled: the stacks that name the cause rank may still arrive.
        why = f"not acting on {plan.signature}: {f.fleet}"
        return Decision(Kind.SKIP, why=why, action=plan.action)
    if f.dry_run:
        return Decision(Kind.DRY_RUN, handled=True, action=plan.action)
    if f.limits.blocked:
        # A cooldown ends: that episode is reconsidered every tick (said once), else a server
        # that hangs again soon after a restart stays hung. Reaching the cap latches.
        return Decision(Kind.SKIP, handled=bool(f.limits.exhausts), why=f.limits.blocked,
                        action=plan.action, rule=f.limits.rule,
                        exhausts=f.limits.exhausts)  # fmt: skip
    return Decision(Kind.RESTART, action=plan.action)
