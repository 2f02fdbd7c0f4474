"""Name signatures from log lines alone (pure): `replay` of a pasted or journald log.

A signature is named when one of its decisive log rules matched, or when its log and stack
rules plus a stall visible in the log itself (a stats line with requests pending and zero
throughput) reach its minimum confidence. Stack rules read the dumps the log itself holds
(py-spy, faulthandler, gdb, tracebacks: `stack` events, core/state/logdumps.py); one dump is one
dump, so an `unchanged` rule needs two of the same process. GPU and socket evidence is not in
a log, so signatures that need it (e.g. `trtllm_attention_deadlock`) are never named from a
log alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from watchdog.core.judge.derived import with_derived
from watchdog.core.judge.evidence import match_stacks
from watchdog.core.judge.generic import after_progress
from watchdog.core.judge.linesearch import LineIndex
from watchdog.core.knowledge.signatures import Rule, Signature, SignatureSet
from watchdog.core.model import LogEvent, StackSample
from watchdog.core.state.events import StatsLine, typed
from watchdog.core.state.logdumps import log_stacks


@dataclass(frozen=True)
class LogMatch:
    """One signature named by a log, with the lines that matched."""

    signature: Signature
    confidence: float
    decisive: bool
    lines: tuple[str, ...]
    stall: str | None


@dataclass(frozen=True)
class Settled:
    """What the log shows after the server's last progress: its lines and its dumps (rules
    marked `after_progress` read only these; a wait the server moved past is no verdict)."""

    lines: frozenset[str]
    stacks: tuple[StackSample, ...]


def log_stall(events: Sequence[LogEvent]) -> str | None:
    """The stall a log shows on its own: the last stats line pending with zero throughput.
    A line that reports a step it ran (TensorRT-LLM's `iter = N`, SGLang's `Prefill batch`) is
    progress, and a line without throughput figures cannot show zero throughput
    (core/state/events.py StatsLine.stalled)."""
    stats = [t for t in map(typed, events) if isinstance(t, StatsLine)]
    if not stats or not stats[-1].stalled:
        return None
    return f"last stats line shows {stats[-1].pending:.0f} request(s) pending and zero throughput"


def name_signatures(
    events: Iterable[LogEvent], sigs: SignatureSet, max_lines: int = 5
) -> list[LogMatch]:
    """Every signature the log identifies, best first."""
    events = with_derived(list(events))  # core/judge/derived.py
    stall = log_stall(events)
    stacks = log_stacks(events)
    index = LineIndex([e.line for e in events])  # each rule searched over all lines at once
    late = after_progress(events)
    settled = Settled(frozenset(e.line for e in late), log_stacks(late))
    found: list[LogMatch] = []
    for sig in sigs.signatures:
        m = _match(sig, index, stacks, stall, max_lines, settled)
        if m is not None:
            found.append(m)
    ranked = sorted(found, key=lambda m: (m.signature.priority, m.confidence), reverse=True)
    return causes_first(ranked, events)


def causes_first(ranked: list[LogMatch], events: Sequence[LogEvent]) -> list[LogMatch]:
    """A death (a `consequence` signature) that a named cause's line precedes in the log ranks
    below that cause: a worker killed by its own NCCL watchdog after a collective timed out is a
    collective hang, and gloo's timeout before `WorkerProc failed to start` is the network."""
    first = {}
    for m in ranked:
        lines = set(m.lines)
        first[m.signature.id] = next(
            (i for i, e in enumerate(events) if e.line in lines), len(events)
        )
    causes = [m for m in ranked if not m.signature.consequence]
    out = list(ranked)
    for m in ranked:
        if not m.signature.consequence:
            continue
        at = _death_at(m, events, first[m.signature.id])
        earlier = [c for c in causes if _before(first[c.signature.id], at, events)]
        if earlier:
            out.remove(m)
            out.insert(out.index(earlier[-1]) + 1, m)
    return out


def _death_at(m: LogMatch, events: Sequence[LogEvent], first: int) -> int:
    """Where the death is said: its first decisive line (`WorkerProc failed to start.`), not a
    traceback frame one of its weaker rules also matched above the cause."""
    rules = m.signature.decisive_log_rules
    lines = set(m.lines)
    for i, e in enumerate(events):
        if e.line in lines and any(r.pattern and r.pattern.search(e.line) for r in rules):
            return i
    return first


# A death logged as a traceback's header (SGLang's `Scheduler hit an exception: Traceback (most
# recent call last):`, srt/managers/scheduler.py) is followed by its cause: the traceback's own
# lines, within this many events, come before it in meaning.
_TRACEBACK_SPAN = 40
# The death's line is its traceback's header, or one of its frames (vLLM's multiproc_executor
# logs a worker's exception frame by frame; a cut excerpt may start below the header).
_TRACEBACK_LINE = re.compile(r'Traceback \(most recent call last\):\s*$|\bFile "[^"]+", line \d+')


def _before(cause_at: int, death_at: int, events: Sequence[LogEvent]) -> bool:
    """Does the cause at `cause_at` precede the death at `death_at`, or lie in its traceback?"""
    if cause_at < death_at:
        return True
    if death_at >= len(events) or cause_at - death_at > _TRACEBACK_SPAN:
        return False
    return _TRACEBACK_LINE.search(events[death_at].line) is not None


def _holds(
    rule: Rule,
    index: LineIndex,
    stacks: tuple[StackSample, ...],
    settled: Settled | None = None,
) -> list[str]:
    """What supports one log or stack rule in the log: the lines, or the frame found.
    `settled`: the lines and dumps after the log's last progress, for rules that only read
    those."""
    if rule.kind == "log" and rule.pattern is not None:
        hits = index.matching(rule.pattern)
        if rule.after_progress and settled is not None:
            hits = [h for h in hits if h in settled.lines]
        return hits
    if rule.kind == "stack":
        late = rule.after_progress and settled is not None
        detail = match_stacks(rule, settled.stacks if late and settled else stacks)
        return [f"{rule.label}: {detail}"] if detail else []
    return []


def _match(
    sig: Signature,
    index: LineIndex,
    stacks: tuple[StackSample, ...],
    stall: str | None,
    max_lines: int,
    settled: Settled | None = None,
) -> LogMatch | None:
    if any(_holds(r, index, stacks) for r in sig.unless):
        return None
    conf, decisive = 0.0, False
    lines: list[str] = []
    any_log = False
    for rule in sig.evidence:
        if rule.kind == "no_progress" and stall:
            conf += rule.weight
            continue
        hits = _holds(rule, index, stacks, settled)
        if hits:
            any_log = True
            conf += rule.weight
            decisive = decisive or rule.decisive
            lines.extend(h for h in hits if h not in lines)
        elif rule.required:  # GPU, socket or health evidence a log cannot hold, or no stall
            return None
    if not any_log or not (decisive or conf + 1e-9 >= sig.min_confidence):
        return None
    return LogMatch(sig, round(min(conf, 1.0), 3), decisive, tuple(lines[:max_lines]), stall)
