"""What a log was in the middle of when it stopped: operations started and never finished (pure).

A pasted log of a hung server often ends inside something: a cubin fetch with no completion,
a communicator init with no `Init COMPLETE`, a JIT build with no result. That is the cause if
the server is stuck now, not proof that it is: `replay LOG` reports it as such, and only
`replay --stuck` (the operator says the server is hung) or a stall the live watchdog measured
turns it into a verdict. The operations are data (openops.toml).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from watchdog.core.knowledge.opdefs import OpDef


@dataclass(frozen=True)
class OpenOp:
    """One operation the log started and never finished."""

    op: OpDef
    line: str  # the line that started it
    index: int  # its position in the log: line number, or byte offset (replay of a file)
    who: str  # process or rank, e.g. "Worker_TP1 pid=7", "TP0", "rank 3", "" when unknown
    since: str | None  # its timestamp as the log wrote it
    open_s: float | None  # seconds from its start to the log's last timestamp
    progress_after: bool  # the server made progress after it started: not what blocks it
    peers_done: tuple[str, ...] = ()  # other processes that finished the same operation

    @property
    def signature(self) -> str | None:
        if self.peers_done and self.op.behind_signature:
            return self.op.behind_signature
        return self.op.signature or None

    def describe(self) -> str:
        """One line: what, since when, from whom, for how long."""
        parts = [f"{self.op.what} started"]
        if self.since:
            parts.append(f"at {self.since}")
        if self.who:
            parts.append(f"by {self.who}")
        text = " ".join(parts) + " and never finished"
        if self.open_s is not None:
            text += f" (open for {self.open_s:.0f} s by the log's own clock)"
        if self.peers_done:
            text += f", while {', '.join(self.peers_done)} finished it: this one is behind"
        return text


_WHO = (
    re.compile(r"^\((?P<v>[A-Za-z][\w.:-]* pid=\d+)\)"),  # vLLM `(Worker_TP1 pid=7) `
    re.compile(r"^\[\d{4}-\d{2}-\d{2} [\d:]+(?P<v>(?: [A-Z]{2}\d+)+)\]"),  # SGLang ` TP0`
    re.compile(r"^(?P<v>[\w.-]+:\d+:\d+ \[\d+\]) NCCL "),  # NCCL `host:pid:tid [dev] `
    re.compile(r"^\[(?P<v>rank\d+)\]"),  # torch.distributed
    # TensorRT-LLM's per-rank logger: `[TRT-LLM] [I] [_torch  ] [RANK 6] ...` (PR #13998 log)
    re.compile(r"^(?:\d+: )?(?:\[[^\]]*\] ){0,4}\[(?P<v>RANK \d+)\]"),
)
_TIMES = (
    (re.compile(r"\b(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})"), "%Y-%m-%d %H:%M:%S"),
    (
        re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d{2}-\d{2} \d{2}:\d{2}:\d{2})"),
        "%m-%d %H:%M:%S",
    ),
    # TensorRT-LLM: `[12/20/2025-04:21:10] [TRT-LLM] [I] ...`
    (re.compile(r"\[(\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2})\]"), "%m/%d/%Y-%H:%M:%S"),
)
# Lines that show the server moving: an operation open before one of them is not what blocks it.
# Not uvicorn's `"POST /v1/... HTTP/1.1" 200`: it is logged when a streamed response starts, and
# the API keeps answering 200 while the engine is wedged (spark-vllm-docker #379).
_PROGRESS = re.compile(
    r"(?:Decode batch[.,]|Prefill batch[.,]|generation throughput: (?!0\.0 )\d|"
    r"prompt throughput: (?!0\.0 )\d)"
)


def _stamp(line: str) -> tuple[str, float, int] | None:
    """The line's timestamp as written, as seconds, and which format (formats do not mix)."""
    for n, (pattern, fmt) in enumerate(_TIMES):
        m = pattern.search(line)
        if m is None:
            continue
        text = m.group(1).replace("T", " ") if n == 0 else m.group(1)
        if "%Y" not in fmt:  # vLLM writes no year: any fixed (leap) year orders the lines
            text, fmt = f"2000-{text}", f"%Y-{fmt}"
        try:
            when = datetime.strptime(text, fmt)
        except ValueError:
            continue
        return m.group(1), when.timestamp(), n
    return None


def who_of(line: str) -> str:
    """The process or rank a log line names ("" when none)."""
    for pattern in _WHO:
        m = pattern.match(line)
        if m is not None:
            return m.group("v").strip()
    return ""


_UNNAMED = re.compile(r"\(\?P<\w+>")  # named groups repeat across ops: drop their names


def trigger_patterns(ops: Sequence[OpDef]) -> tuple[re.Pattern[str], ...]:
    """Every pattern whose match changes what open_operations finds (a reader prefilters on
    their literals, keeping only the lines that can matter for `operations_in`)."""
    return (_PROGRESS, *(p for op in ops for p in (op.start, op.end, op.fail) if p is not None))


