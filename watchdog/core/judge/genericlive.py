"""The generic layer for `run` and `diagnose`: the class the live log shows when no signature
named a cause (pure: the window in, a verdict out).

classify() names signatures first; this module only looks at a candidate without a signature,
and only at log lines that came after the server's last progress (by any witness: metrics,
stats lines, bars), so a failure the server recovered from is not reported. Livelock reads every
line of a log and a live source keeps only the lines its patterns ask for, so the live watch
reports crashed, timed out and stalled; `replay` of the log reports livelock too.
"""

from __future__ import annotations

import dataclasses

from watchdog.core.judge.candidate import Candidate
from watchdog.core.judge.generic import class_verdict, find_classes
from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.model import Evidence, LogEvent
from watchdog.core.state.window import Window
from watchdog.core.states import State

# Worse states a class may raise a verdict to; a verdict already worse keeps its state.
_RANK = {State.DEAD: 3, State.HUNG: 2, State.STALLED: 1}
# Work the live watch knows is legitimate (weights read, a compiler running, startup): vLLM
# prints its shared-memory wait lines during long compiles too ("time-consuming work (e.g.
# compilation)", vllm/distributed/device_communicators/shm_broadcast.py), so a `stalled` class
# does not override these; a crash or a timeout does.
_BUSY = frozenset({State.STARTING, State.LOADING, State.COMPILING})


def live_events(window: Window) -> list[LogEvent]:
    """The log events of the window from the tick of the server's last progress on, in order;
    find_classes then keeps those after the last progress line (core/state/events.py), so a failure
    logged after progress in the same tick is read as `replay` reads it."""
    since = window.progress.last_progress_t
    return [ev for o in window if since is None or o.t >= since for ev in o.logs]


def with_generic(
    verdict: Candidate, window: Window, sigs: SignatureSet, load_deadline_s: float | None = None
) -> Candidate:
    """`verdict` with the generic class the live log shows, when no signature named one."""
    if verdict.signature is not None or not sigs.generic:
        return verdict
    found = class_verdict(
        find_classes(live_events(window), sigs.generic, load_deadline_s=load_deadline_s)
    )
    if found is None:
        return verdict
    p = found.primary
    state = State(found.state)
    if state == State.STALLED and verdict.state in _BUSY:
        return verdict
    if _RANK.get(verdict.state, 0) > _RANK.get(state, 0):
        state = verdict.state
    detail = f"{p.label}: {p.line}" + (f" ({p.detail})" if p.detail else "")
    evidence = (Evidence("log", f"generic:{p.cls.id}", detail, 0.5),) + tuple(
        Evidence("log", f"generic:{f.cls.id}", f"{f.label}: {f.line}", 0.2)
        for f in found.findings[1:]
    )
    return dataclasses.replace(
        verdict,
        state=state,
        title=p.cls.title,
        evidence=evidence + verdict.evidence,
        reason=f"{p.cls.id}: {p.cls.title}; no signature names the cause",
        fix=p.cls.needs,
        commands=p.cls.commands,
    )
