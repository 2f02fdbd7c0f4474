"""The root cause a log names under its verdict: which CUDA error and call, which missing
header, library or tool, which communicator set-up stage, which engine loop died of what.

A signature or a generic class says *what* failed (crashed, engine death, a JIT build, a
collective); this module reads the same lines once more for *why*, in six general readings:

- `cuda`: a fatal CUDA error in any engine's format, with its name and the call that returned it;
- `toolchain`: a JIT build that failed on a missing header, library or tool, with the package
  that provides it;
- `collective_setup`: a communicator that never came up (NCCL init, NVSHMEM bootstrap or its
  transport's connect, a rendezvous), with the stage;
- `transport`: the transport under a collective or a KV transfer that failed (NCCL's IB plugin,
  RDMA verbs, UCX, NIXL, NVSHMEM's IB transports: core/judge/transport.py);
- `engine_loop`: an engine's request loop that died, with the first exception in it;
- `signal`: a fatal signal the server's own handler reported, with where its frames fault
  (core/judge/fatalsignal.py).

Each reading has its module: core/judge/cudacause.py, toolchaincause.py, setupcause.py,
transport.py, loopdeath.py and fatalsignal.py. The first cause in log order wins: the error that
killed the loop comes before the errors its teardown logs (an illegal address freeing memory at
exit is a decoy). Pure: lines in, a Cause out.
"""

from __future__ import annotations

from collections.abc import Sequence

from watchdog.core.judge.cause import Cause
from watchdog.core.judge.cudacause import cuda_cause
from watchdog.core.judge.fatalsignal import SIGNAL_FIX, signal_reading
from watchdog.core.judge.generic import after_progress
from watchdog.core.judge.loopdeath import (
    LOOP_FIX,
    LOOP_SPAN,
    LOOP_TIMEOUT_FIX,
    first_exception,
    loop_name,
    loop_said,
    loop_timeout,
)
from watchdog.core.judge.setupcause import setup_cause
from watchdog.core.judge.toolchaincause import toolchain_cause
from watchdog.core.judge.transport import transport_reading_at
from watchdog.core.model import LogEvent

__all__ = ["Cause", "cause_json", "cause_of", "event_lines", "print_cause", "root_cause"]


def root_cause(lines: Sequence[str]) -> Cause | None:
    """The root cause the lines name, first in log order; an engine loop's death names the
    first specific cause or exception around it."""
    loop: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        name = loop_name(line)
        if name is not None and loop is None:
            loop = (i, name)
        specific = (
            toolchain_cause(line)
            or setup_cause(lines, i)
            or _transport(lines, i)
            or cuda_cause(line)
            or _signal(lines, i)
        )
        if specific is not None:
            return _in_loop(loop[1], specific) if loop is not None else specific
    if loop is None:
        return None
    i, name = loop
    exc = first_exception(lines[i:])
    said = loop_said(lines[i])
    if exc is None and said:  # the loop's own line carries the exception
        return Cause("engine_loop", f"{name} died: {said[:200]}", LOOP_FIX, lines[i])
    # The traceback a chained exception printed first (`The above exception was the direct
    # cause`) lies above the loop's frame: it is read too.
    waited = loop_timeout(lines[max(0, i - LOOP_SPAN) : i + LOOP_SPAN], exc)
    if waited is not None:
        return Cause("engine_loop", f"{name} died: {waited}", LOOP_TIMEOUT_FIX, lines[i])
    if exc is None:
        return Cause(
            "engine_loop",
            f"{name} died; its first exception is not in the log (cause unknown: the engine's "
            "full log or the process's stacks name it)",
            LOOP_FIX,
            lines[i],
        )
    return Cause("engine_loop", f"{name} died: {exc[:200]}", LOOP_FIX, lines[i])


def _signal(lines: Sequence[str], i: int) -> Cause | None:
    """A fatal signal the server's own handler reported (core/judge/fatalsignal.py)."""
    got = signal_reading(lines, i)
    return None if got is None else Cause("signal", got.summary, SIGNAL_FIX, got.line)


def _transport(lines: Sequence[str], i: int) -> Cause | None:
    """A transport's own error line (core/judge/transport.py): which transport, what failed."""
    got = transport_reading_at(lines, i)
    return None if got is None else Cause("transport", got.summary, got.fix, lines[i])


def _in_loop(name: str, cause: Cause) -> Cause:
    return Cause(cause.kind, f"{name} died: {cause.summary}", cause.fix, cause.line, cause.stage)


def event_lines(events: Sequence[LogEvent]) -> list[str]:
    """The lines of the events after the server's last progress, each traceback's exception
    line in its place (a handled error the server moved past is no cause)."""
    out: list[str] = []
    for ev in after_progress(events):
        out.append(ev.line)
        exc = ev.fields.get("exception") if ev.kind == "stack" else None
        if exc and exc != ev.line:
            out.append(str(exc))
    return out


def cause_of(events: Sequence[LogEvent]) -> Cause | None:
    """The root cause the log's events name (replay and the live watch alike)."""
    return root_cause(event_lines(events))


_UNKNOWN = "unknown: the log shows the failure, not its cause"


def cause_json(cause: Cause | None, generic: bool) -> dict[str, str] | None:
    """`replay --json`'s `cause`: the root cause, or (under a generic class) `unknown`."""
    if cause is None:
        return {"kind": "unknown", "summary": _UNKNOWN} if generic else None
    return {
        "kind": cause.kind,
        "summary": cause.summary,
        "stage": cause.stage,
        "line": cause.line.strip(),
        "fix": cause.fix,
    }


def print_cause(cause: Cause | None, generic: bool) -> None:
    """`replay`'s cause lines under the verdict; under a generic class an unknown cause is
    said so (the class's `what would name the cause` line names the live evidence)."""
    if cause is None:
        if generic:
            print(f"  root cause: {_UNKNOWN}")
        return
    print(f"  root cause: {cause.text()}")
    print(f"  cause line: {cause.line.strip()[:300]}")
    print(f"  cause fix: {cause.fix}")
