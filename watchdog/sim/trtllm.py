"""TensorRT-LLM `trtllm-serve` (PyTorch backend) for the simulator: its formats, metrics, health.

Read from NVIDIA/TensorRT-LLM main (2026, the 1.3 line); the file versions are named by commit:
- tensorrt_llm/logger.py @027cd518 Logger.log: `[TRT-LLM] [I] msg` (`[TRT-LLM] [MPI_Rank N] [I]`
  when the MPI world is larger than 1) under logging.basicConfig's `[%(asctime)s] %(message)s`,
  datefmt `%m/%d/%Y-%H:%M:%S`.
- tensorrt_llm/_torch/pyexecutor/py_executor.py PyExecutor._profiler.profile_step: the
  `iter = N, global_rank = ...` line, rank 0 only, with print_iter_log on.
- tensorrt_llm/_torch/pyexecutor/hang_detector.py @06c5e532 HangDetector._detect_hang and
  propagate_hard_kill; py_executor.py @00043967 on_detected.
- tensorrt_llm/metrics/collector.py @050f80de MetricsCollector: `trtllm_` names, labels
  model_name and engine_type; tensorrt_llm/serve/openai_server.py: /health (503 "LLM is
  unavailable..."), /metrics (JSON iteration stats), /prometheus/metrics (return_perf_metrics).
- tensorrt_llm/_torch/attention_backend/fmha/flashinfer_trtllm_gen.py and fmha/registry.py
  @00e7d103: on SM100/SM103 attention runs FlashInfer's TRTLLM-gen FMHA module (whose cubins come
  through flashinfer/jit/cubin_loader.py), unless TLLM_FMHA_LIBS drops `flashinfer_trtllm_gen`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from watchdog.sim.output import Bar, format_meter
from watchdog.sim.startup import Startup

FMHA_LIB = "flashinfer_trtllm_gen"  # fmha/registry.py FMHA_LIBS key
DEFAULT_FMHA_LIBS = ("triton_custom_mask", FMHA_LIB, "fallback")
LEVELS = {"CRITICAL": "[F]", "ERROR": "[E]", "WARNING": "[W]", "INFO": "[I]", "DEBUG": "[V]"}
UNAVAILABLE = b"LLM is unavailable. Please check the server logs for more details."
# py_executor.py _forward_step: traceback.print_exc() then this line (an illegal access here).
FORWARD_ERROR = "CUDA error: an illegal memory access was encountered"
GRAPH_BATCH_SIZES = (8, 4, 2, 1)  # the sim's cuda_graph_config batch sizes, captured largest first


def fmha_libs(env: Mapping[str, str]) -> tuple[str, ...]:
    """fmha/registry.py _parse_fmha_libs_env: an exact list, or only `+name`/`-name` deltas."""
    tokens = [t.strip() for t in env.get("TLLM_FMHA_LIBS", "").split(",") if t.strip()]
    if not tokens:
        return DEFAULT_FMHA_LIBS
    if all(t[0] in "+-" for t in tokens):
        names = list(DEFAULT_FMHA_LIBS)
        for t in tokens:
            if t[0] == "+" and t[1:] not in names:
                names.append(t[1:])
            elif t[0] == "-" and t[1:] in names:
                names.remove(t[1:])
        return tuple(names)
    return tuple(dict.fromkeys(tokens))


def trtllm_gen_disabled(env: Mapping[str, str]) -> bool:
    """True when TLLM_FMHA_LIBS leaves FlashInfer's TRTLLM-gen FMHA out."""
    return FMHA_LIB not in fmha_libs(env)


def log_line(level: str, msg: str, clock: Callable[[], float] = time.time) -> str:
    """`[12/01/2026-14:33:00] [TRT-LLM] [I] msg` (single-rank MPI world)."""
    stamp = time.strftime("%m/%d/%Y-%H:%M:%S", time.localtime(clock()))
    return f"[{stamp}] [TRT-LLM] {LEVELS.get(level, '[I]')} {msg}"


def iter_line(it: int, running: int, total: int, host_ms: float, device_ms: float | None) -> str:
    """PyExecutor._profiler.profile_step's line (TP=1, no context requests in this step)."""
    device = "N/A" if device_ms is None else f"{device_ms}ms"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    states = {"num_ctx_requests": 0, "num_ctx_tokens": 0, "num_generation_tokens": running}
    return (
        f"iter = {it}, global_rank = 0, rank = 0, currank_total_requests = {running}/{total}, "
        f"host_step_time = {host_ms}ms, prev_device_step_time = {device}, timestamp = {stamp}, "
        f"num_scheduled_requests: {running}, states = {states}"
    )


