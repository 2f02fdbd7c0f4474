"""The simulated engine's startup phases, printed in vLLM's formats with compressed durations.

Line formats from vLLM's model_executor/model_loader/weight_utils.py (_BAR_FORMAT),
default_loader.py, gpu_model_runner.py and v1/engine/core.py, and the h_*/g_vllm16301
samples: the weight-loading bar (no process prefix, `\\n`-terminated bar_format), `Loading
weights took`, `Model loading took ... GiB memory and ... seconds`, torch.compile lines, the
CUDA-graph capture bar, `Graph capturing finished`, `init engine (...) took`. slow_loading reads
a real file per shard so the process's read counters grow while the bar advances slowly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from watchdog.sim.config import SimConfig
from watchdog.sim.output import Bar, Console, format_loading, format_meter

CAPTURE_SIZES = 67  # number of CUDA-graph sizes in h_vllm19794
SHARD_BYTES = 8 * 1024 * 1024


class Startup:
    """Prints the phases of an EngineCore start; `phase` tells the GPU writer what to draw."""

    def __init__(
        self,
        cfg: SimConfig,
        console: Console,
        proc: str,
        workdir: str,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._con = console
        self._proc = proc
        self._workdir = workdir
        self._sleep = sleep
        self._clock = clock
        self._pid = os.getpid()

    def log(self, where: str, msg: str, level: str = "INFO") -> None:
        """One engine log line with vLLM's prefix."""
        self._con.vllm(self._proc, self._pid, level, where, msg)

    def run(self) -> None:
        """All phases in order; the total is about --startup-s (slow_loading: shards x shard-s)."""
        self.load_weights()
        t1 = self._clock()
        self.compile()
        self.capture()
        took = self._clock() - t1
        msg = f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds"
        self.log("core.py:172", msg)

    def load_weights(self) -> None:
        """The safetensors shard bar, then the two loading milestones."""
        took = self.shard_bar()
        self.log("default_loader.py:267", f"Loading weights took {took:.2f} seconds")
        self.log(
            "gpu_model_runner.py:2602",
            f"Model loading took 15.0366 GiB memory and {took + 0.2:.6f} seconds",
        )

    def compile(self) -> None:
        """torch.compile milestones as in g_vllm16301 / h_vllm19794."""
        cache = os.path.join(self._workdir, "torch_compile_cache", "e8c79b34a0", "rank_0_0")
        self.log("backends.py:416", f"Using cache directory: {cache} for vLLM's torch.compile")
        span = self._cfg.startup_s * 0.2
        self._sleep(span / 2)
        self.log("backends.py:426", f"Dynamo bytecode transform time: {span / 2:.2f} s")
        self._sleep(span / 2)
        self.log("backends.py:193", f"Compiling a graph for general shape takes {span / 2:.2f} s")
        self.log("monitor.py:34", f"torch.compile takes {span:.2f} s in total")
        self.log("kv_cache_utils.py:716", "GPU KV cache size: 251,920 tokens")
        self.log(
            "kv_cache_utils.py:720", "Maximum concurrency for 40,960 tokens per request: 6.15x"
        )

    def capture(self) -> None:
        """The CUDA-graph capture bar (tqdm, stderr, `\\r` redraws) and its milestone."""
        bar = Bar(self._con, "err")
        step = self._cfg.startup_s * 0.3 / CAPTURE_SIZES
        start = self._clock()
        bar.draw(format_meter(0, CAPTURE_SIZES, 0.0, "Capturing CUDA graphs"))
        for n in range(1, CAPTURE_SIZES + 1):
            self._sleep(step)
            bar.draw(format_meter(n, CAPTURE_SIZES, self._clock() - start, "Capturing CUDA graphs"))
        bar.close()
        secs = int(round(self._clock() - start))
        self.log(
            "gpu_model_runner.py:2196", f"Graph capturing finished in {secs} secs, took 0.84 GiB"
        )

    def shard_bar(self) -> float:
        """The safetensors shard bar (reading a real file per shard when loading is slow); the
        seconds it took."""
        cfg = self._cfg
        slow = cfg.scenario == "slow_loading"
        per_shard = cfg.shard_s if slow else cfg.startup_s * 0.4 / cfg.shards
        shard_file = self._make_shard_file() if slow else None
        start = self._clock()
        self._con.write(format_loading(0, cfg.shards, 0.0) + "\n", "err")
        for n in range(1, cfg.shards + 1):
            if shard_file:
                self._read_uncached(shard_file)
            self._sleep(per_shard)
            self._con.write(format_loading(n, cfg.shards, self._clock() - start) + "\n", "err")
        return self._clock() - start

    def _make_shard_file(self) -> str:
        path = os.path.join(self._workdir, "model-00001-of-00001.safetensors")
        with open(path, "wb") as fh:
            fh.write(os.urandom(SHARD_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        return path

    def _read_uncached(self, path: str) -> None:
        """Drop the file from the page cache, then read it, so /proc/PID/io read_bytes grows."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)
