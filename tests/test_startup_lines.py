"""Startup read as startup: compile and profiling milestones between an engine's own wait
warnings, and a launcher's periodic "waiting for shard" line while a shard loads, are startup
(live and `replay` alike); the same lines past the loading deadline, or after the server was
ready, are a stall.

The logs are written here from the upstream format strings (tests/data/startup/README.md);
each test feeds the same lines to `replay` (core/judge/generic.py through the real CLI) and to the
live path (Window and classify(), one tick per line at the line's own time).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.obsbuilder import Timeline, events, procs, verdicts
from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.context import Thresholds
from watchdog.core.judge.generic import timestamp_s
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import Verdict

DATA = Path(__file__).parent / "data" / "startup"
COLD = DATA / "vllm_cold_compile_with_shm_wait.log"
TGI = DATA / "tgi_shard_loading_heartbeat.log"
STALLS = frozenset({"stalled", "hung", "dead"})


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def replay_class(text: str, sigs: SignatureSet) -> str | None:
    """What `replay` names: "signature", a generic class id, or None (nothing wrong)."""
    data = text.encode()
    _, evs = read_log(data, sigs, PATTERNS)
    if name_signatures(evs, sigs):
        return "signature"
    cv = log_classes(evs, data, sigs)
    return cv.primary.cls.id if cv is not None else None


def replay_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def live(lines: list[str], sigs: SignatureSet, th: Thresholds | None = None) -> list[Verdict]:
    """The live verdicts over `lines`: a tick every 5 s of the log's own time, each line in the
    tick of its timestamp (the server process alive, no /metrics: a cold start)."""
    stamps = [timestamp_s(line) for line in lines]
    t0 = next(t for t in stamps if t is not None)
    tl = Timeline(t0=1000.0, step=5.0, procs=procs())
    pending = list(zip(stamps, lines, strict=True))
    end = max(t for t in stamps if t is not None) - t0
    while tl.now - 1000.0 <= end + 5.0:
        due = [ln for ts, ln in pending if ts is None or ts - t0 <= tl.now - 1000.0]
        pending = [(ts, ln) for ts, ln in pending if ts is not None and ts - t0 > tl.now - 1000.0]
        tl.tick(logs=events(due, sigs))
    return [v for _, v in verdicts(tl.obs, sigs, th)]


def tgi_lines(beats: int, ready_first: bool = False) -> list[str]:
    """TGI's launcher (launcher/src/main.rs shard_manager: `Waiting for shard to be ready...`
    every 10 s until the shard's socket exists), `beats` times from 11:00:15."""
    t0 = datetime(2026, 6, 2, 11, 0, 0)

    def ts(s: int) -> str:
        return (t0 + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    lines = TGI.read_text().splitlines()[:4]
    if ready_first:
        lines += [
            f"{ts(8)}  INFO shard-manager: text_generation_launcher: Shard ready in 3.1s rank=0",
            f"{ts(9)}  INFO text_generation_router: router/src/main.rs:355: Connected",
        ]
    wait = "INFO shard-manager: text_generation_launcher: Waiting for shard to be ready... rank=0"
    return lines + [f"{ts(5 + 10 * i)}  {wait}" for i in range(1, beats + 1)]


# --- (a) a cold start: compile and profiling milestones between two shm wait warnings -------


def test_replay_of_a_cold_compile_between_wait_warnings_is_no_stall(sigs: SignatureSet) -> None:
    assert replay_class(COLD.read_text(), sigs) is None
    done = replay_cli(COLD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no hang signature found")


def test_live_cold_compile_between_wait_warnings_is_compiling(sigs: SignatureSet) -> None:
    states = [v.state for v in live(COLD.read_text().splitlines(), sigs)]
    assert not STALLS & set(states), states
    assert states[-1] in ("compiling", "loading"), states


def test_wait_warnings_with_no_milestone_between_them_still_stall(sigs: SignatureSet) -> None:
    lines = COLD.read_text().splitlines()
    # Cut after the first wait warning, then the second: no startup milestone in between.
    first = next(i for i, ln in enumerate(lines) if "shared memory broadcast" in ln)
    second = next(ln for ln in lines[first + 1 :] if "shared memory broadcast" in ln)
    assert replay_class("\n".join([*lines[: first + 1], second]) + "\n", sigs) == "stalled"


def test_the_milestones_are_read_as_startup_phases() -> None:
    from watchdog.core.state.events import Milestone, Phase, WaitLine, typed

    kinds = {}
    for ev in events(COLD.read_text().splitlines()):
        t = typed(ev)
        if isinstance(t, Milestone):
            kinds[t.name] = t.phase
        if isinstance(t, WaitLine):
            kinds["wait"] = Phase.STARTING
    assert kinds["aot_saved"] == Phase.COMPILING
    assert kinds["profiling_done"] == Phase.COMPILING
    assert kinds["warmup_done"] == Phase.COMPILING
    assert kinds["compile_done"] == Phase.COMPILING
    assert "wait" in kinds


# --- (b) a launcher's heartbeat while a shard loads ---------------------------------------


def test_replay_of_a_launcher_heartbeat_while_loading_is_no_livelock(sigs: SignatureSet) -> None:
    assert replay_class(TGI.read_text(), sigs) is None
    done = replay_cli(TGI)
    assert done.returncode == 0, done.stdout + done.stderr


def test_live_launcher_heartbeat_while_loading_is_loading(sigs: SignatureSet) -> None:
    states = [v.state for v in live(TGI.read_text().splitlines(), sigs)]
    assert not STALLS & set(states), states
    assert states[-1] == "loading", states


def test_the_heartbeat_past_the_loading_deadline_is_a_stall(sigs: SignatureSet) -> None:
    th = Thresholds()
    beats = int(th.load_deadline_s // 10) + 3
    assert replay_class("\n".join(tgi_lines(beats)) + "\n", sigs) == "livelock"
    short = Thresholds(load_deadline_s=60.0, blind_stall_after_s=20.0)
    states = [v.state for v in live(tgi_lines(12), sigs, short)]
    assert states[-1] == "stalled", states
    assert "loading" in states, states


def test_the_heartbeat_after_the_server_was_ready_is_a_stall(sigs: SignatureSet) -> None:
    assert replay_class("\n".join(tgi_lines(12, ready_first=True)) + "\n", sigs) == "livelock"


def test_the_loading_deadline_travels_with_the_bundle() -> None:
    """The bundle records every Thresholds field (daemon/wiring.py asdict) and `replay` of its
    timeline reads them back: the loading deadline the daemon used is the one replayed."""
    import dataclasses

    from watchdog.commands.replay import _thresholds

    recorded = dataclasses.asdict(Thresholds(load_deadline_s=60.0))
    assert recorded["load_deadline_s"] == 60.0
    assert _thresholds(recorded).load_deadline_s == 60.0


def test_every_threshold_replays_with_its_type() -> None:
    """A count recorded in a bundle (health_confirm) comes back an int, a bound a float."""
    from watchdog.commands.replay import _thresholds

    th = _thresholds({"health_confirm": 5, "socket_hold_s": 12, "stall_after_s": "x"})
    assert (th.health_confirm, th.socket_hold_s) == (5, 12.0)
    assert isinstance(th.health_confirm, int) and th.stall_after_s == Thresholds().stall_after_s
