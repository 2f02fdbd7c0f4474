"""A stall that ends by itself is `recovered_on_its_own`: counted, logged, written into its
bundle, never remediated. The verdicts come from the real classifier over a fake-clock timeline;
the episode hook, the bundle writer, the metrics sink and the emitter are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

from tests.obsbuilder import Timeline, gpu, procs
from tests.tickkit import TickKit
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import ServerSample, Verdict
from watchdog.daemon.episodes import EpisodeHook
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.exposition import render_text
from watchdog.outputs.incident import IncidentWriter


class _Daemon(TickKit):
    """The ticks the hook sees, events written as JSON (no stack capture here)."""

    def __init__(self) -> None:
        super().__init__(fmt="json", wall=lambda: 1.7e9)


def _serving(tokens: float) -> ServerSample:
    return ServerSample(
        up=True, health_status=200, iterations=tokens / 8, prompt_tokens=tokens,
        generation_tokens=tokens / 4, running=4.0, waiting=0.0,
    )  # fmt: skip


def _run(
    silence_s: int, tmp_path: Path, restart: bool = False
) -> tuple[list[Verdict], _Daemon, str]:
    sigs, th = load_signatures(), Thresholds()
    sink = MetricsSink([s.id for s in sigs.signatures], version="test")
    writer = IncidentWriter(tmp_path / "incidents")
    hook = EpisodeHook(writer=writer, metrics=sink, stalled_incident_after_s=20.0)
    daemon = _Daemon()
    tl = Timeline(gpus=(gpu(0.05, 0.01),), procs=procs())
    tokens = 0.0
    for sec in range(10 + silence_s + 15):
        moving = sec < 10 or sec >= 10 + silence_s
        tokens += 64.0 if moving else 0.0
        if restart and sec == 10 + silence_s:  # the server comes back under a new pid
            tl.procs = procs(pid=5000)
            tl.tick(
                server=ServerSample(up=True, health_status=200),
                procs=procs(pid=5000, restarted=True),
            )
            continue
        tl.tick(server=_serving(tokens))
    verdicts = []
    for obs in tl.obs:
        daemon.window.append(obs)
        v = classify(daemon.window, sigs, th)
        verdicts.append(v)
        hook.on_tick(daemon.tick(obs, v))
    return verdicts, daemon, render_text(sink.collect()).decode()


def test_a_40_s_silence_that_ends_by_itself_is_recovered_on_its_own(tmp_path: Path) -> None:
    verdicts, daemon, metrics = _run(40, tmp_path)
    states = [v.state for v in verdicts]
    assert "stalled" in states and not any(v.is_hang for v in verdicts)
    assert states[-1] == "serving"
    assert 'hang_watchdog_episodes_total{outcome="recovered_on_its_own"} 1.0' in metrics
    assert 'hang_watchdog_episodes_total{outcome="restarted"} 0.0' in metrics
    events = [json.loads(line) for line in daemon.out.getvalue().splitlines()]
    ended = [e for e in events if e["event"] == "episode"]
    assert [(e["outcome"], e["stage"]) for e in ended] == [("recovered_on_its_own", "stalled")]
    (bundle,) = (tmp_path / "incidents").iterdir()
    doc = json.loads((bundle / "incident.json").read_text())
    assert doc["outcome"]["outcome"] == "recovered_on_its_own"
    assert "## Outcome" in (bundle / "summary.md").read_text()


def test_a_short_wait_below_the_stall_threshold_is_no_episode_at_all(tmp_path: Path) -> None:
    _, daemon, metrics = _run(10, tmp_path)
    assert 'hang_watchdog_episodes_total{outcome="recovered_on_its_own"} 0.0' in metrics
    assert "episode" not in daemon.out.getvalue()


def test_a_stall_ended_by_a_new_process_is_restarted(tmp_path: Path) -> None:
    _, _, metrics = _run(40, tmp_path, restart=True)
    assert 'hang_watchdog_episodes_total{outcome="restarted"} 1.0' in metrics
    assert 'hang_watchdog_episodes_total{outcome="recovered_on_its_own"} 0.0' in metrics
