"""NCCL RAS's JSON report (NCCL v2.29.7-1 `src/ras/client_support.cc` jsonWrite*, commit
b91894bd) as data, and what it says about a hang: dead, unresponsive and lagging ranks.

Pure: text in, findings out; the query itself is sources/nccl_ras.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

MAX_BEHIND = 64  # ranks behind their peers kept per report: bounds the exported series


class RasError(Exception):
    """The RAS service could not be queried; the message says why."""


@dataclass(frozen=True)
class RasRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    counts: dict[str, int]  # collectives completed, by operation (AllReduce, AllGather, ...)
    async_error: int = 0
    abort: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class RasMissing:
    rank: int
    host: str
    unresponsive: bool
    dead: bool


@dataclass(frozen=True)
class RasComm:
    hash: str
    size: int
    ranks: tuple[RasRank, ...] = ()
    missing: tuple[RasMissing, ...] = ()


@dataclass(frozen=True)
class RasReport:
    nccl_version: str
    comms: tuple[RasComm, ...] = field(default_factory=tuple)


# NCCL 2.28.x writes a missing rank's `"nvml_dev": N` without the comma before `"status"`
# (client_support.cc jsonWriteMissingRank @ v2.28.9-1; fixed by v2.29.2-1): repaired here.
_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d+)\n(\s*"status": \{)')


def parse_report(text: str) -> RasReport:
    """The JSON report of `SET FORMAT json` + `STATUS` (client_support.cc jsonWrite*)."""
    try:
        doc = json.loads(_MISSING_COMMA.sub(r"\1,\n\2", text))
        comms = tuple(_comm(c) for c in doc.get("communicators", []))
        return RasReport(str(doc.get("nccl_version", "")), comms)
    except RecursionError as e:  # a peer's `[[[[...` 100 000 deep
        raise RasError("unexpected RAS report (JSON nested too deeply)") from e
    except OverflowError as e:  # `"size": 1e400` is float infinity, no integer
        raise RasError(f"unexpected RAS report (a number out of range: {e})") from e
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise RasError(f"unexpected RAS report ({e}); JSON reports need NCCL >= 2.28.9") from e


def _comm(c: dict[str, Any]) -> RasComm:
    ranks = tuple(
        RasRank(
            int(r["rank"]),
            str(r.get("host", "")),
            int(r.get("pid", -1)),
            int(r.get("cuda_dev", -1)),
            {str(k): int(v) for k, v in r.get("collective_counts", {}).items()},
            int(r.get("status", {}).get("async_error", 0)),
            bool(r.get("status", {}).get("abort_flag", False)),
        )
        for r in c.get("ranks", [])
    )
    missing = tuple(
        RasMissing(
            int(m["rank"]),
            str(m.get("host", "")),
            bool(m.get("status", {}).get("unresponsive", False)),
            bool(m.get("status", {}).get("considered_dead", False)),
        )
        for m in c.get("missing_ranks", [])
    )
    return RasComm(str(c["hash"]), int(c["size"]), ranks, missing)


def uncounted(report: RasReport, comm: RasComm) -> bool:
    """Are the op counts of `comm` unreliable? On a single-node communicator NCCL >= 2.27 leaves
    every rank's count at 0 (NVIDIA/nccl#2021: opCount not increasing in single-node comms), so
    "0 ops" there is no sign that a rank never launched."""
    hosts = {r.host for r in comm.ranks} | {m.host for m in comm.missing}
    if len(hosts) != 1 or any(r.total for r in comm.ranks):
        return False
    try:
        major, minor = (int(x) for x in report.nccl_version.split(".")[:2])
    except ValueError:
        return True  # an unknown version: do not read 0 as "never launched" either
    return (major, minor) >= (2, 27)


def analyse(report: RasReport) -> list[str]:
    """Evidence lines: dead and unresponsive ranks, and ranks behind their peers' collectives."""
    out: list[str] = []
    for comm in report.comms:
        where = f"NCCL communicator {comm.hash} ({comm.size} ranks)"
        for m in comm.missing:
            state = "considered dead" if m.dead else "unresponsive" if m.unresponsive else "missing"
            out.append(f"{where}: rank {m.rank} on {m.host or 'unknown host'} is {state}")
        if len(comm.ranks) < 2:
            continue
        if uncounted(report, comm):
            out.append(
                f"{where}: collective counts read 0 on a single-node communicator; NCCL >= 2.27 "
                "does not count them there (NVIDIA/nccl#2021), so RAS cannot show a rank behind"
            )
        peak = max(r.total for r in comm.ranks)
        behind = sorted((r for r in comm.ranks if r.total < peak), key=lambda r: r.rank)
        if behind and len(behind) < len(comm.ranks):
            for r in behind[:8]:
                out.append(
                    f"{where}: rank {r.rank} on {r.host} stopped at collective #{r.total}; "
                    f"its peers are at #{peak}"
                )
        for r in comm.ranks:
            if r.async_error or r.abort:
                out.append(f"{where}: rank {r.rank} reports async error {r.async_error}"
                           f"{' and was aborted' if r.abort else ''}")  # fmt: skip
    return out


def findings(report: RasReport, local_hosts: Collection[str] = ()) -> dict[str, Any]:
    """The report as bounded figures: ranks per state, ranks behind their peers (by how many
    collectives), and pid -> collectives completed for the ranks on this host."""
    counts = {"unresponsive": 0, "dead": 0, "behind": 0, "async_error": 0}
    behind: dict[int, int] = {}
    local: dict[str, int] = {}
    for comm in report.comms:
        for m in comm.missing:
            counts["dead" if m.dead else "unresponsive"] += 1
        peak = max((r.total for r in comm.ranks), default=0)
        counted = len(comm.ranks) > 1 and not uncounted(report, comm)
        lagging = [r for r in comm.ranks if r.total < peak] if counted else []
        if len(lagging) < len(comm.ranks):
            for r in lagging:
                behind[r.rank] = max(behind.get(r.rank, 0), peak - r.total)
        counts["behind"] += len(lagging) if len(lagging) < len(comm.ranks) else 0
        counts["async_error"] += sum(1 for r in comm.ranks if r.async_error or r.abort)
        for r in comm.ranks:  # an uncounted 0 is no progress figure for per-rank progress
            if r.host in local_hosts and r.pid > 0 and not uncounted(report, comm):
                local[str(r.pid)] = local.get(str(r.pid), 0) + r.total
    kept = sorted(behind.items())[:MAX_BEHIND]
    return {"counts": counts, "behind": [[rank, n] for rank, n in kept], "local": local}
