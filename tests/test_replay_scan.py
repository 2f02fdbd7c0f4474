"""`replay`'s sparse read of a plain log (logs.scan_bytes) finds what the full read finds.

The full read (read_log: every line split, cleaned and kept; open_operations over all of them)
and scan_bytes (prefilters for the events, the operations' lines and glued records) run over the
real samples, the corpus and the noise of tests/test_logscan.py; events, the record count and
the open operations must be the same (an operation's index is a position either way: a line
number in one, a byte offset in the other, so only their order is compared).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.fakes import NOISE, SPAN, STACKS, workload
from watchdog.commands.replaylog import read_log
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.state.openops import OpenOp, open_operations
from watchdog.sources.logs import scan_bytes

HERE = Path(__file__).parent
SIGS = load_signatures()
OPS = load_ops()
# Open operations that stay open: a cubin fetch and an NCCL init with no end, after tqdm bars
# that glue records onto their line, ANSI codes, and progress lines before and after.
OPEN = (
    b"Processed prompts: 100%|##| 2/2 [00:02<00:00, 1.00it/s]2026-11-30 08:08:29,185 - INFO - "
    b"cubin_loader.py:90 - flashinfer.jit: Fetching a.cubin from https://edge.example/a\n"
    b"INFO 11-30 08:08:30 [loggers.py:1] Engine 000: Avg prompt throughput: 5.0 tokens/s, "
    b"Avg generation throughput: 7.0 tokens/s\n"
    b"node1:1234:1290 [3] NCCL INFO comm 0x5a1f rank 3 nranks 8 cudaDev 3 busId 1000 - Init START\n"
    b"\x1b[32mINFO\x1b[0m 11-30 08:09:30 [x.py:1] still here\n"
    b"Loading: 50%|# | 1/2 [00:01<00:01]\x1b[0mINFO 11-30 08:10:00 [x.py:2] glued after ANSI\n"
)


def unindexed(ops: list[OpenOp]) -> list[OpenOp]:
    return [dataclasses.replace(o, index=0) for o in ops]


def same(data: bytes) -> None:
    records, events = read_log(data, SIGS)
    full = open_operations(records, OPS)
    scan = scan_bytes(data, SIGS, ops=OPS)
    assert scan.events == events
    assert scan.records == len(records)
    assert unindexed(scan.ops) == unindexed(full)
    assert [o.index for o in scan.ops] == sorted(o.index for o in scan.ops)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scan_finds_what_the_full_read_finds_on_samples_and_noise(seed: int) -> None:
    data = workload(seed) + OPEN + STACKS + SPAN + b"".join(NOISE)
    records, _ = read_log(data, SIGS)
    assert len(open_operations(records, OPS)) >= 2  # the comparison has operations to compare
    same(data)


@pytest.mark.parametrize(
    "path",
    sorted((HERE / "data" / "corpus").glob("*.log"))
    + sorted((HERE / "data" / "logs").glob("*.log")),
    ids=lambda p: p.name,
)
def test_scan_finds_what_the_full_read_finds_on_each_real_log(path: Path) -> None:
    same(path.read_bytes())


def test_open_for_is_measured_to_the_newest_stamp_of_its_format() -> None:
    # the newest stamp of the fetch's format is 10 minutes later, behind 50 unstamped lines
    later = b"2026-11-30 08:18:29,000 - INFO - x.py:1 - later\n"
    tail = b'(APIServer pid=1) INFO:     1.2.3.4:5 - "GET /health HTTP/1.1" 200 OK\n' * 50
    data = OPEN + later + b"INFO 11-30 09:00:00 [x.py:3] another format\n" + tail
    ops = {o.op.id: o for o in scan_bytes(data, SIGS, ops=OPS).ops}
    assert ops["cubin_fetch"].open_s == 600.0
    assert ops["cubin_fetch"].progress_after  # the stats line after it shows progress
    assert ops["nccl_init"].open_s is None and not ops["nccl_init"].progress_after
    same(data)
