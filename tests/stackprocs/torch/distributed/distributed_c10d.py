"""Stand-in for torch/distributed/distributed_c10d.py: a collective whose peers never arrive."""

from __future__ import annotations

import threading


def barrier() -> None:
    """Wait for peer ranks that never come, as a rank does in an NCCL hang."""
    print("ready", flush=True)
    threading.Event().wait()


def all_reduce(tensor: list[float]) -> list[float]:
    """Named like torch.distributed.all_reduce; blocks in barrier()."""
    barrier()
    return tensor
