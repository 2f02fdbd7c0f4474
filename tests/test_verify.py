"""The recovery verifier: what counts as recovered after a restart, tick by tick."""

from __future__ import annotations

from types import SimpleNamespace

from watchdog.core.model import Observation, Verdict
from watchdog.remediation.verify import Verifier

READY = SimpleNamespace(phase="ready", last_progress_t=None, last_progress_what="")


def tick(v: Verifier, t: float, state: str, progress: object = READY) -> str | None:
    outcome = v.step(Observation(t=t, wall=t), Verdict(state=state), progress)
    return None if outcome is None else f"{outcome.outcome}: {outcome.reason}"


def test_one_idle_tick_between_ready_and_the_clients_is_not_recovery() -> None:
    """A restarted server idles for a tick before its clients' requests arrive; recovery is
    said only when it serves, or once idle has held."""
    v = Verifier(0.0, 120.0, spin_dram=0.05)
    assert tick(v, 1.0, "loading") is None
    assert tick(v, 2.0, "idle") is None
    assert tick(v, 2.1, "serving") is None  # the clients' load arrives
    assert tick(v, 3.0, "idle") is None  # the hold starts again
    assert tick(v, 7.5, "idle") is None
    assert tick(v, 8.0, "idle") == "recovered: ready and idle (no work pending for 5 s)"


def test_progress_while_serving_is_recovery() -> None:
    v = Verifier(0.0, 120.0, spin_dram=0.05)
    for i, t in enumerate((1.0, 2.0)):
        moved = SimpleNamespace(phase="ready", last_progress_t=t, last_progress_what=f"step {i}")
        result = tick(v, t, "serving", moved)
    assert result == "recovered: serving: progress advanced 2 times"


def test_idle_that_never_holds_ends_in_not_recovered() -> None:
    v = Verifier(0.0, 10.0, spin_dram=0.05)
    result = None
    for t in range(1, 13):
        result = tick(v, float(t), "idle" if t % 2 else "serving")
    assert result == "not_recovered: no progress within 10 s of the restart"
