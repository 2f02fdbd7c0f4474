"""py-spy target: a rank stuck in a simulated collective (`all_reduce` -> `barrier`).

The frames live in this folder's `torch/distributed/distributed_c10d.py`, so the stack shows the
same module path a real NCCL hang shows. Prints "ready" once blocked.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch.distributed.distributed_c10d import all_reduce  # noqa: E402 (after the path fix)

if __name__ == "__main__":
    all_reduce([1.0])
