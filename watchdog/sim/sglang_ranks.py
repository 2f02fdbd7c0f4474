"""SGLang at --tp > 1: one `sglang::scheduler_TP<n>` process per rank, under the launcher.

Rank 0 is the engine link's child (it steps the batch and is SGLang's stats-logging rank,
metrics_reporter.py `is_stats_logging_rank`: attn_tp_rank == 0); ranks 1..n-1 are started here.
Every rank parses the same argv, so each knows the scenario and `--hang-rank`: the cause rank
blocks in the FlashInfer download (or spins), every other rank waits for it in all_reduce.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import psutil

from watchdog.sim import sysutil
from watchdog.sim.config import SimConfig, sglang_scheduler_title
from watchdog.sim.flashinfer.jit import cubin_loader
from watchdog.sim.output import Console
from watchdog.sim.torch_stub import cuda
from watchdog.sim.torch_stub.torch.distributed import distributed_c10d

RANK_HANGS = ("kernel_deadlock", "cubin_download_stall", "collective_wait")


def rank_prefix(cfg: SimConfig, rank: int) -> str:
    """SGLang's log prefix for a scheduler rank: ` TP<rank>` only when tp_size > 1."""
    return f" TP{rank}" if cfg.tp > 1 else ""


def effective_scenario(cfg: SimConfig) -> str:
    """hang_unless_fallback resolved the same way in every rank (all parse the same argv)."""
    if cfg.scenario == "hang_unless_fallback":
        return "healthy" if cfg.trtllm_disabled else "kernel_deadlock"
    return cfg.scenario


def fetch_cubins(cfg: SimConfig) -> bool:
    """The first batch needs TRTLLM-gen FMHA cubins: fetch them through the FlashInfer chain.

    srt/utils/common.py configure_logger (sglang 0.5.23) sets the `flashinfer.jit` logger to
    ERROR, so no `Fetching ...` line ever appears under SGLang.
    """
    from watchdog.sim.engine import CUBINS

    cubin_loader.configure_logging(sys.stderr, cfg.log_file)
    cubin_loader.logger.setLevel(logging.ERROR)
    return all(
        cubin_loader.get_cubin_callback(name.encode(), b"", timeout=cfg.cdn_timeout)
        for name in CUBINS
    )


def rank_hang(cfg: SimConfig, scenario: str, rank: int) -> None:
    """One rank's part in a hang: the cause downloads or spins, the others wait in all_reduce.

    Without a valid --hang-rank, kernel_deadlock spins every rank and the download is rank 0's.
    """
    named = 0 <= cfg.hang_rank < cfg.tp
    if scenario == "kernel_deadlock" and not named:
        cuda.synchronize()
    cause = cfg.hang_rank if named else 0
    if scenario == "collective_wait" or rank != cause:
        distributed_c10d.all_reduce([1.0])
    elif scenario == "kernel_deadlock":
        cuda.synchronize()
    else:
        fetch_cubins(cfg)


def startup_s(cfg: SimConfig) -> float:
    """How long rank 0's SglangStartup takes (loading + capture): the ranks start together."""
    loading = cfg.shards * cfg.shard_s if cfg.scenario == "slow_loading" else cfg.startup_s * 0.4
    return loading + cfg.startup_s * 0.5


def run_sglang_rank(cfg: SimConfig, console: Console, rank: int) -> int:
    """Entry point of `sglang::scheduler_TP<rank>` for rank > 0."""
    sysutil.set_title(sglang_scheduler_title(rank, cfg.tp))
    sysutil.die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    console.ranks = rank_prefix(cfg, rank)
    workdir = cfg.workdir or "."
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", workdir)
    if cfg.cdn_url:
        os.environ["FLASHINFER_CUBINS_REPOSITORY"] = cfg.cdn_url
    # model_runner.py load_model: every rank logs its own begin/end with its prefix.
    console.sglang("Load weight begin. avail mem=78.12 GB")
    time.sleep(startup_s(cfg))
    console.sglang("Load weight end. type=LlamaForCausalLM, avail mem=62.10 GB.")
    scenario = effective_scenario(cfg)
    if scenario in RANK_HANGS:
        rank_hang(cfg, scenario, rank)
    while True:  # healthy: the rank steps in lockstep with rank 0, which does the reporting
        time.sleep(3600)


class SiblingPids:
    """GPU n's compute process at TP>1: the launcher's child titled `sglang::scheduler_TP<n>`."""

    def __init__(self, cfg: SimConfig) -> None:
        self._cfg = cfg
        self._found: dict[int, int] = {0: os.getpid()}

    def __call__(self, gpu: int) -> list[int]:
        """The pid on `gpu` (looked up once by its `--role` argument, then cached)."""
        if gpu not in self._found:
            title = sglang_scheduler_title(gpu, self._cfg.tp)
            try:
                for child in psutil.Process(os.getppid()).children():
                    if title in child.cmdline():
                        self._found[gpu] = child.pid
            except psutil.Error:
                return []
        return [self._found[gpu]] if gpu in self._found else []
