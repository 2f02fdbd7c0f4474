"""NCCL's own error trail: a `NCCL WARN` and the `file.cc:N -> R` lines it returns through (pure).

NCCL logs no traceback. When a call fails, NCCLCHECK and its siblings (src/include/checks.h,
NVIDIA/nccl v2.7-v2.28) print `NCCL INFO <file>:<line> -> <ncclResult_t>` at every function the
error returns through, after the `NCCL WARN` that says what failed. A trail that reaches the
communicator's initialisation (src/init.cc ncclCommInitRank*, src/bootstrap.cc) is a set-up
failure: the communicator never comes up. So is the proxy service failing a set-up operation
for a peer (src/proxy.cc proxyServiceInitOp: `[Proxy Service N] Failed to execute operation
Connect from rank R, retcode C`; the set-up operations are Init, SharedInit, Setup and Connect).
A trail that stops below init.cc, through transport or enqueue code, is read by the transport
and CUDA readers instead; a WARN alone is no failure (the libibverbs fallback to sockets warns).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# src/include/nccl.h.in ncclResult_t; 7 (ncclInProgress) is a non-blocking call still running.
_RESULTS = {
    "1": "unhandled CUDA error",
    "2": "system error",
    "3": "internal error",
    "4": "invalid argument",
    "5": "invalid usage",
    "6": "remote error",
}
# NCCL prints the trail at INFO; forks such as Alibaba's ACCL print it at WARN, with the path.
_TRAIL = re.compile(
    r"NCCL (?:INFO|WARN) (?:\S*/)?(?P<file>(?:init|bootstrap)\.cc):\d+ -> (?P<r>[1-6])\b"
)
_TRAIL_LINE = re.compile(r"^\S+\.cc:\d+ -> \d+")  # a WARN that is itself a trail line
_PROXY_OP = re.compile(
    r"NCCL WARN \[Proxy Service \d+\] Failed to execute operation "
    r"(?P<op>Init|SharedInit|Setup|Connect) from rank (?P<rank>\d+), retcode (?P<r>\d+)"
)
_WARN = re.compile(r"NCCL WARN (?P<msg>\S.*)$")
_BACK = 16  # lines above the trail's init.cc frame to look for the WARN that began it


@dataclass(frozen=True)
class TrailReading:
    """What failed (the WARN's words and the result) and the stage it failed in."""

    summary: str
    stage: str  # bootstrap | init
    line: str


def nccl_trail(lines: Sequence[str], i: int) -> TrailReading | None:
    """The set-up failure NCCL's trail at line `i` shows, or None."""
    line = lines[i]
    if "NCCL " not in line:
        return None
    if m := _PROXY_OP.search(line):
        what = _RESULTS.get(m["r"], f"result {m['r']}")
        warn = _warn_before(lines, i)
        said = f"{warn}; " if warn else ""
        return TrailReading(
            f"NCCL {what}: {said}the proxy could not {m['op']} for rank {m['rank']}", "init", line
        )
    m = _TRAIL.search(line)
    if m is None:
        return None
    if i > 0 and _TRAIL.search(lines[i - 1]):
        return None  # the trail's first init.cc line speaks for it
    warn = _warn_before(lines, i)
    what = _RESULTS[m["r"]]
    stage = "bootstrap" if m["file"] == "bootstrap.cc" else "init"
    said = f": {warn}" if warn else ""
    return TrailReading(f"NCCL {what} while initialising the communicator{said}", stage, line)


def _warn_before(lines: Sequence[str], i: int) -> str:
    for line in reversed(lines[max(0, i - _BACK) : i]):
        if (m := _WARN.search(line)) and not _TRAIL_LINE.match(m["msg"]):
            return m["msg"].strip()[:160]
    return ""
