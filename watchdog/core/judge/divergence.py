"""Ranks that diverged: one rank in a collective its peers never reach (pure).

PyTorch's NCCL watchdog logs, on every rank whose collective timed out, `[Rank R] Watchdog caught
collective operation timeout: WorkNCCL(SeqNum=S, OpType=T, ...)` (torch/csrc/distributed/c10d/
ProcessGroupNCCL.cpp `checkTimeout`). When all ranks report the same S and T they all wait in the
same collective (a link or a rank that died: `collective_hang`). When they differ, the ranks took
different paths: the rank with the lowest sequence number is behind, and it is the one to read
(vllm #23448: rank 3 at 5729 while rank 0 is at 5730; nccl #1409: BROADCAST on rank 7 and
ALLREDUCE on rank 3 at the same sequence number). The finding is one derived line that the
`rank_divergence` signature's log rule matches, so it is evidence like any other log line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TIMEOUT = re.compile(
    r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
)
PREFIX = "ranks diverged: "


def divergence(lines: Iterable[str]) -> str | None:
    """One line naming the ranks that disagree on their collective, or None when they agree."""
    seen: dict[int, tuple[int, str]] = {}
    for line in lines:
        if "Watchdog caught collective" not in line:
            continue
        m = _TIMEOUT.search(line)
        if m is not None:
            seen.setdefault(int(m.group("rank")), (int(m.group("seq")), m.group("op")))
    if len(seen) < 2 or len(set(seen.values())) < 2:
        return None
    where = ", ".join(f"rank {r} at SeqNum {s} ({op})" for r, (s, op) in sorted(seen.items()))
    low = min(s for s, _ in seen.values())
    behind = sorted(r for r, (s, _) in seen.items() if s == low)
    if len({s for s, _ in seen.values()}) > 1:
        who = ", ".join(f"rank {r}" for r in behind)
        return f"{PREFIX}{where}; {who} is behind its peers and is the one to read"
    return f"{PREFIX}{where}; the ranks are in different collectives at the same step"
