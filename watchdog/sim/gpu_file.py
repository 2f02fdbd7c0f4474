"""Writes the simulated GPU's samples as JSON Lines, the `file:` GPU backend's input format.

One line per GPU per tick: `{"ts", "gpu", "sm", "dram", "power_w", "power_limit_w", "procs",
"pids", "uuid", "name", "cc", "sm_clock_mhz"}`. The profile names the shape NVML would show
(loading, busy, spin = the GB300 deadlock's 99 % SM / 0 % DRAM, idle, gone = no compute process).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Sequence

# (sm, dram, power_w) ranges per profile; spin matches flashinfer #2939 ("99% SM, 0% memory").
# Its power is what spinning kernels drew on a real H200, 0.19-0.23 of the board limit (136-164 W
# of 700 W): a kernel that never returns draws little, and the watchdog's compute-bound check
# (gpu_spin_power_max_ratio) rejects a "spin" drawing near the limit.
POWER_LIMIT_W = 1400.0  # GB300's board power limit, the simulated GPU's
PROFILES: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "loading": ((0.04, 0.06), (0.01, 0.03), (180.0, 220.0)),
    "busy": ((0.70, 0.90), (0.40, 0.70), (700.0, 900.0)),
    "spin": ((0.99, 0.99), (0.0, 0.0), (0.19 * POWER_LIMIT_W, 0.23 * POWER_LIMIT_W)),
    "idle": ((0.0, 0.0), (0.0, 0.0), (150.0, 160.0)),
    "gone": ((0.0, 0.0), (0.0, 0.0), (120.0, 130.0)),
}


class GpuFileWriter:
    """Appends one sample per GPU every `interval` seconds until stopped."""

    def __init__(
        self,
        path: str,
        gpus: int,
        pids: Callable[[int], Sequence[int]],
        name: str = "NVIDIA GB300",
        cc: str = "10.3",
        interval: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = path
        self._gpus = gpus
        self._pids = pids
        self._name = name
        self._cc = cc
        self._interval = interval
        self._clock = clock
        self._rng = random.Random(0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.profile = "loading"
        self.per_gpu: dict[int, str] = {}  # GPU index -> profile, over `profile` for that GPU

    def sample(self, gpu: int) -> dict[str, object]:
        """One sample for one GPU under the current profile."""
        profile = self.per_gpu.get(gpu, self.profile)
        sm_r, dram_r, power_r = PROFILES[profile]
        pids = [] if profile == "gone" else list(self._pids(gpu))
        return {
            "ts": round(self._clock(), 3),
            "gpu": gpu,
            "sm": round(self._rng.uniform(*sm_r), 3),
            "dram": round(self._rng.uniform(*dram_r), 3),
            "power_w": round(self._rng.uniform(*power_r), 1),
            "power_limit_w": POWER_LIMIT_W,
            "procs": len(pids),
            "pids": pids,
            "uuid": f"GPU-sim-{gpu}",
            "name": self._name,
            "cc": self._cc,
            "sm_clock_mhz": 1965,
        }

    def write_once(self) -> None:
        """Append one line per GPU (opened per tick so readers may rotate or truncate the file)."""
        lines = "".join(json.dumps(self.sample(g)) + "\n" for g in range(self._gpus))
        with open(self._path, "a", encoding="utf-8") as fh:
            fh.write(lines)

    def start(self) -> None:
        """Start the background writer thread."""
        self._thread = threading.Thread(target=self._run, name="sim-gpu-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop writing (the file keeps what was written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
            # A test may remove the directory while the sim shuts down.
            with contextlib.suppress(OSError):
                self.write_once()
            self._stop.wait(self._interval)
