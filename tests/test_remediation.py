"""Remediation units with real files, subprocesses and a stand-in systemctl: plan, state,
restarters, and the hook's safety rules (low confidence, dry run, once per episode)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fakes import (
    SIGS,
    FakeDaemon,
    episodes,
    hang,
    make_hook,
    metric,
    obs,
    settled,
    wait_for,
)
from watchdog.commands import fallback as fallback_cli
from watchdog.config import build_config
from watchdog.daemon.episodes import Episode
from watchdog.outputs.export import MetricsSink
from watchdog.remediation.hook import RemediationHook
from watchdog.remediation.limits import Gate, gate
from watchdog.remediation.machine import Phase
from watchdog.remediation.plan import PlanError, make_plan, parse_version
from watchdog.remediation.restarters import (
    KubernetesRestarter,
    SystemdRestarter,
    terminate,
    write_env_file,
)
from watchdog.remediation.settings import RemediationConfig
from watchdog.remediation.state import RemediationState, StateError, StateStore

# -- plan ---------------------------------------------------------------------------------


def test_new_vllm_gets_the_flag_and_old_vllm_the_environment_variable() -> None:
    new = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
    old = make_plan(hang(), SIGS, {"vllm": "0.10.2"}, {})
    assert new is not None and old is not None
    assert new.args == ("--attention-config.use_trtllm_attention=0",) and dict(new.env) == {}
    assert old.args == () and dict(old.env) == {"VLLM_USE_TRTLLM_ATTENTION": "0"}
    assert "environment variable" in old.how and "flag" in new.how


def test_an_unknown_vllm_version_gets_no_guessed_spelling(tmp_path: Path) -> None:
    """Old vLLM refuses the flag and new vLLM ignores the variable: no restart on a guess."""
    with pytest.raises(PlanError, match=r"cannot be applied safely: the vLLM version is unknown"):
        make_plan(hang(), SIGS, {"vllm": None}, {})
    hook, restarter, _ = make_hook(tmp_path)
    daemon = FakeDaemon({})
    hook.episodes.episode.incident = tmp_path / "bundle"
    hook.episodes.episode.incident_signature = "trtllm_attention_deadlock"
    hook.on_tick(daemon.tick(obs(1.0), hang()))
    time.sleep(0.2)
    assert restarter.calls == []
    assert "no plan: fallback disable_trtllm_attention cannot be applied" in daemon.out.getvalue()


def test_nvls_plan_sets_both_variables_and_keeps_the_active_fallback() -> None:
    active = {
        "fallbacks": ["disable_trtllm_attention"],
        "args": ["--attention-config.use_trtllm_attention=0"],
    }
    plan = make_plan(hang("nvls_multicast_failure"), SIGS, {}, {}, active)
    assert plan is not None
    assert dict(plan.env) == {"NCCL_NVLS_ENABLE": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    assert plan.args == ("--attention-config.use_trtllm_attention=0",)
    assert plan.active == ("disable_trtllm_attention", "disable_nvls")


def test_advise_only_and_override_and_unknown_fallback() -> None:
    plan = make_plan(hang("jit_toolchain_missing"), SIGS, {}, {})
    assert plan is not None and not plan.restart
    over = make_plan(
        hang("gpu_kernel_spin"),
        SIGS,
        {"vllm": "0.14.0"},
        {"gpu_kernel_spin": "disable_trtllm_attention"},
    )
    assert over is not None and over.fallback == "disable_trtllm_attention"
    with pytest.raises(PlanError, match="no_such"):
        make_plan(hang("gpu_kernel_spin"), SIGS, {}, {"gpu_kernel_spin": "no_such"})


def test_parse_version() -> None:
    assert parse_version("0.11.1rc2.dev3+cu128") == (0, 11, 1)
    assert parse_version("v0.9") == (0, 9)
    assert parse_version("garbage") is None and parse_version(None) is None


# -- state --------------------------------------------------------------------------------


def test_state_round_trips_and_a_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "st")
    state = store.load()
    state.restarts.append(123.0)
    state.active = {"fallbacks": ["disable_nvls"], "args": [], "env": {"NCCL_NVLS_ENABLE": "0"}}
    store.save(state)
    again = StateStore(tmp_path / "st").load()
    assert again.restarts == [123.0] and again.active == state.active
    assert not [p for p in store.dir.iterdir() if p.name.startswith(".")]  # no temp file left
    store.path.write_text("{not json")
    with pytest.raises(StateError, match="fallback clear"):
        store.load()
    store.path.write_text('{"restarts": ["yesterday"]}')
    with pytest.raises(StateError, match="wrong type.*fallback clear"):
        store.load()


def test_fallback_cli_show_and_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = StateStore(tmp_path)
    state = store.load()
    state.exhausted, state.exhausted_reason = True, "3 restarts"
    state.active = {"fallbacks": ["disable_nvls"], "args": [], "env": {"NCCL_NVLS_ENABLE": "0"}}
    store.save(state)
    env_file = tmp_path / "fallback.env"
    parser = __import__("argparse").ArgumentParser()
    fallback_cli.add_arguments(parser)
    assert fallback_cli.run(parser.parse_args(["show", "--state-dir", str(tmp_path)])) == 0
    out = capsys.readouterr().out
    assert "disable_nvls" in out and "EXHAUSTED" in out
    args = parser.parse_args(
        ["clear", "--state-dir", str(tmp_path), "--fallback-file", str(env_file)]
    )
    assert fallback_cli.run(args) == 0
    cleared = store.load()
    assert not cleared.exhausted and cleared.active is None and cleared.restarts == []
    assert 'HANG_WATCHDOG_FALLBACK_ARGS=""' in env_file.read_text()


def test_fallback_clear_empties_the_recorded_file_without_being_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "fallback.env"
    plan = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
    write_env_file(env_file, plan)
    store = StateStore(tmp_path / "st")
    store.save(RemediationState(restarts=[1.0], active={"fallbacks": ["disable_trtllm_attention"]},
                                fallback_file=str(env_file)))  # fmt: skip
    parser = __import__("argparse").ArgumentParser()
    fallback_cli.add_arguments(parser)
    clear = ["clear", "--state-dir", str(store.dir)]
    assert fallback_cli.run(parser.parse_args(clear)) == 0
    out = capsys.readouterr().out
    assert f"emptied {env_file}" in out and "without the fallback from its next restart" in out
    assert 'HANG_WATCHDOG_FALLBACK_ARGS=""' in env_file.read_text()
    assert store.load().fallback_file == str(env_file)  # kept for the next clear
    # nothing recorded (an older state file): say plainly that the file still holds it
    store.save(RemediationState(active={"fallbacks": ["disable_nvls"]}))
    assert fallback_cli.run(parser.parse_args(clear)) == 0
    out = capsys.readouterr().out
    assert "still holds it" in out and "--fallback-file PATH" in out
    assert "the server runs without the fallback" not in out


# -- restarters ---------------------------------------------------------------------------


def stand_in_systemctl(tmp_path: Path) -> tuple[Path, Path]:
    bindir, log = tmp_path / "bin", tmp_path / "systemctl.argv"
    bindir.mkdir()
    script = bindir / "systemctl"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
    )
    script.chmod(0o755)
    return bindir, log


def test_systemd_hook_writes_the_environment_file_and_restarts_once_per_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir, log = stand_in_systemctl(tmp_path)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    env_file = tmp_path / "etc" / "vllm-fallback.env"
    cfg = build_config({"remediate": True, "restarter": "systemd", "systemd_unit": "vllm.service",
                        "fallback_file": str(env_file), "cooldown_s": 0.0, "stacks": False,
                        "state_dir": str(tmp_path / "st"), "recover_within_s": 1.0})  # fmt: skip
    sink = MetricsSink(SIGS.ids, version="test")
    eps = episodes(1.0)
    hook = RemediationHook(RemediationConfig.of(cfg), SIGS,
                           restarter=SystemdRestarter("vllm.service", str(env_file)),
                           store=StateStore(cfg.state_dir), metrics=sink, episodes=eps)  # fmt: skip
    daemon = FakeDaemon({"vllm": "0.14.0"})
    t = 10.0
    for _ in range(2):  # two hang ticks in the same episode
        hook.on_tick(daemon.tick(obs(t), hang()))
        t += 1
    wait_for(lambda: settled(hook))
    hook.on_tick(daemon.tick(obs(t), hang()))
    assert log.read_text().splitlines() == ["restart vllm.service"]
    text = env_file.read_text()
    assert 'HANG_WATCHDOG_FALLBACK_ARGS="--attention-config.use_trtllm_attention=0"' in text
    assert "VLLM_WATCHDOG_FALLBACK=disable_trtllm_attention" in text
    assert metric(sink, "hang_watchdog_fallback_active", fallback="disable_trtllm_attention") == 1
    assert StateStore(cfg.state_dir).load().fallback_file == str(env_file)  # for `fallback clear`
    eps.episode = Episode(started_t=50.0, started_wall=0.0)  # a new episode after recovery
    for _ in range(3):  # the verifier times out (recover_within_s=1) on a new hang
        t += 1
        hook.on_tick(daemon.tick(obs(t), hang()))
    wait_for(lambda: settled(hook))
    assert log.read_text().splitlines() == ["restart vllm.service"] * 2
    assert (
        metric(
            sink,
            "hang_watchdog_remediations_total",
            action="disable_trtllm_attention",
            outcome="not_recovered",
        )
        == 1
    )


SIGTERM_RECORDER = """
import signal, sys, time
def on_term(*_):
    open(sys.argv[1], "w").write("TERM")
    if sys.argv[2] == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + ".ready", "w").write("")
