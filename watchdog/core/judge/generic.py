"""The generic layer of knowledge: crashed, timed out, stalled, livelock, read from log lines alone.

A generic class needs no signature: it says *that* something is wrong (with the line that shows
it) where no specific signature says *why*. The classes are data (`[[generic]]` in
signatures.toml, parsed by core/knowledge/genericparse.py); this module only evaluates them,
pure (no clock, no I/O). A line that the server moved past (progress after it: a stats line with
throughput, a step it ran, a startup milestone) is recovered from, not a verdict, so a handled
CUDA OOM or a retried timeout stays quiet.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from watchdog.core.knowledge.genericmodel import GenericClass, GenericRule
from watchdog.core.model import LogEvent
from watchdog.core.state.events import Heartbeat, Milestone, StatsLine, progress_flags, typed
from watchdog.core.state.openops import who_of


@dataclass(frozen=True)
class GenericFinding:
    """One generic class a log shows, with its decisive line."""

    cls: GenericClass
    label: str
    line: str
    detail: str = ""


_TS = re.compile(
    r"(?:(?P<y>\d{4})-)?(?P<mo>\d{2})-(?P<d>\d{2})[ T](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
)
# A record's own prefix (level, date, time, logger, process tag) is not its content.
_PREFIX = re.compile(
    # journald: `MON DD HH:MM:SS host unit[pid]: `
    r"^(?:\S+ +\d+ \d{2}:\d{2}:\d{2} \S+ [\w.-]+\[\d+\]: )?"
    # vLLM's process tags, nested and with ranks: `(EngineCore_0 pid=7) (VllmWorker rank=0 pid=9) `
    r"(?:\((?:[^()]|\([^()]*\))*\bpid=\d+[^()]*\)\s*)*"
    r"(?:\[rank\d+\]:\s*)?"  # torchrun's per-rank `[rank0]: ` (pytorch/pytorch#132644)
    r"(?:\[[^\]]*\d{2}:\d{2}:\d{2}[^\]]*\]\s*|"
    # vLLM's `[file.py:N]`, or at DEBUG a shortened path (`[v1/executor/multiproc_executor.py:N]`,
    # vllm/logging_utils/formatter.py shrink_path).
    r"(?:[A-Z]+ )?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?\s*(?:\[?[\w./]+:\d+\]\s*)?|"
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}[.,\d]*\S*\s*(?:-?\s*[A-Z]+\s*-?\s*)?)?"
)


# TensorRT-LLM's logger: `[01/22/2026-08:52:42] [TRT-LLM] [E] ...` (tensorrt_llm/logger.py).
_TS_SLASHED = re.compile(
    r"(?P<mo>\d{2})/(?P<d>\d{2})/\d{4}-(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
)


def timestamp_s(line: str) -> float | None:
    """Seconds of a log line's own timestamp (month and day approximate), or None."""
    m = _TS.search(line[:80]) or _TS_SLASHED.search(line[:80])
    if m is None:
        return None
    days = int(m["mo"]) * 31 + int(m["d"])
    return ((days * 24 + int(m["h"])) * 60 + int(m["mi"])) * 60.0 + int(m["s"])


def _pending_zero(ev: LogEvent) -> bool:
    t = typed(ev)
    return isinstance(t, StatsLine) and t.stalled


def after_progress(events: Sequence[LogEvent]) -> list[LogEvent]:
    """The events after the last sign of progress (core/state/events.py: serving or startup): only
    these can show a failure now."""
    flags = progress_flags(list(events))
    last = max((i for i, moved in enumerate(flags) if moved), default=-1)
    return list(events[last + 1 :])


def _loading_beats(events: Sequence[LogEvent], loading: bool = True) -> dict[str, float | None]:
    """The content of each launcher heartbeat logged while loading (before any ready
    milestone; every one with `loading=False`), with how often the launcher prints it: the
    launcher's liveness, judged by the loading deadline, not a loop."""
    out: dict[str, float | None] = {}
    for ev in events:
        t = typed(ev)
        if loading and isinstance(t, Milestone) and t.ready:
            break
        if isinstance(t, Heartbeat):
            out[content(ev.line)] = t.every_s
    return out


