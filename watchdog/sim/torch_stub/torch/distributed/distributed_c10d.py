"""Stand-in for `torch/distributed/distributed_c10d.py`: a collective whose peer never arrives.

A rank waiting on a peer that is stuck elsewhere (a cubin download, a spinning kernel) parks in
`all_reduce` -> `barrier`, as a real NCCL rank does until the NCCL watchdog times out.
"""

from __future__ import annotations

import time


def barrier() -> None:
    """Wait for peer ranks that never come (short sleeps: no CPU burnt on small test hosts)."""
    while True:
        time.sleep(0.05)


def all_reduce(tensor: list[float]) -> list[float]:
    """Named like torch.distributed.all_reduce; blocks in barrier()."""
    barrier()
    return tensor
