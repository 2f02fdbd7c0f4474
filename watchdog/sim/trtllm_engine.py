"""The simulated trtllm-serve executor worker's own behaviour: iteration lines, HangDetector,
the FlashInfer TRTLLM-gen cubin fetch on the first batch, and the forward-error death.

Sources are named in watchdog/sim/trtllm.py. The worker process is `mpi4py.futures.server`
(an MpiPoolSession worker running PyExecutor); the hooks run inside watchdog.sim.engine.Engine.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from watchdog.sim.flashinfer.jit import cubin_loader
from watchdog.sim.trtllm import FORWARD_ERROR, HangDetector, iter_line

# py_executor.py _forward_step: traceback.print_exc() of the failing forward, then the error.
FORWARD_TRACE = (
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/pyexecutor/'
    'py_executor.py", line 2856, in _forward_step',
    "    outputs = forward(scheduled_requests, self.resource_manager,",
    f"RuntimeError: {FORWARD_ERROR}",
)
# py_executor.py _event_loop_wrapper: logger.error(traceback.format_exc()) after the error line.
EVENT_LOOP_TRACE = (
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/pyexecutor/'
    'py_executor.py", line 412, in _event_loop_wrapper',
    "    self.event_loop()",
    f"RuntimeError: {FORWARD_ERROR}",
)


class TrtllmHooks:
    """What the executor loop adds for TensorRT-LLM: one line per iteration, the detector."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.detector = HangDetector(engine.cfg.hang_detector_s, self.log)
        self._last: float | None = None
        self._prev_ms: float | None = None

    def log(self, level: str, msg: str) -> None:
        """A `[TRT-LLM] [X]` line from this process."""
        self.engine.con.trtllm(level, msg)

    def started(self) -> None:
        """PyExecutor starts its HangDetector with the executor loop."""
        self.detector.start()

    def on_step(self, running: int, total: int) -> None:
        """print_iter_log: rank 0 logs each iteration; each iteration is a detector checkpoint."""
        now = time.monotonic()
        host_ms = (now - self._last) * 1000 if self._last is not None else 0.0
        self._last = now
        self.detector.checkpoint()
        it = self.engine.counters["iterations"]
        self.log("INFO", iter_line(it, running, total, round(host_ms, 6), self._prev_ms))
        self._prev_ms = round(host_ms * 0.93, 6)

    def fetch_cubins(self) -> bool:
        """The first batch on SM100/SM103: FlashInfer's TRTLLM-gen FMHA module fetches cubins;
        False when FlashInfer gave up on one."""
        cubin_loader.configure_logging(sys.stderr, self.engine.cfg.log_file)
        return _trtllm_gen_batch_context_with_kv_cache(self.engine.cfg.cdn_timeout)

    def die(self, error: str = "") -> None:
        """The forward error fails only its batch (py_executor.py _forward_step serves on); the
        illegal access is sticky, so the loop's next CUDA call raises outside that handler and
        _event_loop_wrapper logs `Error in event loop: ...`: the executor thread is gone."""
        what = error.split(": ", 1)[-1] if error else FORWARD_ERROR
        for line in FORWARD_TRACE[:-1]:
            self.engine.con.line(line, "err")
        self.engine.con.line(f"RuntimeError: {what}", "err")
        self.log("ERROR", f"Encountered an error in forward function: {what}")
        self.log("ERROR", f"Error in event loop: {what}")
        for line in (*EVENT_LOOP_TRACE[:-1], f"RuntimeError: {what}"):
            self.log("ERROR", line)


def _trtllm_gen_batch_context_with_kv_cache(timeout: float) -> bool:
    """fmha/flashinfer_trtllm_gen.py: `flashinfer.prefill.get_trtllm_gen_fmha_module()` loads
    the TRTLLM-gen FMHA cubins through flashinfer/jit/cubin_loader.py on first use."""
    from watchdog.sim.engine import CUBINS

    return all(
        cubin_loader.get_cubin_callback(name.encode(), b"", timeout=timeout) for name in CUBINS
    )