def find_classes(
    events: Sequence[LogEvent],
    classes: Sequence[GenericClass],
    tail: Sequence[str] = (),
    load_deadline_s: float | None = None,
    tail_times: Sequence[float | None] = (),
) -> list[GenericFinding]:
    """Each generic class the log shows (at most one finding per class), in the data's order.

    `events` are the parsed events in log order; `tail` the log's last records, for the
    classes that read every line (livelock); `load_deadline_s` how long a launcher may wait
    for its shard while loading (Thresholds.load_deadline_s; None: heartbeats are not told
    apart from other lines); `tail_times` the time a collector's prefix gave each tail record
    (None where it gave none), for records with no time of their own."""
    recent = after_progress(events)
    flags = progress_flags(list(events))
    moving = frozenset(content(e.line) for e, moved in zip(events, flags, strict=True) if moved)
    beats = (
        None
        if load_deadline_s is None
        else _Beats(_loading_beats(events), load_deadline_s, _loading_beats(events, False))
    )
    found = []
    for cls in classes:
        for rule in cls.rules:
            hit = _rule(rule, cls, recent, tail, moving, beats, tail_times)
            if hit is not None:
                found.append(hit)
                break
    return found


def _near_miss(cls: GenericClass, line: str) -> bool:
    return any(p.search(line) for p in cls.unless)


def _rule(
    rule: GenericRule,
    cls: GenericClass,
    recent: list[LogEvent],
    tail: Sequence[str],
    moving: frozenset[str] = frozenset(),
    beats: _Beats | None = None,
    tail_times: Sequence[float | None] = (),
) -> GenericFinding | None:
    if rule.kind == "line" and rule.pattern is not None:
        for ev in recent:
            if ev.kind != "stats" and rule.pattern.search(ev.line) and not _near_miss(cls, ev.line):
                return GenericFinding(cls, rule.label, ev.line)
        return None
    if rule.kind == "traceback_end":
        return _traceback_end(rule, cls, recent, tail, moving)
    if rule.kind == "repeat" and rule.pattern is not None:
        hits = [e.line for e in _since_reset(rule, recent) if rule.pattern.search(e.line)]
        hits = [h for h in hits if not _near_miss(cls, h)]
        if len(hits) >= rule.count:
            return GenericFinding(cls, rule.label, hits[-1], f"{len(hits)} times, no progress")
        return None
    if rule.kind == "stats_stall":
        return _stats_stall(rule, cls, recent)
    if rule.kind == "same_lines":
        return _same_lines(rule, cls, tail, beats, tail_times)
    return None


def _since_reset(rule: GenericRule, recent: list[LogEvent]) -> list[LogEvent]:
    """The events after the last line matching the rule's `reset` (all without one)."""
    if rule.reset is None:
        return recent
    last = max((i for i, e in enumerate(recent) if rule.reset.search(e.line)), default=-1)
    return recent[last + 1 :]


@dataclass(frozen=True)
class _Beats:
    """A launcher's heartbeats while loading, and the deadline they are judged by."""

    lines: dict[str, float | None]  # content -> the launcher's period (None: not known)
    deadline_s: float
    periods: dict[str, float | None] = field(default_factory=dict)  # every heartbeat's period

    def span(self, cycle: Sequence[str], rounds: int) -> float | None:
        """How long a launcher's heartbeat cycle has been repeating, from its known period,
        for lines a collector stripped the timestamps from; None when the cycle is no
        heartbeat with a known period."""
        known = self.periods or self.lines
        if not known or not all(c in known for c in cycle):
            return None
        every = max((known[c] or 0.0) for c in cycle)
        return rounds * every if every else None

    def loading(self, cycle: Sequence[str], span_s: float | None, rounds: int) -> bool:
        """Is a repeating cycle a launcher's heartbeat within the loading deadline? Without
        timestamps the span is the rounds times the period."""
        if not self.lines or not all(c in self.lines for c in cycle):
            return False
        if span_s is None:
            span_s = self.span(cycle, rounds)
        return span_s is None or span_s < self.deadline_s


# `, in NAME` (or `, line N`) may be wrapped onto the next line by a terminal
# (vllm-project/vllm#24430, #20226).
_FRAME = re.compile(r'^\s*File "[^"]+"(?:, line \d*|\s*$)')
# A frame line cut inside its path (a log line limit, a paste): still where the traceback ends.
_CUT_FRAME = re.compile(r'^\s*File "[^"]*$')
_FRAME_FN = re.compile(r'^\s*File "[^"]+", line \d+, in (?P<fn>[\w<>.]+)\s*$')
_EXC = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*)?(?:Error|Exception|Interrupt|Exit)\b(?::|$)"
)
# Python 3.11+ marks the failing expression under each frame's code line (`    ^^^^^`, `~~~^~~`).
_CARETS = re.compile(r"^[\s^~]+$")
# A traceback's header logged below ERROR is an error the code handled and logged for the
# record (TensorRT-LLM's `[TRT-LLM] [V] Error details: ... Traceback`), not the end of a process.
_HANDLED = re.compile(
    r"(?:\[[VDIW]\]|\b(?:DEBUG|INFO|WARNING|WARN|VERBOSE)\b).*Traceback \(most recent call last\)"
)
_AFTER_FRAME = 3  # lines a traceback prints after its last frame: code, exception, one more
_AFTER_FRAME_EXC = 6  # with an exception line among them (two processes' ends interleaved)


