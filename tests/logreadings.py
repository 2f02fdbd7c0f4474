"""One log text read both ways, as the product reads it: `replay` (signatures named, the generic
class and its rule's label, the root cause) and the live watch (a log-only window, the process
alive, classified with the default thresholds). Shared by the tests of the readings."""

from __future__ import annotations

from dataclasses import dataclass

from tests.obsbuilder import Timeline, events, procs
from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.judge.rootcause import Cause, cause_of
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import Verdict
from watchdog.core.state.window import Window

SIGS = load_signatures()


@dataclass(frozen=True)
class Replayed:
    """What `replay` says of a log: the signatures it names, else the class it shows."""

    names: tuple[str, ...]
    cls: str | None
    label: str  # the class's rule that matched
    cause: Cause | None  # the root cause, read only when the log is flagged


def replay_read(text: str, sigs: SignatureSet = SIGS) -> Replayed:
    data = text.encode()
    _, evs = read_log(data, sigs, PATTERNS)
    names = tuple(m.signature.id for m in name_signatures(evs, sigs))
    cv = None if names else log_classes(evs, data, sigs)
    flagged = bool(names) or cv is not None
    return Replayed(
        names,
        cv.primary.cls.id if cv else None,
        cv.primary.label if cv else "",
        cause_of(evs) if flagged else None,
    )


def live_verdict(text: str, sigs: SignatureSet = SIGS) -> Verdict:
    """The live verdict after the lines, fed 20 a tick, then one quiet tick."""
    tl = Timeline(procs=procs())
    w = Window(ranks=sigs.ranks)
    lines = text.splitlines()
    for i in range(0, len(lines), 20):
        w.append(tl.tick(logs=events(lines[i : i + 20], sigs)))
    w.append(tl.tick())
    return classify(w, sigs, Thresholds())
