"""Remediation safety gaps: a cooldown only delays, a restart the state cannot record does not
happen, the evidence directory defaults under state_dir, and a restarter's bug ends as failed."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import (
    SIGS,
    FakeDaemon,
    RecordingRestarter,
    episodes,
    hang,
    make_hook,
    metric,
    obs,
    remedy_config,
    settled,
    wait_for,
)
from watchdog.config import ConfigError, build_config
from watchdog.daemon.episodes import EpisodeHook
from watchdog.outputs.emit import Emitter
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.sdnotify import child_environ
from watchdog.remediation.factory import make_remediation_hook
from watchdog.remediation.hook import RemediationHook
from watchdog.remediation.machine import Phase
from watchdog.remediation.plan import make_plan
from watchdog.remediation.restarters import RestartJob
from watchdog.remediation.settings import RemediationConfig
from watchdog.remediation.state import RemediationState, StateStore

ACTION = "disable_trtllm_attention"


def test_a_hang_within_the_cooldown_restarts_once_the_cooldown_ends(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    cfg = build_config({"remediate": True, "state_dir": str(tmp_path / "st"), "cooldown_s": 300.0})
    store = StateStore(cfg.state_dir)
    store.save(RemediationState(restarts=[clock[0] - 10]))  # one restart 10 s ago
    restarter, sink = RecordingRestarter(), MetricsSink(SIGS.ids, version="test")
    hook = RemediationHook(RemediationConfig.of(cfg), SIGS, restarter=restarter, store=store,
                           metrics=sink,
                           episodes=episodes(1.0), wall=lambda: clock[0])  # fmt: skip
    daemon = FakeDaemon({"vllm": "0.14.0"})
    for t in range(5):  # the server is still hung; the cooldown counts down
        hook.on_tick(daemon.tick(obs(float(t)), hang()))
        clock[0] += 20
    assert restarter.calls == []
    out = daemon.out.getvalue()
    assert out.count("cooldown: last restart") == 1 and "10 s ago" in out  # reported once
    assert metric(sink, "hang_watchdog_remediations_total", action=ACTION, outcome="skipped") == 1
    clock[0] += 300  # past the cooldown, same episode, still hung
    hook.on_tick(daemon.tick(obs(6.0), hang()))
    wait_for(lambda: len(restarter.calls) == 1)
    assert len(store.load().restarts) == 2


def test_no_restart_when_the_state_cannot_be_saved(tmp_path: Path) -> None:
    hook, restarter, sink = make_hook(tmp_path)
    state_dir = tmp_path / "st"
    state_dir.write_text("")  # a regular file where the state directory should be
    daemon = FakeDaemon({"vllm": "0.14.0"})
    for t in range(3):
        hook.on_tick(daemon.tick(obs(float(t)), hang()))
    assert restarter.calls == [] and hook.machine.phase is Phase.WATCHING
    out = daemon.out.getvalue()
    assert out.count("not restarting: cannot save the remediation state to") == 1
    assert str(state_dir / "remediation.json") in out and f"make {state_dir} writable" in out
    assert metric(sink, "hang_watchdog_remediations_total", action=ACTION, outcome="failed") == 1
    assert hook.state.restarts == [] and hook.state.active is None  # nothing half-recorded
    state_dir.unlink()  # the operator fixes it; the same episode is reconsidered
    hook.on_tick(daemon.tick(obs(4.0), hang()))
    wait_for(lambda: len(restarter.calls) == 1)
    assert len(StateStore(state_dir).load().restarts) == 1


def collaborators() -> dict[str, Any]:
    """What the wiring passes the factory, for a daemon that supervises nothing."""
    return {"episodes": EpisodeHook(), "event": Emitter("text").event, "supervisor": None,
            "child_env": child_environ}  # fmt: skip


@pytest.mark.parametrize("where", ["file_as_parent", "proc"])
def test_an_unwritable_state_dir_is_a_config_error_at_startup(tmp_path: Path, where: str) -> None:
    if where == "file_as_parent":
        (tmp_path / "file").write_text("")
        state_dir = str(tmp_path / "file" / "st")
    else:
        state_dir = "/proc/self"  # readable (no state file yet) but nothing can be created there
    values = {"restarter": "command", "restart_command": ["true"], "state_dir": state_dir}
    with pytest.raises(ConfigError, match="key 'state_dir'") as err:
        make_remediation_hook(remedy_config({"remediate": True, **values}), SIGS, **collaborators())
    assert state_dir in str(err.value)
    if where == "proc":
        assert "write" in str(err.value)
        # a dry run records nothing in the state, so it does not need it writable
        hook = make_remediation_hook(remedy_config({"dry_run": True, **values}), SIGS,
                                     **collaborators())  # fmt: skip
        assert hook is not None


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def build_for(tmp_path: Path, **values: Any) -> Any:
    from watchdog.daemon.wiring import build

    base = {"pid": os.getpid(), "gpu_source": "none", "metrics_addr": "off", "stacks": False,
            "cdn_default": False, "state_dir": str(tmp_path / "st"), "restarter": "command",
            "restart_command": ["true"]}  # fmt: skip
    return build(build_config({**base, **values}))


def test_remediation_defaults_the_incident_dir_under_state_dir(tmp_path: Path) -> None:
    handler = ListHandler()
    logger = logging.getLogger("hang_watchdog.remediation")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        built = build_for(tmp_path, remediate=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    try:
        assert built.episodes.writer.root == tmp_path / "st" / "incidents"
    finally:
        built.close()
    assert any(str(tmp_path / "st" / "incidents") in m for m in handler.messages)
    own = build_for(tmp_path, remediate=True, incident_dir=str(tmp_path / "own"))
    shadow = build_for(tmp_path, dry_run=True)
    try:
        assert own.episodes.writer.root == tmp_path / "own"
        assert shadow.episodes.writer is None  # a dry run restarts nothing
    finally:
        own.close()
        shadow.close()


class BrokenRestarter:
    """A restarter with a bug: it raises something other than RestartError."""

    name = "broken"
    env_file: str | None = None

    def restart(self, plan: Any, target_pid: int | None) -> str:
        raise KeyError("boom")


def test_a_restarter_bug_ends_as_failed(tmp_path: Path) -> None:
    plan = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
    assert plan is not None
    job = RestartJob(BrokenRestarter(), plan, None)
    job.start()
    job.thread.join(10)
    assert not job.thread.is_alive() and job.result is None and job.error == "KeyError: 'boom'"

    cfg = build_config({"remediate": True, "state_dir": str(tmp_path / "st"), "cooldown_s": 0.0})
    sink = MetricsSink(SIGS.ids, version="test")
    hook = RemediationHook(RemediationConfig.of(cfg), SIGS, restarter=BrokenRestarter(),
                           store=StateStore(cfg.state_dir),
                           metrics=sink, episodes=episodes(1.0))  # fmt: skip
    daemon = FakeDaemon({"vllm": "0.14.0"})
    hook.on_tick(daemon.tick(obs(1.0), hang()))
    wait_for(lambda: hook.machine.phase is Phase.RESTARTING and settled(hook))
    hook.on_tick(daemon.tick(obs(2.0), hang()))
    assert "failed: restart failed: KeyError: 'boom'" in daemon.out.getvalue()
    assert "restarted: None" not in daemon.out.getvalue()
    assert metric(sink, "hang_watchdog_remediations_total", action=ACTION, outcome="failed") == 1


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"no_such_signature": "restart"}, "'no_such_signature' is not a signature id"),
        ({"gpu_kernel_spin": "disable_everything"}, "names no fallback"),
    ],
)
def test_fallback_overrides_are_checked_at_start(tmp_path: Path, overrides, needle) -> None:
    from watchdog.config import Config, ConfigError
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.remediation.factory import check_overrides

    with pytest.raises(ConfigError, match=needle):
        check_overrides(overrides, load_signatures())
    check_overrides({"gpu_kernel_spin": "disable_trtllm_attention"}, load_signatures())
    assert Config().fallback_overrides == {}


# -- clocks: intervals on the monotonic clock, persisted as Unix seconds --------


def test_steady_wall_ignores_a_wall_clock_step() -> None:
    from watchdog.remediation.limits import SteadyWall

    wall, mono = [1_000_000.0], [50.0]
    steady = SteadyWall(lambda: wall[0], lambda: mono[0])
    wall[0] += 7200  # NTP steps the clock two hours forward; only 10 s really pass
    mono[0] += 10
    assert steady() == 1_000_010.0


def test_a_restart_stamped_in_the_future_counts_from_now() -> None:
    from watchdog.remediation.limits import clamp_future, gate
    from watchdog.remediation.state import RemediationState

    state = RemediationState(restarts=[5_000.0])  # recorded before the clock was set back
    clamp_future(state, 1_000.0)
    assert gate(state, 1_000.0 + 601, cooldown_s=600, window_s=3600, max_restarts=3).blocked == ""


def test_a_fallback_clear_while_running_is_picked_up(tmp_path: Path) -> None:
    hook, restarter, sink = make_hook(tmp_path)
    store = StateStore(tmp_path / "st")
    store.save(RemediationState(exhausted=True, exhausted_reason="3 restarts"))
    daemon = FakeDaemon({"vllm": "0.14.0"})
    hook.on_tick(daemon.tick(obs(1.0), hang()))
    assert restarter.calls == [] and "remediation exhausted (3 restarts)" in daemon.out.getvalue()
    assert metric(sink, "hang_watchdog_remediation_exhausted") == 1
    time.sleep(0.05)  # a later modification time than the first write's
    store.save(RemediationState())  # what `hang-watchdog fallback clear` writes
    hook.on_tick(daemon.tick(obs(2.0), hang()))  # the same episode, still hung
    wait_for(lambda: len(restarter.calls) == 1)
    assert metric(sink, "hang_watchdog_remediation_exhausted") == 0