def _traceback_end(
    rule: GenericRule,
    cls: GenericClass,
    recent: list[LogEvent],
    tail: Sequence[str],
    moving: frozenset[str],
) -> GenericFinding | None:
    """A Python traceback that ends the log with its exception line (its header may be cut,
    as when a poster or a log rotation dropped `Traceback (most recent call last):`)."""
    lines = [content(t) for t in tail if t.strip()]
    body = [b for b in lines if not _CARETS.match(b)][-max(rule.count, 3) - 8 :]
    if _survived(tail, cls.survived):
        return None
    dumps = [e for e in recent if e.kind == "stack" and e.fields.get("format") == "traceback"]
    for ev in reversed(dumps):
        error = str(ev.fields.get("exception") or "")
        # A dump's event may be emitted after lines that followed it; with the log's tail at
        # hand, the exception must be among its last lines (nothing moved on after it).
        if error and not _near_miss(cls, error) and (not tail or _ends(error, body, moving)):
            return GenericFinding(cls, rule.label, error, "a traceback after the last progress")
    frames = [i for i, b in enumerate(body) if _FRAME.match(b) or _CUT_FRAME.match(b)]
    headed = bool(frames) and any(
        b.endswith("Traceback (most recent call last):") for b in body[: frames[0]]
    )
    if any(_near_miss(cls, b) for b in body) or _handled(tail):
        return None
    if not frames and body and body[-1].endswith("Traceback (most recent call last):"):
        # The log stops at a header: the traceback it begins was cut (a paste, a lost pipe).
        return GenericFinding(
            cls, rule.label, body[-1], "the log ends at a traceback's header (its frames are cut)"
        )
    if len(frames) < (1 if headed else 2):
        # No frames, or one without its header: what ends the log is the exception line alone.
        return _bare_exception(rule, cls, tail, moving)
    after = body[frames[-1] + 1 :]
    exc = next((b for b in reversed(after) if _EXC.match(b)), None)
    if len(after) > (_AFTER_FRAME_EXC if exc else _AFTER_FRAME):
        return None  # the log does not end inside a traceback
    if any(a in moving for a in after):
        return None  # the server made progress after it
    if _innermost_first(body):
        return None
    if exc is not None:
        return GenericFinding(cls, rule.label, exc, "the log ends with a traceback's exception")
    return GenericFinding(
        cls, rule.label, body[frames[-1]], "the log ends inside a traceback (its end is cut)"
    )


def _bare_exception(
    rule: GenericRule, cls: GenericClass, tail: Sequence[str], moving: frozenset[str]
) -> GenericFinding | None:
    """The log ends with an exception line whose frames it lost (a paste of the error alone).
    Python's excepthook prints an uncaught exception's `Name(Error|Exception): message` at the
    start of a line, with no logger prefix, and the message may run on over a few lines; an
    exception line a logger wrote (`ERROR ... [file.py:N] RuntimeError: ...`) may be one the
    code handled, and is only read with its frames."""
    raw = [t.strip() for t in tail if t.strip()][-_AFTER_FRAME:]
    for i, line in enumerate(raw):
        if _EXC.match(line) and not line.endswith(("Error", "Exception")):
            if any(content(later) in moving for later in raw[i + 1 :]):
                return None  # the server made progress after it
            return GenericFinding(cls, rule.label, line, "the log ends with an exception line")
    return None


def _handled(tail: Sequence[str]) -> bool:
    """Was the last traceback header in the tail logged below ERROR?"""
    for t in reversed(tail):
        if "Traceback (most recent call last)" in t:
            return bool(_HANDLED.search(t))
    return False


# uvicorn's access log: `INFO:  127.0.0.1:40202 - "POST /v1/completions HTTP/1.1" 400 Bad Request`
_ANSWERED = re.compile(r'HTTP/\d(?:\.\d)?" [1-5]\d\d\b')