class TrtllmStartup(Startup):
    """Weight loading as the PyTorch backend prints it (tqdm bars, then `Model init total`)."""

    def run(self) -> None:
        """_torch/pyexecutor/weight_loader.py HfWeightLoader.load_weights (tqdm description
        "Loading safetensors weights in parallel"), then the per-module "Loading weights" bar
        and "Model init total -- N.NNs" as a trtllm-serve 1.x log shows them."""
        cfg = self._cfg
        slow = cfg.scenario == "slow_loading"
        per_shard = cfg.shard_s if slow else cfg.startup_s * 0.5 / cfg.shards
        shard_file = self._make_shard_file() if slow else None
        start = self._clock()
        bar = Bar(self._con, "err")
        desc = "Loading safetensors weights in parallel"
        bar.draw(format_meter(0, cfg.shards, 0.0, desc))
        for n in range(1, cfg.shards + 1):
            if shard_file:
                self._read_uncached(shard_file)
            self._sleep(per_shard)
            bar.draw(format_meter(n, cfg.shards, self._clock() - start, desc))
        bar.close()
        modules = Bar(self._con, "err")
        step = cfg.startup_s * 0.4 / 10
        mstart = self._clock()
        for n in range(0, 801, 80):
            modules.draw(format_meter(n, 800, self._clock() - mstart, "Loading weights"))
            self._sleep(step)
        modules.close()
        self._con.line(f"Model init total -- {self._clock() - start:.2f}s", "err")
        self.capture_graphs()

    def capture_graphs(self) -> None:
        """_torch/pyexecutor/model_engine.py@1a0dc5f7 warmup: one line per CUDA-graph batch
        size, largest first, before the executor loop starts."""
        step = self._cfg.startup_s * 0.1 / len(GRAPH_BATCH_SIZES)
        for bs in GRAPH_BATCH_SIZES:
            msg = f"Run generation-only CUDA graph warmup for batch size={bs}, draft_len=0"
            self._con.trtllm("INFO", msg)
            self._sleep(step)


class HangDetector:
    """HangDetector: no checkpoint for `timeout` s -> error lines, stack dump, self-SIGKILL.

    The two `Hang detected` lines and the self-SIGKILL line are TensorRT-LLM's; the stack dump
    between them (upstream `print_all_stacks`) is the simulator's own rendering.
    """

    def __init__(self, timeout: float, log: Callable[[str, str], None]) -> None:
        self.timeout = timeout
        self._log = log
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def start(self) -> None:
        """The detector's daemon thread (upstream: an asyncio loop thread)."""
        threading.Thread(target=self._run, name="hang_detector_loop", daemon=True).start()

    def checkpoint(self) -> None:
        """The executor loop made progress: reset the timer."""
        with self._lock:
            self._last = time.monotonic()

    def _run(self) -> None:
        while True:
            with self._lock:
                left = self.timeout - (time.monotonic() - self._last)
            if left <= 0:
                self._fire()
            time.sleep(min(max(left, 0.05), 1.0))

    def _fire(self) -> None:
        """_detect_hang, print_all_stacks, on_detected, propagate_hard_kill (self-SIGKILL)."""
        self._log("ERROR", f"Hang detected after {self.timeout:g} seconds.")
        for tid, frame in sys._current_frames().items():
            stack = "".join(traceback.format_stack(frame))
            self._log("ERROR", f"Thread {tid}:\n{stack}")
        self._log(
            "ERROR",
            "Hang detected on rank 0 in PyExecutor; hard-killing and propagating to peer ranks.",
        )
        self._log("ERROR", "HangDetector: self-SIGKILL; relying on the launcher to propagate to "
                  "peer ranks.")  # fmt: skip
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def iteration_stats(st: Any, max_active: int = 2048) -> list[dict[str, Any]]:
    """/metrics: `get_stats_async(2)` as JSON, the IterationStats fields the sim knows."""
    return [
        {
            "iter": st.iterations,
            "iterLatencyMS": 100.0,
            "numActiveRequests": st.batch_running,
            "numQueuedRequests": st.batch_waiting,
            "numCompletedRequests": st.done,
            "maxNumActiveRequests": max_active,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S.000000"),
            "inflightBatchingStats": {"numScheduledRequests": st.batch_running,
                                      "numContextRequests": 0,
                                      "numGenRequests": st.batch_running, "numPausedRequests": 0},
        }
    ]  # fmt: skip


class TrtllmCollector:
    """metrics/collector.py MetricsCollector names (prefix trtllm_), built fresh per scrape."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def collect(self) -> Any:
        """prometheus_client Collector protocol."""
        st = self._api.link.state
        labels, values = ["model_name", "engine_type"], [self._api.cfg.model, "trtllm"]
        families: list[Any] = []
        for name, doc, value in (
            ("trtllm_num_requests_running", "Number of active requests", st.batch_running),
            ("trtllm_num_requests_waiting", "Number of queued requests", st.batch_waiting),
            (
                "trtllm_kv_cache_utilization",
                "KV cache utilization",
                min(st.batch_running / 64, 1.0),
            ),
        ):
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            families.append(fam)
        for name, doc, value in (
            ("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.",
             st.prompt_tokens),
            ("trtllm_generation_tokens",
             "Cumulative number of generation (output) tokens produced.", st.gen_tokens),
            ("trtllm_num_requests_completed",
             "Total number of completed requests across iterations", st.done),
        ):  # fmt: skip
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, value)
            families.append(counter)
        return families


def _health(api: Any) -> tuple[int, bytes, str]:
    """OpenAIServer.health: 200 while the executor is alive, else 503 with its message."""
    if api.link.state.dead:
        return 503, UNAVAILABLE, "text/plain; charset=utf-8"
    return 200, b"", "text/plain; charset=utf-8"


def _stats(api: Any) -> tuple[int, bytes, str]:
    """/metrics: get_iteration_stats, JSON (not Prometheus text)."""
    return 200, json.dumps(iteration_stats(api.link.state)).encode(), "application/json"


def _prometheus(api: Any) -> tuple[int, bytes, str]:
    """/prometheus/metrics: mount_metrics (return_perf_metrics)."""
    from prometheus_client import generate_latest

    return 200, generate_latest(api.registry), "text/plain; version=0.0.4"


# trtllm-serve's routes that differ from the vLLM-shaped ones (openai_server.py register_routes)
ROUTES: dict[str, Callable[[Any], tuple[int, bytes, str]]] = {
    "/health": _health,
    "/metrics": _stats,
    "/prometheus/metrics": _prometheus,
}
