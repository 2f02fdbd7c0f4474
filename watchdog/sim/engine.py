"""The simulated `VLLM::EngineCore` and `VLLM::Worker_TPn` processes: the GPU work and the hangs.

The engine runs the startup phases, writes GPU samples, then steps the pretend batch and
reports counters to its parent on a status pipe (JSON Lines). In a hang scenario it parks its
main thread where a real engine parks: in `download_file` (cubin_download_stall) or in
`synchronize` (kernel_deadlock). engine_dead exits with vLLM's fatal-error lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import IO, Any

from watchdog.sim import sysutil
from watchdog.sim.config import SimConfig
from watchdog.sim.flashinfer.jit import cubin_loader
from watchdog.sim.gpu_file import GpuFileWriter
from watchdog.sim.output import Console
from watchdog.sim.sglang_ranks import RANK_HANGS, SiblingPids, rank_hang, rank_prefix
from watchdog.sim.startup import Startup
from watchdog.sim.torch_stub import cuda
from watchdog.sim.trtllm_engine import TrtllmHooks

PROC = "EngineCore_DP0"  # log prefix of the engine core (2.6: EngineCore_DP0 in later logs)
STEP_S = 0.1
SILENT_AFTER_S = 5.0  # --silence-s: serving this long before the silence
STRAGGLE_S = 3.0  # how long the waiting ranks of a rank-level hang work on after the cause stops
# Made-up kernel names under the real v0.6.7 TRTLLM_GEN_FMHA artifact pin (flashinfer/artifacts.py).
FMHA_PATH = "e7afc4134bb53eaab63fb85163d5943fb190621c/fmha/trtllm-gen/"
CUBINS = tuple(
    FMHA_PATH + f"fmhaSm103aKernel_QkvBfloat16OBfloat16H128PagedKvP{n}VarSeqContext.cubin"
    for n in (32, 64)
)
# e_svd348 sample (shm_broadcast TimeoutError -> fatal), reproduced line for line.
FATAL_TRACE = (
    "EngineCore encountered a fatal error.",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1352, '
    "in run_engine_core",
    "    engine_core.run_busy_loop()",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/'
    'shm_broadcast.py", line 647, in timeout_ms',
    "    raise TimeoutError",
    "TimeoutError",
)


# get_cubin returns b"" once download_file gave up (flashinfer/jit/cubin_loader.py v0.6.7), and
# loading the TRTLLM-gen kernel from it fails; the exception text is the simulator's own.
DOWNLOAD_FAILED = (
    "RuntimeError: Failed to load the TRTLLM-gen FMHA cubin: FlashInfer could not download it "
    "from the kernel CDN"
)


class Engine:
    """One EngineCore: startup, then the scenario's behaviour; reports on `status`."""

    def __init__(self, cfg: SimConfig, console: Console, status: IO[str] | None) -> None:
        self.cfg = cfg
        self.con = console
        self.status = status
        self.pid = os.getpid()
        self.workers: list[subprocess.Popen[bytes]] = []
        self.gpu: GpuFileWriter | None = None
        self.counters = {"prompt_tokens": 0, "gen_tokens": 0, "iterations": 0, "done": 0}
        self.trtllm = TrtllmHooks(self) if cfg.engine == "trtllm" else None
        self.sglang_ranks: SiblingPids | None = None
        if cfg.engine == "sglang" and cfg.tp > 1:
            self.sglang_ranks = SiblingPids(cfg)  # the launcher starts the other ranks

    def report(self, ev: str, **fields: Any) -> None:
        """One status line to the API/CLI process."""
        if self.status is not None:
            self.status.write(json.dumps({"ev": ev, **self.counters, **fields}) + "\n")
            self.status.flush()

    def log(self, level: str, where: str, msg: str) -> None:
        """An engine log line with vLLM's prefix."""
        self.con.vllm(PROC, self.pid, level, where, msg)

    def run(self) -> int:
        """Whole engine lifetime; returns the exit code."""
        workdir = self.cfg.workdir or tempfile.mkdtemp(prefix="vllm-sim-")
        os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", workdir)
        if self.cfg.cdn_url:
            os.environ["FLASHINFER_CUBINS_REPOSITORY"] = self.cfg.cdn_url
        self.spawn_workers()
        if self.cfg.gpu_file:
            self.gpu = GpuFileWriter(
                self.cfg.gpu_file, self.cfg.gpus, self.gpu_pids, self.cfg.gpu_name, self.cfg.cc
            )
            self.gpu.start()
        if self.cfg.engine == "sglang":
            from watchdog.sim.sglang import SglangStartup

            SglangStartup(self.cfg, self.con, PROC, workdir).run()
            self.warm_up()
        elif self.trtllm is not None:
            from watchdog.sim.trtllm import TrtllmStartup

            TrtllmStartup(self.cfg, self.con, PROC, workdir).run()
            self.trtllm.started()
        else:
            Startup(self.cfg, self.con, PROC, workdir).run()
        self.report("ready")
        return self.serve_scenario()

    def warm_up(self) -> None:
        """SGLang's _wait_and_warmup (srt/entrypoints/http_server.py) sends one short generation
        before `The server is fired up and ready to roll!`; /health answers 503 until then
        (ServerStatus.Starting). Its batch returns, so the gauges read 0 after it."""
        time.sleep(STEP_S)
        self.counters["iterations"] += 1
        self.counters["prompt_tokens"] += 4
        self.counters["gen_tokens"] += 1
        self.report("step", running=0, waiting=0)

    def gpu_pids(self, gpu: int) -> list[int]:
        """Compute processes on a GPU: the worker for its rank with TP>1, else the engine."""
        if self.sglang_ranks is not None:
            return self.sglang_ranks(gpu)
        if gpu < len(self.workers):
            return [self.workers[gpu].pid]
        return [self.pid]

    def set_gpu(self, profile: str) -> None:
        """Switch the simulated GPU's shape."""
        if self.gpu is not None:
            self.gpu.profile = profile

    def serve_scenario(self) -> int:
        """Dispatch on the scenario once startup is done."""
        scenario = self.cfg.scenario
        if scenario == "hang_unless_fallback":
            scenario = "healthy" if self.cfg.trtllm_disabled else "kernel_deadlock"
        if scenario == "cubin_download_stall" and self.cfg.trtllm_disabled:
            # The fallback's other attention backend needs no TRTLLM-gen cubins: nothing to fetch.
            scenario = "healthy"
        running = self.batch_size()
        if self.sglang_ranks is not None and scenario in RANK_HANGS:
            # SGLang TP>1: this process is rank 0 itself, no workers to command.
            self.set_gpu("spin" if scenario == "kernel_deadlock" else "idle")
            self.report("batch", running=running, waiting=self.total_waiting(running))
            self.straggle()
            rank_hang(self.cfg, scenario, 0)
        if scenario == "collective_wait" or (
            scenario in ("kernel_deadlock", "cubin_download_stall") and self.hang_rank_valid()
        ):
            self.set_gpu("spin" if scenario == "kernel_deadlock" else "idle")
            self.report("batch", running=running, waiting=self.total_waiting(running))
            self.straggle()
            self.tell_workers(f"{scenario} {self.cfg.hang_rank}")
            collective_rpc()
        if scenario in ("kernel_deadlock", "cubin_download_stall"):
            self.set_gpu("spin")
            # The batch is scheduled, not finished: engines that write their gauges after a
            # batch (SGLang, TensorRT-LLM) still show the warm-up's 0 (link.py).
            self.report("batch", running=running, waiting=self.total_waiting(running))
            if scenario == "kernel_deadlock":
                self.tell_workers("hang")
                cuda.synchronize()
            elif not self.fetch_cubins():
                return self.die(DOWNLOAD_FAILED)
        return self.step_loop(dies=scenario == "engine_dead")

    def straggle(self) -> None:
        """The ranks that wait finish their share of the step first: their GPUs move memory
        for STRAGGLE_S after the cause stopped, then spin in the NCCL wait (time-scaled: on a
        real server that gap is the rest of one forward pass)."""
        if self.gpu is None or not self.hang_rank_valid():
            return
        gpu = self.gpu
        waiting = [r for r in range(self.ranks()) if r != self.cfg.hang_rank]
        gpu.per_gpu = {r: "busy" for r in waiting}
        timer = threading.Timer(
            STRAGGLE_S, lambda: gpu.per_gpu.update({r: "spin" for r in waiting})
        )
        timer.daemon = True
        timer.start()

    def ranks(self) -> int:
        """TP ranks: vLLM's worker children, or SGLang's sibling schedulers (this one is 0)."""
        return self.cfg.tp if self.sglang_ranks is not None else len(self.workers)

    def hang_rank_valid(self) -> bool:
        """--hang-rank names one of this server's worker ranks."""
        return 0 <= self.cfg.hang_rank < self.ranks()

    def fetch_cubins(self) -> bool:
        """The first batch needs TRTLLM-gen FMHA cubins: fetch them through the FlashInfer chain.
        False when FlashInfer gave up (its four tries failed): the kernel cannot be loaded."""
        if self.cfg.engine == "sglang":
            from watchdog.sim.sglang_ranks import fetch_cubins

            return fetch_cubins(self.cfg)  # FlashInfer's logger at ERROR under SGLang
        if self.trtllm is not None:
            return self.trtllm.fetch_cubins()
        cubin_loader.configure_logging(sys.stderr, self.cfg.log_file)
        return all(
            cubin_loader.get_cubin_callback(name.encode(), b"", timeout=self.cfg.cdn_timeout)
            for name in CUBINS
        )

    def batch_size(self) -> int:
        """Requests running in one step."""
        if self.cfg.mode == "serve":
            return self.cfg.load
        return min(self.cfg.num_prompts, 256)

    def total_waiting(self, running: int) -> int:
        """Requests queued behind the running batch."""
        if self.cfg.mode == "serve":
            return 0
        return max(self.cfg.num_prompts - self.counters["done"] - running, 0)

    def step_loop(self, dies: bool) -> int:
        """Healthy stepping; bench ends when all prompts are done, engine_dead dies on time."""
        cfg = self.cfg
        per_step = max(1, -(-cfg.num_prompts * STEP_S // cfg.bench_s))
        started = time.monotonic()
        while True:
            if dies and time.monotonic() - started >= cfg.die_after_s:
                return self.die()
            if cfg.mode == "serve" and 0 < cfg.load_s <= time.monotonic() - started:
                return self.drained()
            if cfg.silence_s > 0 and time.monotonic() - started >= SILENT_AFTER_S:
                # A long host-side pause that ends by itself (syv-ai/qwen38-27b-rtx3090#107:
                # 156 engine silences of 20 s to 15.8 min in a day, all recovering).
                self.set_gpu("idle")
                time.sleep(cfg.silence_s)
                cfg = replace(cfg, silence_s=0.0)
            running = self.batch_size() if cfg.mode == "serve" else self.remaining_batch()
            self.set_gpu("busy" if running else "idle")
            time.sleep(STEP_S)
            self.counters["iterations"] += 1
            self.counters["prompt_tokens"] += running * 32
            self.counters["gen_tokens"] += running * 8
            if cfg.mode == "bench":
                self.counters["done"] = min(cfg.num_prompts, self.counters["done"] + int(per_step))
            self.report("step", running=running, waiting=self.total_waiting(running))
            if self.trtllm is not None:
                self.trtllm.on_step(running, running + self.total_waiting(running))
            if cfg.mode == "bench" and self.counters["done"] >= cfg.num_prompts:
                self.set_gpu("idle")
                self.report("finished")
                return 0

    def drained(self) -> int:
        """The load is done: one last report with nothing running, then the engine idles
        without stepping (vLLM's EngineCore busy loop blocks on its input queue when idle)."""
        self.set_gpu("idle")
        self.report("step", running=0, waiting=0)
        while True:
            time.sleep(1.0)

    def remaining_batch(self) -> int:
        """Bench: prompts still running (at most one batch)."""
        return min(self.cfg.num_prompts - self.counters["done"], 256)

    def die(self, error: str = "") -> int:
        """Print the fatal-error lines (e_svd348 / vLLM core.py) and exit like a dead engine;
        `error` replaces the last line's exception (a kernel whose cubin never arrived)."""
        if self.cfg.engine == "sglang":
            from watchdog.sim.sglang import SCHEDULER_TRACE

            for line in _with_error(SCHEDULER_TRACE, error):
                self.con.sglang(line)
        elif self.trtllm is not None:
            self.trtllm.die(error)
        else:
            for line in _with_error(FATAL_TRACE, error):
                self.log("ERROR", "core.py:1361", line)
        self.set_gpu("gone")
        self.report("dead")
        return 1

    def spawn_workers(self) -> None:
        """TP>1: one `VLLM::Worker_TPn` child per rank, each fed commands on its stdin."""
        if self.cfg.tp <= 1 or self.cfg.engine == "sglang":
            return
        base = _without_role(self.cfg.argv)
        for rank in range(self.cfg.tp):
            argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", *base]
            argv += ["--role", f"VLLM::Worker_TP{rank}"]
            self.workers.append(subprocess.Popen(argv, stdin=subprocess.PIPE))

    def tell_workers(self, command: str) -> None:
        """Send one command line to every worker."""
        for worker in self.workers:
            if worker.stdin is not None:
                worker.stdin.write(command.encode() + b"\n")
                worker.stdin.flush()

    def shutdown(self, *_: object) -> None:
        """SIGTERM: stop the workers and leave at once (the main thread may be in a socket read)."""
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=3)
            except subprocess.TimeoutExpired:
                worker.kill()
        os._exit(0)


def _with_error(trace: Sequence[str], error: str) -> list[str]:
    """A traceback whose last line (the exception) is `error` when one is given."""
    return [*trace[:-1], error] if error else list(trace)


def _without_role(argv: Sequence[str]) -> list[str]:
    """The engine's argv minus its `--role X` / `--role=X`: a worker gets its own title only
    (vLLM's setproctitle replaces the whole command line, so no worker shows EngineCore's)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--role":
            skip = True
        elif not a.startswith("--role="):
            out.append(a)
    return out


def run_engine(cfg: SimConfig, console: Console) -> int:
    """Entry point of the EngineCore role."""
    if cfg.engine != "trtllm":  # TensorRT-LLM sets no process title
        sysutil.set_title(cfg.engine_role)
    sysutil.die_with_parent()
    status = os.fdopen(cfg.status_fd, "w") if cfg.status_fd >= 0 else None
    if cfg.engine == "sglang":
        console.ranks = rank_prefix(cfg, 0)
    engine = Engine(cfg, console, status)
    signal.signal(signal.SIGTERM, engine.shutdown)
    return engine.run()


def collective_rpc() -> None:
    """The engine waits for its workers' replies (vLLM's executor collective_rpc), forever."""
    while True:
        time.sleep(0.05)