def _survived(tail: Sequence[str], survived: Sequence[re.Pattern[str]]) -> bool:
    """Was the last traceback in the tail logged by a handler the server carries on after? One of
    its frames (a request route's), its header line (a logger that prefixes every line tags it
    with the logging file) or the record just before it (the message `logger.exception` wrote)
    matches one of `survived`."""
    if not survived:
        return False
    lines = [t for t in tail if t.strip()]
    head = next(
        (
            i
            for i in range(len(lines) - 1, -1, -1)
            if "Traceback (most recent call last)" in lines[i]
        ),
        None,
    )
    if _through_route(lines[_chain_start(lines, head) if head is not None else 0 :], survived):
        return True
    if head is not None:
        around = (lines[head], lines[head - 1] if head else "")
        return any(p.search(line) for p in survived for line in around)
    # The header was cut (a poster's excerpt, a rotated log): the logger's prefix on its last
    # frame tags the traceback, when the server is then seen answering a request (uvicorn's
    # access line): without the header, that is what shows the handler carried on.
    at = next((i for i in range(len(lines) - 1, -1, -1) if 'File "' in lines[i]), None)
    if at is None or not any(_ANSWERED.search(t) for t in lines[at + 1 :]):
        return False
    return any(p.search(lines[at]) for p in survived)


# The frames through which an engine's failure reaches every request: vLLM V0's engine client
# re-raises the exception the engine sent for the request (vllm/engine/multiprocessing/
# client.py@v0.7.3 _process_request `raise request_output`), and the AsyncLLMEngine's streams
# raise the one its dying loop put in each of them (async_llm_engine.py@v0.7.3 AsyncStream
# __anext__, _process_request); V1's output collector raises the one the output handler put in
# each (vllm/v1/engine/output_processor.py@v0.32.0 RequestOutputCollector.get `raise output`,
# EngineDeadError when the engine core is gone). A route's traceback through them is the engine
# failing. TensorRT-LLM's routes stop the server on the executor's own error
# (tensorrt_llm/serve/openai_server.py: `except CppExecutorError: ... signal.raise_signal(SIGINT)`).
_ENGINE_STREAM = re.compile(
    r", in (?:_process_request|__anext__)\s*$|^\s*raise (?:request_)?output\s*$"
    r"|\bCppExecutorError\b"
)


# CPython's traceback chaining (Lib/traceback.py): a traceback printed under one of these lines
# is the same exception's chain, raised while the one above it was handled.
_CHAINED = re.compile(
    r"During handling of the above exception, another exception occurred:|"
    r"The above exception was the direct cause of the following exception:"
)


def _chain_start(lines: Sequence[str], head: int) -> int:
    """The header of the first traceback in the chain the one at `head` ends."""
    while head >= 1 and _CHAINED.search(lines[head - 1]):
        earlier = [i for i in range(head - 1) if "Traceback (most recent call last)" in lines[i]]
        if not earlier:
            break
        head = earlier[-1]
    return head


def _frame_part(line: str) -> str:
    """A frame line from its `File "` on: the logger's prefix (`serving_chat.py:N]`) is who
    logged it, read by the header rule, not where the frame is."""
    return line[line.index('File "') :]


def _through_route(lines: Sequence[str], survived: Sequence[re.Pattern[str]]) -> bool:
    """Does the last traceback in `lines` run through a frame `survived` names (a request
    route's: the exception left one request's handler)? A route frame whose traceback ended (an
    exception line) before more frames came is another traceback's."""
    at = next(
        (
            i
            for i in range(len(lines) - 1, -1, -1)
            if 'File "' in lines[i] and any(p.search(_frame_part(lines[i])) for p in survived)
        ),
        None,
    )
    if at is None:
        return False
    if any(_ENGINE_STREAM.search(content(t)) for t in lines):
        return False  # the engine's own failure, re-raised into the requests
    rest = [content(t) for t in lines[at + 1 :]]
    end = next((i for i, b in enumerate(rest) if _EXC.match(b)), len(rest))
    return not any(_FRAME.match(b) or _CUT_FRAME.match(b) for b in rest[end + 1 :])


def _innermost_first(body: list[str]) -> bool:
    """Are these frames a stack dump (py-spy, faulthandler: innermost frame first) rather than a
    traceback (outermost first)? In a traceback each frame's code line calls the next frame's
    function; in a dump the next frame's code line calls this one's."""
    frames = [
        (i, m["fn"].rsplit(".", 1)[-1]) for i, b in enumerate(body) if (m := _FRAME_FN.match(b))
    ]

    def code(i: int) -> str:
        return body[i + 1] if i + 1 < len(body) and not _FRAME.match(body[i + 1]) else ""

    forward = backward = 0
    for (i, fn), (j, nxt) in zip(frames, frames[1:], strict=False):
        forward += f"{nxt}(" in code(i)
        backward += f"{fn}(" in code(j)
    return backward > forward


