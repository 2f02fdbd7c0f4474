"""End to end: a vLLM simulator serves a load, drains it and sits idle. The last stats line
before the drain still says `Running: 4 reqs` until the next one is due (VLLM_LOG_STATS_INTERVAL
raised to quiet the log); /metrics already says 0 with its counters at rest. No alarm.
The longer intervals (60 s, 150 s) are covered with a fake clock in tests/test_witnesses.py.

Run under the shared lock: `flock /tmp/e2e.lock python3 -m pytest -q tests/test_e2e_drain.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, run_watchdog, state_events, watch_sources

sim_factory = simfixtures.sim_factory  # fixtures, used by name

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("interval", "load_s", "watch_s"), [(10, 25, 40), (30, 35, 58)])
def test_a_drained_server_whose_last_stats_line_shows_running_is_no_alarm(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], interval: int, load_s: int, watch_s: int
) -> None:
    # The load drains between two stats lines (at 25 s between 20 and 30; at 35 s between 30
    # and 60): the line before the drain says `Running: 4 reqs` until the next one.
    sim = sim_factory(
        "healthy", mode="serve",
        extra_args=["--stats-interval", str(interval), "--load-s", str(load_s)],
    )  # fmt: skip
    done = run_watchdog(
        "diagnose", *watch_sources(sim), "--no-cdn-default", "--json", "--log-format", "json",
        "--duration", str(watch_s), cwd=tmp_path, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    assert "Running: 4 reqs" in sim.log_text()  # the claim that outlived the load
    states = [e.get("new") for e in state_events(done.stderr)]
    assert "serving" in states and states[-1] == "idle", states
    assert not {"stalled", "hung", "dead"} & set(states), states


def test_a_server_silent_for_40_s_that_serves_again_recovered_on_its_own(tmp_path: Path) -> None:
    """Supervise mode with --remediate: the engine goes silent for 40 s with requests running
    (the GPU idle, no cause to prove), then serves again. `stalled`, then the episode ends as
    `recovered_on_its_own`: counted, never restarted."""
    from tests.fakes import Watchdog

    wd = Watchdog(
        tmp_path, "healthy", {"vllm": "0.14.0"}, "--remediate",
        sim_args=("--silence-s", "40"),
    )  # fmt: skip
    try:
        wd.wait_for(r"state: \S+ -> stalled", timeout=60)
        wd.wait_for(r"episode ended: recovered_on_its_own", timeout=90)
        assert len(wd.starts()) == 1, wd.starts()  # never restarted
        assert not re.search(r"state: \S+ -> (hung|dead)", wd.text()), wd.text()[-3000:]
        assert "hang-watchdog remediation: " not in wd.text()
        metrics = wd.metrics()
        key = ("hang_watchdog_episodes_total", (("outcome", "recovered_on_its_own"),))
        assert metrics[key] == 1.0, {k: v for k, v in metrics.items() if "episodes" in k[0]}
    finally:
        wd.stop()
