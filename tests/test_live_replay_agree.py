"""The live path and `replay` read the same lines the same way (core/state/events.py).

Each real log sample (tests/data/logs/) and each corpus excerpt (tests/data/corpus/) is fed
both ways:
- `replay`: the log's events through the signatures, then the generic classes (what
  `hang-watchdog replay LOG` prints);
- live: the same lines through the log parser into a Window, 20 lines a tick one second
  apart, the server process alive and no /metrics or GPU (a log-only watch), then classify().

What "same" means here, precisely. A state's family is `alarm` (stalled, hung, dead) or
`quiet` (starting, loading, compiling, capturing, idle, serving, crawling); hung and dead are
one family because live tells them apart by the process (alive here), replay cannot.
1. Live never raises an alarm on lines `replay` finds quiet: no reading of a line is live-only.
2. Where `replay` alarms on a decisive line (a signature of state `crash`, or a generic class's
   `line` rule), live alarms too: the line means the same to both.
What may differ, by design, and is not compared: classes `replay` reads from the whole raw
log that a live source does not keep (livelock, a traceback ending the log), stalls measured
over the log's own timestamps (replay) versus the watch's clock (live: no time passes here),
and stack dumps in the log that live evidence must prove.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.obsbuilder import Timeline, events, procs
from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.state.window import Window
from watchdog.sources.logs.split import LineSplitter

DATA = Path(__file__).parent / "data"
LOGS = sorted((DATA / "logs").glob("*.log")) + sorted((DATA / "corpus").glob("*.log"))
QUIET = frozenset({"starting", "loading", "compiling", "capturing", "idle", "serving", "crawling"})
ALARM = frozenset({"stalled", "hung", "dead"})


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def family(state: str) -> str:
    assert state in QUIET | ALARM, state
    return "quiet" if state in QUIET else "alarm"


def replayed(data: bytes, sigs: SignatureSet) -> tuple[str, bool]:
    """(family, decisive): what `replay` says, and whether a decisive line says it."""
    _, evs = read_log(data, sigs, PATTERNS)
    matches = name_signatures(evs, sigs)
    if matches:
        return "alarm", matches[0].signature.state == "crash"
    cv = log_classes(evs, data, sigs)
    if cv is None:
        return "quiet", False
    return family(cv.state), any(r.kind == "line" and r.label == cv.primary.label
                                 for r in cv.primary.cls.rules)  # fmt: skip


def watched(data: bytes, sigs: SignatureSet) -> str:
    """The family of the live verdict after the log's lines."""
    splitter = LineSplitter()
    lines = splitter.feed(data)
    tail = splitter.flush()
    lines += [tail] if tail else []
    tl = Timeline(procs=procs())
    w = Window(ranks=sigs.ranks)
    for i in range(0, len(lines), 20):
        w.append(tl.tick(logs=events(lines[i : i + 20], sigs)))
    w.append(tl.tick())
    return family(classify(w, sigs, Thresholds()).state)


def test_there_are_logs_to_compare() -> None:
    assert len(LOGS) > 500


def test_live_and_replay_read_every_log_the_same(sigs: SignatureSet) -> None:
    live_only, decisive_missed = [], []
    agree = 0
    for path in LOGS:
        data = path.read_bytes()
        (rep, decisive), live = replayed(data, sigs), watched(data, sigs)
        if live == "alarm" and rep == "quiet":
            live_only.append(path.name)
        if rep == "alarm" and decisive and live != "alarm":
            decisive_missed.append(path.name)
        agree += rep == live
    print(f"{agree}/{len(LOGS)} logs in the same family both ways")
    assert not live_only, f"live alarms that replay does not raise: {live_only}"
    assert not decisive_missed, f"decisive lines live does not alarm on: {decisive_missed}"