time.sleep(120)
"""


@pytest.mark.parametrize("behaviour", ["exit", "ignore"])
def test_kubernetes_restarter_writes_the_shared_file_then_terminates(
    tmp_path: Path, behaviour: str
) -> None:
    mark = tmp_path / "term"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_RECORDER, str(mark), behaviour])
    try:
        wait_for(lambda: Path(str(mark) + ".ready").exists())
        plan = make_plan(hang("nvls_multicast_failure"), SIGS, {}, {})
        assert plan is not None
        shared = tmp_path / "shared" / "fallback.env"
        result = KubernetesRestarter(str(shared), grace_s=1.0).restart(plan, proc.pid)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert mark.read_text() == "TERM"  # SIGTERM came first in both cases
    assert (
        "NCCL_NVLS_ENABLE=0" in shared.read_text()
        and "VLLM_ALLREDUCE_USE_SYMM_MEM=0" in shared.read_text()
    )
    if behaviour == "exit":
        assert code == 0 and "exited on SIGTERM" in result
    else:
        assert code == -9 and "killed" in result


def test_terminate_a_gone_pid_and_unsafe_values_are_refused(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert terminate(proc.pid, 0.1) == "was already gone"
    write_env_file(tmp_path / "f.env", None)
    assert "VLLM_WATCHDOG_FALLBACK=\n" in (tmp_path / "f.env").read_text()


# -- hook safety --------------------------------------------------------------------------


def test_low_confidence_does_not_act(tmp_path: Path) -> None:
    hook, restarter, sink = make_hook(tmp_path, remediate_min_confidence=0.9)
    daemon = FakeDaemon({"vllm": "0.14.0"})
    for t in range(3):
        hook.on_tick(daemon.tick(obs(float(t)), hang(confidence=0.7)))
    time.sleep(0.2)
    assert restarter.calls == [] and hook.machine.phase is Phase.WATCHING
    assert "confidence 0.70 < remediate_min_confidence 0.90" in daemon.out.getvalue()
    assert (
        metric(
            sink,
            "hang_watchdog_remediations_total",
            action="disable_trtllm_attention",
            outcome="skipped",
        )
        == 1
    )
    hook.on_tick(
        daemon.tick(obs(4.0), hang(confidence=0.95))
    )  # confidence rose in the same episode
    wait_for(lambda: len(restarter.calls) == 1)


def test_dry_run_exports_the_plan_and_acts_on_nothing(tmp_path: Path) -> None:
    hook, restarter, sink = make_hook(tmp_path, dry_run=True, remediate=False)
    daemon = FakeDaemon({"vllm": "0.10.2"})
    for t in range(3):
        hook.on_tick(daemon.tick(obs(float(t), pid=os.getpid()), hang()))
    time.sleep(0.2)
    assert restarter.calls == []
    assert (
        "dry run: would trtllm_attention_deadlock: restart with fallback "
        "disable_trtllm_attention: VLLM_USE_TRTLLM_ATTENTION=0" in daemon.out.getvalue()
    )
    assert (
        metric(
            sink,
            "hang_watchdog_remediations_total",
            action="disable_trtllm_attention",
            outcome="planned",
        )
        == 1
    )
    assert (
        metric(
            sink,
            "hang_watchdog_remediation_plan_info",
            signature="trtllm_attention_deadlock",
            fallback="disable_trtllm_attention",
            mode="dry_run",
            args="",
            env="VLLM_USE_TRTLLM_ATTENTION=0",
        )
        == 1
    )
    assert StateStore(tmp_path / "st").load().restarts == []


def test_waits_for_the_incident_bundle_before_acting(tmp_path: Path) -> None:
    hook, restarter, _ = make_hook(tmp_path)
    hook.episodes.writer = SimpleNamespace(update_remediation=lambda path, rec: None)
    daemon = FakeDaemon({"vllm": "0.14.0"})
    hook.on_tick(daemon.tick(obs(1.0), hang()))
    time.sleep(0.2)
    assert restarter.calls == []
    hook.episodes.episode.incident = tmp_path / "bundle"
    hook.episodes.episode.incident_signature = "trtllm_attention_deadlock"
    hook.on_tick(daemon.tick(obs(2.0), hang()))
    wait_for(lambda: len(restarter.calls) == 1)


def test_gate_cooldown_then_cap_latches_and_exhausted_blocks() -> None:
    limits = {"cooldown_s": 300.0, "window_s": 3600.0, "max_restarts": 2}
    state = RemediationState(restarts=[1000.0])
    assert gate(state, 1100.0, **limits).blocked.startswith("cooldown: last restart 100 s ago")
    assert gate(state, 1400.0, **limits) == Gate()  # cooled down, under the cap
    state.restarts.append(1400.0)
    capped = gate(state, 1800.0, **limits)
    assert capped.exhausts == "2 restarts within 3600 s (max_restarts 2)"
    assert capped.blocked == f"remediation exhausted: {capped.exhausts}"
    assert gate(state, 1000.0 + 3600.0 + 1, **limits) == Gate()  # the first fell out of the window
    state.exhausted, state.exhausted_reason = True, capped.exhausts
    latched = gate(state, 99999.0, **limits)
    assert "fallback clear" in latched.blocked and not latched.exhausts
