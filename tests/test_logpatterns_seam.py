"""Operator `--engines` log formats reach every reader as a parameter, never as module state.

An operator profile's stats line (tests/test_engines.py GOOD: `acme step N queue=M`) must be read
by the live log file, the journal reader, supervise mode's child output (all three as the
daemon's wiring builds them from one Config) and `replay --engines`; two LogSources with
different formats in one process must not affect each other.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import GOOD, STANDIN, install_journalctl
from tests.shipped import PATTERNS
from tests.simfixtures import run_watchdog
from watchdog.config import Config
from watchdog.core.model import LogEvent
from watchdog.daemon.wiring import build
from watchdog.engines.loader import load_engines
from watchdog.sources.logs.parse import LogPatterns
from watchdog.sources.logs.source import FileFollower, LogSource

ACME = "acme step 7 queue=2"


def profile(tmp_path: Path) -> Path:
    path = tmp_path / "acme.toml"
    path.write_text(GOOD, encoding="utf-8")
    return path


def acme_stats(events: list[LogEvent]) -> list[LogEvent]:
    return [e for e in events if e.kind == "stats" and e.fields.get("iteration") == 7]


def poll_until(
    source: LogSource, want: int, timeout: float = 20.0, first: list[LogEvent] | None = None
) -> list[LogEvent]:
    events: list[LogEvent] = list(first or [])
    deadline = time.monotonic() + timeout
    while len(acme_stats(events)) < want and time.monotonic() < deadline:
        events += source.poll()
        time.sleep(0.05)
    return events


def test_two_sources_with_different_formats_do_not_interfere(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"{ACME}\n", encoding="utf-8")
    acme = LogPatterns.from_engines(load_engines([profile(tmp_path)]))
    with_acme = LogSource([FileFollower(log, from_start=True)], patterns=acme)
    shipped = LogSource([FileFollower(log, from_start=True)], patterns=PATTERNS)  # built after
    assert acme_stats(list(with_acme.poll())) and not acme_stats(list(shipped.poll()))
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"{ACME}\n")
    assert not acme_stats(list(shipped.poll()))  # polled first: the acme source is no default
    assert len(acme_stats(list(with_acme.poll()))) == 1
    for s in (with_acme, shipped):
        s.close()


def test_wiring_hands_the_profiles_formats_to_file_journal_and_supervised_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_journalctl(tmp_path, monkeypatch, STANDIN)  # a stand-in journalctl prints the line
    entry = {"__CURSOR": "s=c1", "__REALTIME_TIMESTAMP": "1764000000000000", "MESSAGE": ACME}
    (tmp_path / "out").write_text(json.dumps(entry) + "\n", encoding="utf-8")  # `-o json`
    monkeypatch.setenv("STANDIN_OUT", str(tmp_path / "out"))
    log = tmp_path / "server.log"
    log.write_text("", encoding="utf-8")
    child = f"import time; print({ACME!r}, flush=True); time.sleep(30)"
    cfg = Config(
        engines=[str(profile(tmp_path))],
        log_files=[str(log)],
        journal_unit="vllm.service",
        command=[sys.executable, "-c", child],
        gpu_source="none",
        metrics_addr="off",
        stacks=False,
        cdn_default=False,
    )
    built = build(cfg)
    try:
        assert built.supervisor is not None
        built.supervisor.start()
        logs = built.daemon.source("logs")
        # The file follower starts at the end of the file, as `tail -F`; this first poll may
        # already hold the child's line (it prints at once), so its events are kept.
        first = list(logs.poll())
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"{ACME}\n")
        events = poll_until(logs, 3, first=first)
        sources = sorted(e.source for e in acme_stats(events))
        assert len(sources) == 3, sources  # one line from each reader, none from module state
        assert str(log) in sources
        assert len(set(sources)) == 3
    finally:
        built.supervisor.stop(grace_s=5)  # type: ignore[union-attr]
        built.close()
    # A source built without the profile (the shipped formats) does not read the acme line.
    plain = LogSource([FileFollower(log, from_start=True)], patterns=PATTERNS)
    assert not acme_stats(list(plain.poll()))
    plain.close()


def replay_json(args: list[str]) -> dict[str, object]:
    proc = run_watchdog("replay", "--json", *args)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_replay_reads_an_operator_profiles_lines_with_engines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"INFO 12-01 10:00:00 [x.py:1] start\n{ACME}\n", encoding="utf-8")
    with_acme = replay_json(["--engines", str(profile(tmp_path)), str(log)])
    shipped = replay_json([str(log)])
    assert with_acme["parsed"] == {"stats": 1}
    assert shipped["parsed"] == {}


def test_replay_engines_names_a_bad_profile_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace('role = "worker"', 'role = "boss"'), encoding="utf-8")
    log = tmp_path / "server.log"
    log.write_text(f"{ACME}\n", encoding="utf-8")
    proc = run_watchdog("replay", "--engines", str(bad), str(log))
    assert proc.returncode == 2
    assert "--engines" in proc.stderr and "unknown role 'boss'" in proc.stderr
