"""The idle canary: a server wedged while idle answers /health but not a 1-token completion."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import simfixtures
from tests.obsbuilder import Timeline, gpu, window_of
from tests.simfixtures import SimHandle
from watchdog.config import build_config
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import CanaryResult, LogEvent, Observation, ServerSample, to_dict
from watchdog.core.state.timeline import read_timeline, write_timeline
from watchdog.daemon.wiring import build

sim_factory = simfixtures.sim_factory
SIGS = load_signatures()
IDLE_API = ServerSample(up=True, health_status=200, iterations=10.0, running=0.0, waiting=0.0)


def _canary(timed_out: bool) -> CanaryResult:
    return CanaryResult(timed_out=timed_out, waited_s=30.0, result="timeout" if timed_out else "ok")


def _old_canary_event(timed_out: bool) -> LogEvent:
    """The canary's answer as releases before Observation.canary recorded it: a log event."""
    fields = {"timed_out": timed_out, "waited_s": 30.0}
    result = "timeout" if timed_out else "ok"
    return LogEvent(kind="canary", line=f"canary completion: {result}", source="canary",
                    fields=fields)  # fmt: skip


def test_an_unanswered_canary_is_work_pending_since_it_was_sent() -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), server=IDLE_API)
    tl.ticks(40)  # idle for a while, then the canary goes unanswered
    tl.tick(canary=_canary(True))
    w = window_of(tl.obs)
    assert w.progress.pending and "canary" in w.progress.pending_why
    verdict = classify(w, SIGS, Thresholds())
    assert verdict.state == "stalled", verdict  # sent 30 s ago: past stall_after_s at once
    assert verdict.seconds_since_progress is not None and verdict.seconds_since_progress >= 15


def test_an_answered_canary_is_progress_and_clears_the_stall() -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), server=IDLE_API)
    tl.ticks(40)
    tl.tick(canary=_canary(True))
    tl.tick(canary=_canary(False))
    w = window_of(tl.obs)
    assert not w.progress.pending
    assert classify(w, SIGS, Thresholds()).state == "idle"


def test_an_old_observation_reads_the_canary_log_event_into_its_field() -> None:
    obs = Observation(t=1.0, wall=1.0, logs=(_old_canary_event(True),))
    assert obs.canary == _canary(True)
    assert Observation(t=1.0, wall=1.0).canary is None


def _as_old_release_wrote_it(obs: Observation) -> dict[str, Any]:
    """One timeline line as releases before the canary's own field wrote it."""
    row = to_dict(obs)
    answer = row.pop("canary")
    if answer is not None:
        row["logs"].append(to_dict(_old_canary_event(answer["timed_out"])))
    return row


def _replay(path: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=simfixtures.sim_env(),
    )
    return done.returncode, json.loads(done.stdout)["verdict"]


def test_an_old_timeline_with_the_canary_as_a_log_event_replays_to_the_same_verdict(
    tmp_path: Path,
) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), server=IDLE_API)
    tl.ticks(40)
    tl.tick(canary=_canary(True))  # the idle canary went unanswered: a stall
    tl.ticks(3)
    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    write_timeline(new, tl.obs)
    old.write_text("".join(json.dumps(_as_old_release_wrote_it(o)) + "\n" for o in tl.obs))
    assert '"kind": "canary"' in old.read_text() and '"canary":' not in old.read_text()
    assert [o.canary for o in read_timeline(old)] == [o.canary for o in tl.obs]
    new_rc, new_verdict = _replay(new)
    old_rc, old_verdict = _replay(old)
    assert new_verdict["state"] == "stalled" and new_rc == 1, new_verdict
    assert (old_rc, old_verdict) == (new_rc, new_verdict)


def test_idle_wedged_server_is_caught_by_the_canary(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    """No load, /health 200, /metrics idle: only the canary can tell it is wedged."""
    sim = sim_factory("kernel_deadlock", mode="serve", extra_args=["--load", "0", "--cc", "10.0"])
    cfg = build_config(
        {
            "pid": sim.pid,
            "server_url": f"http://127.0.0.1:{sim.port}",
            "gpu_source": f"file:{sim.gpu_file}",
            "cdn_default": False,
            "metrics_addr": "off",
            "stacks": False,
            "canary": True,
            "canary_idle_s": 2.0,
            "canary_timeout_s": 3.0,
            "stall_after_s": 6.0,
            "suspect_after_s": 3.0,
            "gpu_spin_for_s": 4.0,
        }
    )
    built = build(cfg)
    states: list[str] = []
    try:
        deadline = time.monotonic() + 90
        verdict = None
        while time.monotonic() < deadline:
            verdict = built.daemon.tick()
            states.append(verdict.state)
            if verdict.is_hang:
                break
            time.sleep(0.5)
    finally:
        built.close()
    assert "idle" in states, states  # it looked idle before the canary
    assert verdict is not None and verdict.is_hang, states[-10:]
    assert verdict.signature == "gpu_kernel_spin", verdict
