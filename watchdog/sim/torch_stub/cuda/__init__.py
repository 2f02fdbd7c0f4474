"""Stand-in for `torch/cuda/__init__.py`: `synchronize` never returns while a kernel spins."""

from __future__ import annotations

import threading
import time


def synchronize(device: int | None = None, stop: threading.Event | None = None) -> None:
    """Wait for a kernel that never finishes (the GB300 TRTLLM attention deadlock's stack).

    Real `torch.cuda.synchronize` spins in the driver; the simulator sleeps in short steps so
    it does not burn a CPU on small test machines. Returns only when `stop` is set.
    """
    del device
    while stop is None or not stop.is_set():
        time.sleep(0.05)
