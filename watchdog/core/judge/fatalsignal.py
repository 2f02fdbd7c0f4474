"""A server's own fatal-signal report read for its cause: which signal, and the library the
frames under the handler fault in (core/judge/rootcause.py puts it under the verdict).

tritonserver traps SIGSEGV and SIGABRT (triton-inference-server/server src/triton_signal.cc,
v2.43.0 to 2.73): ErrorSignalHandler prints `Signal (N) received.` and boost::stacktrace's frames
(` 0# 0x... in tritonserver`, ` 1# ... in libc.so.6` (the kernel's signal trampoline), then the
code that faulted), and re-raises the signal for a core dump. SIGINT and SIGTERM print the same
line from SignalHandler and exit gracefully: no cause. Pure: lines in, a reading out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_SIGNAL = re.compile(r"(?<![\w(])Signal \((?P<n>\d+)\) received\.")
_GRACEFUL = frozenset({2, 15})  # SIGINT, SIGTERM: SignalHandler, a clean exit
# The Linux x86-64/arm64 numbers (signal(7)) of the signals a crash handler reports.
_NAMES = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}
# boost/stacktrace/detail/frame_decl.hpp to_string: `%2d# NAME-OR-ADDRESS in OBJECT` or
# `... at FILE:LINE`.
_FRAME = re.compile(r"^ ?(?P<i>\d{1,3})# (?P<what>.+?) (?:in|at) (?P<obj>\S+)$")
# Frames that are the handler and the signal trampoline, not the code that faulted.
_HANDLER_OBJ = re.compile(r"(?:^|/)(?:tritonserver|libc\.so[.\d]*|libpthread\.so[.\d]*)$")
_FRAMES_READ = 64  # a boost::stacktrace holds at most this many frames (its default depth)

SIGNAL_FIX = (
    "The server died of a fatal signal in native code: a restart runs the same code and may "
    "crash the same way on the same request. Restart it; if it recurs, undo the last change "
    "of the library the frames name (a backend, a tracing or OpenTelemetry setting, a model "
    "configuration), and resolve the frames' addresses with gdb or addr2line on the core dump "
    "to report it upstream."
)


@dataclass(frozen=True)
class SignalReading:
    """A fatal signal the server reported, with where its frames fault."""

    summary: str
    line: str


def signal_reading(lines: Sequence[str], i: int) -> SignalReading | None:
    """The fatal signal line `i` reports, with the library its frames below fault in."""
    m = _SIGNAL.search(lines[i])
    if m is None or int(m["n"]) in _GRACEFUL:
        return None
    n = int(m["n"])
    name = _NAMES.get(n, f"signal {n}")
    frames = [f for f in map(_FRAME.match, lines[i + 1 : i + 1 + _FRAMES_READ]) if f]
    where = next((f["obj"] for f in frames if not _HANDLER_OBJ.search(f["obj"])), None)
    at = (
        f" in {where.rsplit('/', 1)[-1]} (the first frame below the signal handler, of "
        f"{len(frames)} printed)"
        if where
        else " (no frame below the signal handler names a library)"
    )
    return SignalReading(f"the server died of {name} (signal {n}){at}", lines[i])
