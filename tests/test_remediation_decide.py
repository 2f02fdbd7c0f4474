"""The remediation rule chain as a table (every rule a row: inputs -> decision), and the hook's
state machine (the moves it allows and the ones it refuses)."""

from __future__ import annotations

import dataclasses

import pytest

from watchdog.remediation.decide import UNASKED, Decision, Facts, Kind, decide
from watchdog.remediation.limits import Gate
from watchdog.remediation.machine import ALLOWED, Attempt, Machine, Phase, TransitionError
from watchdog.remediation.plan import Plan
from watchdog.remediation.restarters import RestartJob
from watchdog.remediation.verify import Verifier

SIG, FB = "trtllm_attention_deadlock", "disable_trtllm_attention"
RESTART = Plan(SIG, FB, restart=True, args=("--attention-config.use_trtllm_attention=0",))
ADVISE = Plan("jit_toolchain_missing", "install_toolchain", restart=False)
EP = ("episode", 1.0)
# Every rule passes: an unhandled episode with its evidence, a restart plan, enough confidence,
# no deployment (fleet None), not a dry run, within the limits.
READY = Facts(episode=EP, handled=None, plan=RESTART, confidence=0.95, min_confidence=0.8,
              fleet=None, limits=Gate())  # fmt: skip
COOLING = Gate("cooldown: last restart 10 s ago (cooldown_s 300)", rule="cooldown")
CAPPED = Gate("remediation exhausted: 3 restarts", exhausts="3 restarts", rule="cap")
LATCHED = Gate("remediation exhausted (3 restarts); clear it", rule="exhausted")
WHY_LOW = f"not acting on {SIG}: confidence 0.50 < remediate_min_confidence 0.80"
ADVICE = f"{ADVISE.describe()}: install nvcc"

ROWS: list[tuple[str, dict[str, object], Decision]] = [
    ("evidence not on disk yet", {"episode": None}, Decision(Kind.NOTHING)),
    ("episode already decided", {"handled": EP}, Decision(Kind.NOTHING)),
    ("make_plan refused", {"plan": None, "plan_error": "version unknown"},
     Decision(Kind.SKIP, handled=True, why="no plan: version unknown", action="?")),
    ("no remediation for the signature", {"plan": None}, Decision(Kind.NOTHING, handled=True)),
    ("advise only", {"plan": ADVISE, "fix": "install nvcc"},
     Decision(Kind.SKIP, handled=True, why=ADVICE, action="install_toolchain")),
    ("advise only, no fix text", {"plan": ADVISE},
     Decision(Kind.SKIP, handled=True, why=f"{ADVISE.describe()}: see the incident",
              action="install_toolchain")),
    ("confidence below the floor", {"confidence": 0.5},
     Decision(Kind.SKIP, why=WHY_LOW, action=FB)),
    ("a deployment: the decider must answer", {"fleet": UNASKED},
     Decision(Kind.ASK_FLEET, action=FB)),
    ("the deployment forbids it", {"fleet": "deployment 'd': rank 3 on node-b decides"},
     Decision(Kind.SKIP, why=f"not acting on {SIG}: deployment 'd': rank 3 on node-b decides",
              action=FB)),
    ("dry run", {"dry_run": True}, Decision(Kind.DRY_RUN, handled=True, action=FB)),
    ("cooldown", {"limits": COOLING},
     Decision(Kind.SKIP, why=COOLING.blocked, action=FB, rule="cooldown")),
    ("cap reached now: latches", {"limits": CAPPED},
     Decision(Kind.SKIP, handled=True, why=CAPPED.blocked, action=FB, rule="cap",
              exhausts="3 restarts")),
    ("already exhausted", {"limits": LATCHED},
     Decision(Kind.SKIP, why=LATCHED.blocked, action=FB, rule="exhausted")),
    ("every rule passes", {}, Decision(Kind.RESTART, action=FB)),
    # The order is the safety argument: an earlier rule wins over a later one.
    ("low confidence before the fleet", {"confidence": 0.5, "fleet": UNASKED},
     Decision(Kind.SKIP, why=WHY_LOW, action=FB)),
    ("fleet before the dry run", {"fleet": "no", "dry_run": True},
     Decision(Kind.SKIP, why=f"not acting on {SIG}: no", action=FB)),
    ("dry run before the limits", {"dry_run": True, "limits": CAPPED},
     Decision(Kind.DRY_RUN, handled=True, action=FB)),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "changes", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(rule: str, changes: dict[str, object], expected: Decision) -> None:
    assert decide(dataclasses.replace(READY, **changes)) == expected  # type: ignore[arg-type]


class _Restarter:
    name, env_file = "none", None

    def restart(self, plan: Plan, target_pid: int | None) -> str:
        return "done"


def _attempt() -> Attempt:
    return Attempt(plan=RESTART, job=RestartJob(_Restarter(), RESTART, None))


def test_the_machine_goes_watching_restarting_verifying_watching() -> None:
    m = Machine()
    assert m.phase is Phase.WATCHING
    with pytest.raises(TransitionError):
        m.attempt  # noqa: B018 - nothing in flight while watching
    attempt = _attempt()
    m.begin(attempt)
    assert (m.phase, m.attempt) == (Phase.RESTARTING, attempt)
    verifier = Verifier(1.0, 60.0, spin_dram=0.05)
    m.verify(verifier)
    assert m.phase is Phase.VERIFYING and m.attempt.verifier is verifier
    assert m.end() is attempt and m.phase is Phase.WATCHING


def test_a_failed_restart_goes_straight_back_to_watching() -> None:
    m = Machine()
    m.begin(_attempt())
    m.end()
    assert m.phase is Phase.WATCHING


@pytest.mark.parametrize("phase", list(Phase))
def test_moves_outside_the_table_are_refused(phase: Phase) -> None:
    m = Machine()
    if phase is not Phase.WATCHING:
        m.begin(_attempt())
    if phase is Phase.VERIFYING:
        m.verify(Verifier(1.0, 60.0, spin_dram=0.05))
    assert m.phase is phase
    moves = {
        Phase.RESTARTING: lambda: m.begin(_attempt()),
        Phase.VERIFYING: lambda: m.verify(Verifier(1.0, 60.0, spin_dram=0.05)),
        Phase.WATCHING: m.end,
    }
    for to, move in moves.items():
        if to in ALLOWED[phase]:
            continue
        with pytest.raises(TransitionError):
            move()
        assert m.phase is phase  # a refused move changes nothing
