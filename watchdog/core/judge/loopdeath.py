"""An engine's request loop seen dying: each engine's own words for it, read from its source,
and what the dying loop's lines say killed it (pure)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from watchdog.core.judge.cudacause import TEARDOWN

# Each engine's own words for its request loop dying, from its source:
# - TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py PyExecutor._event_loop_wrapper
#   (the executor-loop thread's target): logger.error(f"Error in event loop: {e}") then re-raise;
#   tensorrt_llm/executor/proxy.py: "Executor worker initialization error: ..." and
#   RuntimeError("Executor worker returned error"); tensorrt_llm/llmapi/utils.py ManagedThread:
#   "Error in thread {name}: {e}" (await_response_thread and the other executor threads);
# - CPython Lib/threading.py excepthook: "Exception in thread NAME (TARGET):" for any thread
#   that ends with an exception; an engine's loop thread names its target;
# - vLLM vllm/v1/engine/core.py "EngineCore encountered a fatal error" / "EngineCore hit an
#   exception" and vllm/v1/engine/async_llm.py output_handler: "AsyncLLM output_handler failed."
#   (the API server's side once the engine core is gone);
# - SGLang srt/managers/scheduler.py "Scheduler hit an exception";
# - Dynamo's workers run these engines in-process and log their lines, plus the same
#   ManagedThread helper (components/src/dynamo/trtllm/publisher.py: "Error in thread {name}"),
#   and their own: the prefill worker's queue-handler task ends the worker with `[ERROR] prefill
#   queue handler failed: {e!r}` (examples/llm/components/prefill_worker.py, v0.1-v0.2), the
#   engine monitor with `vLLM AsyncLLM health check failed: {e}`
#   (components/src/dynamo/vllm/engine_monitor.py).
# The rest from the sweep of each engine's source (tests/data/deaths.toml cites each line):
# vLLM V0 vllm/engine/async_llm_engine.py@v0.7.3 `Engine background task failed`, 0.7 V1
# vllm/v1/engine/async_llm.py@v0.7.3 `EngineCore output handler hit an error`, 0.32
# vllm/v1/executor/multiproc_executor.py `WorkerProc hit an exception.` / `WorkerProc failed.`
# and ray_executor_v2.py `RayWorkerProc failed: %s`; SGLang's other loops (`X hit an
# exception`, srt/managers/*.py); TensorRT-LLM executor/worker.py worker_main `Failed to
# initialize executor on rank N: {e}` and pyexecutor/hang_detector.py `Executor loop crashed on
# this rank`; Dynamo's SGLang health monitor `SGLang engine unresponsive after N attempts` and
# TensorRT-LLM monitor `TRT-LLM engine is unhealthy: ERR` (components/src/dynamo/*/).
# A `said` group is the exception the loop's own line carries.
LOOP = (
    (
        re.compile(r"Error in event loop: (?P<said>.+)"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        # The executor thread's own traceback through its loop (its death line cut or, before
        # 0.20's _event_loop_wrapper, never written): py_executor.py's loop frames.
        re.compile(r", in (?:_executor_loop(?:_overlap|_pp)?|_event_loop_wrapper)\s*$"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        re.compile(r"Executor worker returned error|Executor worker initialization error"),
        "TensorRT-LLM's executor worker",
    ),
    (re.compile(r"Error in thread (?P<n>\w+): "), "thread {n}"),
    (re.compile(r"Exception in thread (?P<n>[^\s:]+(?: \(\w+\))?):"), "thread {n}"),
    (
        re.compile(
            r"EngineCore encountered a fatal error|EngineCore hit an exception"
            r"|EngineCore failed to start|, in run_engine_core\s*$|Process EngineCore\w*:\s*$"
        ),
        "vLLM's engine core loop",
    ),
    (
        re.compile(r", in (?:run_mp_engine|run_engine_loop)\s*$"),
        "vLLM V0's engine loop",
    ),
    (
        re.compile(r"AsyncLLM output_handler failed"),
        "vLLM's API-server output handler (the engine core is gone)",
    ),
    (re.compile(r"Scheduler hit an exception"), "SGLang's scheduler loop"),
    (re.compile(r"DetokenizerManager hit an exception"), "SGLang's detokenizer loop"),
    (re.compile(r"TokenizerManager hit an exception"), "SGLang's tokenizer manager loop"),
    (re.compile(r"DataParallelController hit an exception"), "SGLang's data-parallel controller"),
    (re.compile(r"TpModelWorkerClient hit an exception"), "SGLang's overlap worker thread"),
    (re.compile(r"Engine background task failed"), "vLLM V0's engine loop (AsyncLLMEngine)"),
    (
        re.compile(r"EngineCore output handler hit an error: (?P<said>.+)"),
        "vLLM's API-server output handler (the engine core is gone)",
    ),
    (
        re.compile(r"RayWorkerProc failed: (?P<said>.+)|WorkerProc (?:hit an exception|failed\.)"),
        "a vLLM worker process",
    ),
    (
        re.compile(r"Failed to initialize executor on rank (?P<r>\d+): (?P<said>.+)"),
        "TensorRT-LLM's executor on rank {r} (at start-up)",
    ),
    (
        re.compile(r"Executor loop crashed on this rank"),
        "TensorRT-LLM's executor loop (PyExecutor event loop)",
    ),
    (
        re.compile(r"SGLang engine unresponsive after \d+ attempts"),
        "the SGLang engine under Dynamo (its health monitor)",
    ),
    (
        re.compile(r"TRT-LLM engine is unhealthy: (?P<said>.+)"),
        "the TensorRT-LLM engine under Dynamo (its engine monitor)",
    ),
    (
        re.compile(r"prefill queue handler failed: (?P<said>.+)"),
        "Dynamo's prefill worker (its prefill-queue handler)",
    ),
    (
        re.compile(r"AsyncLLM health check failed:(?: (?P<said>.+))?"),
        "the vLLM engine under Dynamo (its engine monitor's health check)",
    ),
    (
        re.compile(r"Initiating Dynamo Runtime shutdown"),
        "a Dynamo worker's engine (the worker shut its runtime down)",
    ),
)
# An exception line: `RuntimeError: ...`, `torch.OutOfMemoryError: ...` (not the loop's own).
_EXC_LINE = re.compile(
    r"(?:^|\s)(?P<exc>(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (?P<msg>\S.*)$"
)
# A dying loop's timeout: vLLM's shm_broadcast acquire_read `raise TimeoutError`, the
# executor's `RPC call to %s timed out` (v1/executor/multiproc_executor.py), asyncio's.
_TIMEOUT = re.compile(r"\bTimeoutError\b|timed out")
LOOP_SPAN = 60  # lines of the dying loop's traceback read for its timeout
LOOP_TIMEOUT_FIX = (
    "The engine's request loop died of a timeout: it waited on something that never answered, "
    "usually a worker that hung (a kernel or a collective that never returned) or died. The "
    "stacks of every worker at the time name it (hang-watchdog diagnose --pid PID); then "
    "restart the server."
)
LOOP_FIX = (
    "The engine's request loop died, so no request can finish; the server must restart. Fix "
    "the root cause named here (the first exception in the dying loop), then restart."
)


def loop_name(line: str) -> str | None:
    """The loop a line says died (its name, from the table), or None."""
    for pat, name in LOOP:
        if m := pat.search(line):
            return name.format(**m.groupdict())
    return None


def loop_said(line: str) -> str:
    """The exception a loop's own line carries (TensorRT-LLM's and Dynamo's lines), or ''."""
    for pat, _ in LOOP:
        if (m := pat.search(line)) and m.groupdict().get("said"):
            return m["said"].strip()
    return ""


def loop_timeout(lines: Sequence[str], exc: str | None) -> str | None:
    """The wait that timed out in a dying loop's traceback (`raise TimeoutError`, `RPC call to
    sample_tokens timed out`), or None when the loop died of something else."""
    if exc is not None:
        return f"a wait timed out ({exc[:200]})" if _TIMEOUT.search(exc) else None
    for line in lines:
        if m := _TIMEOUT.search(line):
            said = line[line.rfind("] ", 0, m.start()) + 2 :] if "] " in line else line
            return f"a wait timed out ({said.strip()[:200]})"
    return None


def first_exception(lines: Sequence[str]) -> str | None:
    for line in lines:
        if loop_name(line) is not None and _EXC_LINE.search(line) is None:
            continue
        m = _EXC_LINE.search(line)
        if m and not TEARDOWN.search(line):
            return f"{m['exc']}: {m['msg'].strip()}"
    return None