def keep_pattern(ops: Sequence[OpDef]) -> re.Pattern[str] | None:
    """One regex for every start/end line, so a log source keeps them for the classifier."""
    pats = [
        _UNNAMED.sub("(?:", p.pattern)
        for op in ops
        for p in (op.start, op.end, op.fail, op.progress)
        if p is not None
    ]
    return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None


def keep_with_ops(keep: re.Pattern[str] | None, ops: Sequence[OpDef]) -> re.Pattern[str] | None:
    """`keep` widened by every operation's start and end lines (what a log source keeps)."""
    extra = keep_pattern(ops)
    if keep is None or extra is None:
        return keep or extra
    return re.compile(f"{keep.pattern}|{extra.pattern}")


def open_operations(lines: Iterable[str], ops: Sequence[OpDef]) -> list[OpenOp]:
    """The operations started in `lines` and never finished, oldest first."""
    lines = list(lines)
    return operations_in(enumerate(lines), ops, lambda: reversed(lines))


def operations_in(
    items: Iterable[tuple[int, str]],
    ops: Sequence[OpDef],
    backwards: Callable[[], Iterable[str]],
) -> list[OpenOp]:
    """open_operations over only the lines that can matter, with their positions in the log.

    `items` must hold every line that an operation's start, end or fail pattern or the
    progress pattern matches (others change nothing), in order; `backwards` gives all the
    log's lines from the last, read only as far as the newest timestamp of each format an
    open operation needs (`replay` of a large log then never looks at most lines).
    """
    # Open starts in the order they were read, by a running number: (op, index, who, key, line);
    # and each op's open starts, so an end line looks only at its own op's (a long log holds
    # thousands of open starts, and every end line scanned them all).
    started: dict[int, tuple[OpDef, int, str, str, str]] = {}
    by_op: dict[int, list[int]] = {}  # id(op) -> its open starts' numbers, oldest first
    finished: dict[str, set[str]] = {}  # op id -> the processes that finished one
    last_progress = number = -1
    for i, line in items:
        if _PROGRESS.search(line):
            last_progress = i
        who: str | None = None
        for op in ops:
            m = op.end.search(line) or (op.fail.search(line) if op.fail is not None else None)
            if m is not None:
                who = who_of(line) if who is None else who
                _close(started, by_op.get(id(op)), m, who)
                finished.setdefault(op.id, set()).add(who)
            m = op.start.search(line)
            if m is not None:
                who = who_of(line) if who is None else who
                number += 1
                started[number] = (op, i, who, (m.groupdict().get("key") or ""), line)
                by_op.setdefault(id(op), []).append(number)
    last = _LastStamps(backwards)
    out = []
    for op, i, who, _key, line in started.values():
        st = _stamp(line)
        newest = last.get(st[2]) if st is not None else None
        open_s = newest - st[1] if st is not None and newest is not None else None
        out.append(
            OpenOp(
                op=op,
                line=line,
                index=i,
                who=who,
                since=st[0] if st else None,
                open_s=open_s if open_s is None or open_s >= 0 else None,
                progress_after=last_progress > i,
                peers_done=tuple(sorted(w for w in finished.get(op.id, ()) if w and w != who)),
            )
        )
    return out


class _LastStamps:
    """The log's newest timestamp of each format, found by reading back from its end."""

    def __init__(self, backwards: Callable[[], Iterable[str]]) -> None:
        self._backwards = backwards
        self._found: dict[int, float] = {}
        self._lines: Iterator[str] | None = None

    def get(self, fmt: int) -> float | None:
        """The newest stamp of `fmt` (None only if `backwards` lacks the started line)."""
        if self._lines is None:
            self._lines = iter(self._backwards())
        while fmt not in self._found:
            line = next(self._lines, None)
            if line is None:
                return None
            st = _stamp(line)
            if st is not None:
                self._found.setdefault(st[2], st[1])
        return self._found[fmt]


def _close(
    started: dict[int, tuple[OpDef, int, str, str, str]],
    mine: list[int] | None,
    m: re.Match[str],
    who: str,
) -> None:
    """An end (or failure) line closes the newest matching start of its op (`mine`, oldest
    first): same key, else same process, else the newest."""
    if not mine:
        return
    key = m.groupdict().get("key") or ""
    pool = ([j for j in mine if started[j][3] == key] or mine) if key else mine
    pick = next((j for j in reversed(pool) if started[j][2] == who), pool[-1])
    mine.remove(pick)
    del started[pick]


def stuck_cause(open_ops: Sequence[OpenOp]) -> OpenOp | None:
    """The open operation that explains a server stuck now: the newest one that points to a
    signature and after which the server made no progress; None when no such one exists."""
    for op in reversed(open_ops):
        if op.signature and not op.progress_after:
            return op
    return None
