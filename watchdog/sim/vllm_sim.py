"""`python -m watchdog.sim.vllm_sim`: a simulated vLLM server for demos and end-to-end tests.

The top process is the API server (serve) or the `vllm bench throughput` CLI (bench); it spawns
a `VLLM::EngineCore` child (and `VLLM::Worker_TPn` children with --tp > 1) that does the pretend
GPU work and hangs the way real engines hang. With `--engine sglang` the launcher's children are
`sglang::scheduler` (`sglang::scheduler_TP<n>`, one per rank, with --tp > 1) and
`sglang::detokenizer`; with `--engine trtllm` (trtllm-serve) it is the MPI pool worker
`mpi4py.futures.server` running the executor. See docs/demo.md.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from watchdog.sim import versions
from watchdog.sim.api import ApiServer
from watchdog.sim.bench import run_bench
from watchdog.sim.config import (
    ROLE_API,
    ROLE_ENGINE,
    ROLE_SGLANG_DETOKENIZER,
    ROLE_SGLANG_SCHEDULER,
    ROLE_TRTLLM_WORKER,
    SimConfig,
    parse,
    sglang_rank_of,
    sglang_scheduler_title,
)
from watchdog.sim.engine import run_engine
from watchdog.sim.flashinfer.jit.cubin_loader import check_loopback
from watchdog.sim.gpu_file import GpuFileWriter
from watchdog.sim.link import EngineLink
from watchdog.sim.output import Console
from watchdog.sim.sglang_ranks import run_sglang_rank
from watchdog.sim.workers import run_idle_child, run_worker


def announce_port(cfg: SimConfig, console: Console, port: int) -> None:
    """`SIM_PORT=<n>` as the first stdout line, and in --port-file when given."""
    console.line(f"SIM_PORT={port}")
    if cfg.port_file:
        tmp = cfg.port_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{port}\n")
        os.replace(tmp, cfg.port_file)  # readers never see a half-written file


def run_top(cfg: SimConfig, console: Console) -> int:
    """The API server / bench CLI process: owns the engine child and the HTTP server."""
    forwarded = [a for a in cfg.argv]
    link = EngineLink(forwarded, cfg.engine_role)
    api = ApiServer(cfg, console, link) if cfg.mode == "serve" else None
    if api is not None:
        announce_port(cfg, console, api.port)

    def stop(*_: object) -> None:
        link.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    link.start()
    if cfg.engine == "sglang":
        # engine.py _launch_subprocesses: the launcher starts one scheduler per TP rank (rank 0
        # is the engine link's child, the stats-logging rank) and the detokenizer, as siblings.
        for rank in range(1, cfg.tp):
            link.spawn_child(sglang_scheduler_title(rank, cfg.tp))
        link.spawn_child(ROLE_SGLANG_DETOKENIZER)
    if api is None:
        code = run_bench(cfg, console, link)
        link.stop()
        return code
    gpu_after_death(cfg, link)
    api.serve()
    return 0


def gpu_after_death(cfg: SimConfig, link: EngineLink) -> None:
    """Once the engine is dead, keep the GPU file going with no compute process on the GPU."""
    if not cfg.gpu_file:
        return

    def watch() -> None:
        if link.wait_for("dead"):
            writer = GpuFileWriter(cfg.gpu_file or "", cfg.gpus, lambda _: [], cfg.gpu_name, cfg.cc)
            writer.profile = "gone"
            writer.start()

    threading.Thread(target=watch, name="gpu-after-death", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, re-exec for --fake-versions if asked, then run this process's role."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse(args)
    console = Console(sys.stdout, sys.stderr, cfg.log_file, engine=cfg.engine)
    if cfg.role in (ROLE_ENGINE, ROLE_SGLANG_SCHEDULER, ROLE_TRTLLM_WORKER, cfg.engine_role):
        return run_engine(cfg, console)
    if sglang_rank_of(cfg.role) is not None:
        return run_sglang_rank(cfg, console, sglang_rank_of(cfg.role) or 0)
    if cfg.role == ROLE_SGLANG_DETOKENIZER:
        return run_idle_child(cfg.role)
    if cfg.role.startswith("VLLM::Worker"):
        return run_worker(cfg, cfg.role)
    if cfg.role != ROLE_API:
        print(f"unknown --role {cfg.role!r}", file=sys.stderr)
        return 2
    if cfg.scenario == "cubin_download_stall" and not cfg.cdn_url:
        print(
            "--scenario cubin_download_stall needs --cdn-url http://127.0.0.1:PORT/ "
            "(start one with: python -m watchdog.sim.cdn --port 0 --mode blackhole)",
            file=sys.stderr,
        )
        return 2
    try:
        if cfg.cdn_url:
            check_loopback(cfg.cdn_url)
        versions.reexec_with_versions(cfg.fake_versions, args, cfg.workdir)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    return run_top(cfg, console)


if __name__ == "__main__":
    sys.exit(main())