def _ends(error: str, body: list[str], moving: frozenset[str]) -> bool:
    """Is `error` among the log's last lines with no progress line after it?"""
    if error not in body:
        return False
    return not any(b in moving for b in body[body.index(error) + 1 :])


def _stats_stall(
    rule: GenericRule, cls: GenericClass, recent: list[LogEvent]
) -> GenericFinding | None:
    """The last stats lines all pending with zero throughput, over `min_s` of their own time."""
    stats = [e for e in recent if e.kind == "stats"]
    run: list[LogEvent] = []
    for ev in reversed(stats):
        if not _pending_zero(ev):
            break
        run.append(ev)
    if len(run) < max(rule.count, 1):
        return None
    first, last = timestamp_s(run[-1].line), timestamp_s(run[0].line)
    span = last - first if first is not None and last is not None else None
    if span is not None and span < rule.min_s:
        return None
    newest = typed(run[0])
    pending = newest.pending if isinstance(newest, StatsLine) else 0.0
    over = f" over {span:.0f} s" if span is not None else ""
    detail = f"{len(run)} stats lines{over} with {pending:.0f} request(s) pending, zero throughput"
    return GenericFinding(cls, rule.label, run[0].line, detail)


def content(line: str) -> str:
    """A record without its timestamp and logger prefix: what repeats when nothing changes."""
    return _PREFIX.sub("", line.strip(), count=1).strip()


def _same_lines(
    rule: GenericRule,
    cls: GenericClass,
    tail: Sequence[str],
    beats: _Beats | None = None,
    tail_times: Sequence[float | None] = (),
) -> GenericFinding | None:
    """The log ends with the same one to three lines over and over (`count` rounds at least);
    a launcher's heartbeat while loading is loading, until the loading deadline. A line's time
    is its own timestamp, else the one its collector gave it (`tail_times`)."""
    times = list(tail_times) + [None] * (len(tail) - len(tail_times))
    kept = [(t.strip(), at) for t, at in zip(tail, times, strict=False) if t.strip()]
    lines = [t for t, _ in kept]
    stamps = [at for _, at in kept]
    body = [content(t) for t in lines]
    for period in (1, 2, 3):
        need = period * max(rule.count, 2)
        if len(body) < need:
            continue
        cycle = body[-period:]
        rounds = 0
        for i in range(len(body) - period, -1, -period):
            if body[i : i + period] != cycle:
                break
            rounds += 1
        if rounds >= rule.count and not any(not c or _near_miss(cls, c) for c in cycle):
            if _one_per_process(lines[-rounds * period :], rule.count):
                return None  # each rank said it once: a broadcast, not a loop
            first = _time(lines[-rounds * period], stamps[-rounds * period])
            last = _time(lines[-1], stamps[-1])
            span = last - first if first is not None and last is not None else None
            if span is None and beats is not None:
                span = beats.span(cycle, rounds)  # a heartbeat's known period
            if span is None or span < rule.min_s:
                # A burst within seconds is no loop; nor is a repetition whose lines carry no
                # time of their own (a compiler's diagnostics, one per kernel; a Rust logger's
                # ISO stamp the reader strips as a collector's): the log cannot show it lasted.
                return None
            if beats is not None and beats.loading(cycle, span, rounds):
                return None
            line = tail[-1].strip()
            return GenericFinding(cls, rule.label, line, f"{rounds} times in a row at the end")
    return None


def _time(line: str, collected: float | None) -> float | None:
    own = timestamp_s(line)
    return own if own is not None else collected


def _one_per_process(run: Sequence[str], count: int) -> bool:
    """Do the repeated lines come from different processes, none of which repeats `count`
    times? Eight ranks logging the same line once each (vLLM's `(Worker pid=N)`, SGLang's `TP3`,
    torch's `[rank3]:` tags) is one event seen eight times; a loop is one process going round."""
    who = [who_of(line) for line in run]
    if not all(who):
        return False
    return max(collections.Counter(who).values()) < count


@dataclass(frozen=True)
class ClassVerdict:
    """What the generic layer concludes: the class shown first (data order), the state, all."""

    primary: GenericFinding
    state: str
    findings: tuple[GenericFinding, ...]


def class_verdict(findings: Sequence[GenericFinding]) -> ClassVerdict | None:
    """The first class found is the verdict; a crash anywhere makes the state `dead`."""
    if not findings:
        return None
    dead = any(f.cls.state == "dead" for f in findings)
    return ClassVerdict(findings[0], "dead" if dead else findings[0].cls.state, tuple(findings))
