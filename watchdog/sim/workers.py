"""The simulated vLLM `VLLM::Worker_TPn` processes and SGLang's detokenizer: titled children
that idle until told to hang (one rank the cause, the others waiting in a collective)."""

from __future__ import annotations

import os
import signal
import sys
import time

from watchdog.sim import sysutil
from watchdog.sim.config import SimConfig
from watchdog.sim.engine import CUBINS
from watchdog.sim.flashinfer.jit import cubin_loader
from watchdog.sim.torch_stub import cuda
from watchdog.sim.torch_stub.torch.distributed import distributed_c10d


def run_idle_child(title: str) -> int:
    """A titled child that only lives as long as its parent (SGLang's detokenizer)."""
    sysutil.set_title(title)
    sysutil.die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(3600)


def run_worker(cfg: SimConfig, title: str) -> int:
    """Entry point of a `VLLM::Worker_TPn`: idle until told to hang; exits when stdin closes.

    `hang` spins every rank; `SCENARIO RANK` makes RANK the cause (cubin download or spin) and
    every other rank wait for it in all_reduce, as NCCL ranks wait on a stuck peer.
    """
    sysutil.set_title(title)
    sysutil.die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    rank = int(title.rsplit("TP", 1)[-1])
    for line in sys.stdin:
        words = line.split()
        if words == ["hang"]:
            cuda.synchronize()
        elif len(words) == 2:
            worker_hang(cfg, words[0], rank == int(words[1]))
    return 0


def worker_hang(cfg: SimConfig, scenario: str, is_cause: bool) -> None:
    """One worker's part in a rank-level hang."""
    if not is_cause or scenario == "collective_wait":
        distributed_c10d.all_reduce([1.0])
    elif scenario == "kernel_deadlock":
        cuda.synchronize()
    else:
        cubin_loader.configure_logging(sys.stderr, cfg.log_file)
        for name in CUBINS:
            cubin_loader.get_cubin_callback(name.encode(), b"", timeout=cfg.cdn_timeout)
