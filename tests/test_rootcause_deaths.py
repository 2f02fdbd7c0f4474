# ruff: noqa: E501  (log lines are quoted whole, as the engines print them)
"""Process deaths in each server's own words, with their causes: a Dynamo worker whose handler
or engine loop failed, tritonserver's fatal-signal handler and its frames, vLLM V0's engine
death, and the shell's job-status line for a command killed by a signal. Each from a case
written here in the upstream format cited at its rule, with a near miss that stays quiet."""

from __future__ import annotations

import pytest

from tests.logreadings import live_verdict, replay_read
from watchdog.core.judge.rootcause import Cause


def replay(text: str) -> tuple[tuple[str, ...], str | None, str, Cause | None]:
    """(signatures named, generic class, its rule's label, root cause) as `replay` reads it."""
    r = replay_read(text)
    return r.names, r.cls, r.label, r.cause


def live(text: str) -> str:
    """The live verdict's state, reason and fix after the lines (a log-only watch)."""
    v = live_verdict(text)
    return f"{v.state}|{v.reason}|{v.fix}"


# vLLM V0's stats line (vllm/engine/metrics.py LoggingStatLogger), as Dynamo's vLLM workers print it.
V0_STATS = "INFO 05-02 09:1{m}:00 metrics.py:455] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: {g} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 1.0%, CPU KV cache usage: 0.0%.\n"

# 1. A Dynamo worker's handler or engine loop ------------------------------------------------

# ai-dynamo/dynamo examples/llm/components/prefill_worker.py (v0.1-v0.2): the queue handler's
# done-callback logs `[ERROR] prefill queue handler failed: {e!r}` and calls sys.exit(1).
DYNAMO_PREFILL = (
    V0_STATS.format(m=1, g="31.5", r=1)
    + "Dequeued prefill request: 0f3c9a52-1d7e-4b0e-9c55-7a1f2b3c4d5e\n"
    + "[ERROR] prefill queue handler failed: KeyError('kv_transfer_params')\n"
)


def test_a_dynamo_prefill_handler_that_fails_is_a_crash_with_its_exception() -> None:
    names, cls, label, cause = replay(DYNAMO_PREFILL)
    assert (names, cls) == ((), "crashed")
    assert "Dynamo worker's handler or engine loop failed" in label
    assert cause is not None and cause.kind == "engine_loop"
    assert "Dynamo's prefill worker" in cause.summary
    assert "KeyError('kv_transfer_params')" in cause.summary
    said = live(DYNAMO_PREFILL)
    assert said.startswith("dead|") and "KeyError('kv_transfer_params')" in said


# components/src/dynamo/vllm/engine_monitor.py: a health check that times out logs the
# traceback, `vLLM AsyncLLM health check failed: {e}` (a TimeoutError's text is empty), then
# `Initiating Dynamo Runtime shutdown.` and os._exit(1).
DYNAMO_MONITOR = (
    V0_STATS.format(m=1, g="12.0", r=2)
    + "2026-05-02T09:12:04.118Z ERROR dynamo.vllm.engine_monitor: vLLM AsyncLLM health check failed: \n"
    + "2026-05-02T09:12:04.119Z WARN dynamo.vllm.engine_monitor: Initiating Dynamo Runtime shutdown.\n"
)


def test_a_dynamo_engine_monitor_shutdown_is_engine_death() -> None:
    # The monitor found the engine it runs in-process dead, then ends the worker.
    names, _, _, cause = replay(DYNAMO_MONITOR)
    assert names == ("engine_dead",)
    assert cause is not None and cause.kind == "engine_loop"
    assert "engine monitor" in cause.summary and "cause unknown" in cause.summary


def test_a_dynamo_workers_graceful_shutdown_stays_quiet() -> None:
    # components/src/dynamo/*/main.py graceful_shutdown (the SIGTERM/SIGINT handler's path).
    text = V0_STATS.format(m=1, g="0.0", r=0) + (
        "2026-05-02T09:20:00.000Z INFO main.graceful_shutdown: Received shutdown signal, shutting down DistributedRuntime\n"
        "2026-05-02T09:20:00.400Z INFO main.graceful_shutdown: DistributedRuntime shutdown complete\n"
    )
    assert replay(text)[:2] == ((), None)


def test_a_dynamo_handler_error_the_worker_serves_past_stays_quiet() -> None:
    text = DYNAMO_PREFILL + V0_STATS.format(m=3, g="40.2", r=2)
    assert replay(text)[:2] == ((), None)


# 2. tritonserver's fatal-signal handler -----------------------------------------------------

# triton-inference-server/server src/triton_signal.cc ErrorSignalHandler: `Signal (N) received.`
# then boost::stacktrace's frames (frame 0 the handler, frame 1 libc's signal trampoline).
TRITON_START = (
    "I0502 09:10:00.100000 1 grpc_server.cc:2519] Started GRPCInferenceService at 0.0.0.0:8001\n"
    "I0502 09:10:00.100200 1 http_server.cc:4637] Started HTTPService at 0.0.0.0:8000\n"
)
TRITON_ABRT = TRITON_START + (
    "Signal (6) received.\n"
    " 0# 0x00005611AA01B2C3 in tritonserver\n"
    " 1# 0x00007F11B2A42520 in /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    " 2# pthread_kill in /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    " 3# 0x00007F11A0C81F00 in /opt/tritonserver/backends/python/libtriton_python.so\n"
    " 4# 0x00007F11A0C80011 in /opt/tritonserver/backends/python/libtriton_python.so\n"
)


def test_tritonservers_fatal_signal_is_a_crash_naming_the_signal_and_library() -> None:
    names, cls, label, cause = replay(TRITON_ABRT)
    assert (names, cls) == ((), "crashed") and "tritonserver's fatal-signal handler" in label
    assert cause is not None and cause.kind == "signal"
    assert "SIGABRT (signal 6)" in cause.summary and "libtriton_python.so" in cause.summary
    assert cause.line == "Signal (6) received."
    said = live(TRITON_ABRT)
    assert said.startswith("dead|") and "SIGABRT" in said


def test_tritons_frames_without_their_signal_line_are_still_a_crash() -> None:
    cut = TRITON_ABRT.replace("Signal (6) received.\n", "")
    names, cls, label, cause = replay(cut)
    assert (names, cls) == ((), "crashed") and "boost::stacktrace" in label
    assert cause is None  # the signal is not in the log: the cause is unknown


@pytest.mark.parametrize("signum", [2, 15])  # SIGINT, SIGTERM: SignalHandler's clean exit
def test_tritons_graceful_signal_stays_quiet(signum: int) -> None:
    text = TRITON_START + (
        f"Signal ({signum}) received.\n"
        "I0502 09:20:00.000000 1 server.cc:305] Waiting for in-flight requests to complete.\n"
    )
    names, cls, _, cause = replay(text)
    assert (names, cls, cause) == ((), None, None)


# 3. vLLM V0's engine death ------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        # vllm/engine/multiprocessing/client.py run_heartbeat_loop, via _set_errored (0.6-0.8)
        "ERROR 05-02 09:12:10 client.py:301] RuntimeError('Engine process (pid 3117) died.')",
        # vllm/entrypoints/launcher.py _add_shutdown_handlers (logger.fatal)
        "CRITICAL 05-02 09:12:11 launcher.py:104] MQLLMEngine is already dead, terminating server process",
        "CRITICAL 05-02 09:12:11 launcher.py:93] AsyncLLMEngine is already dead, terminating server process",
        "CRITICAL 05-02 09:12:11 launcher.py:77] AsyncLLMEngine has failed, terminating server process",
    ],
)
def test_vllm_v0_engine_death_lines_name_engine_dead(line: str) -> None:
    names, *_ = replay(V0_STATS.format(m=1, g="20.0", r=3) + line + "\n")
    assert names and names[0] == "engine_dead"


def test_mqllmengine_terminated_at_a_clean_stop_is_not_engine_death() -> None:
    # vllm/engine/multiprocessing/engine.py signal_handler: the engine's SIGTERM handler raises
    # KeyboardInterrupt("MQLLMEngine terminated") whenever the server stops its engine.
    text = V0_STATS.format(m=1, g="0.0", r=0) + (
        "INFO 05-02 09:13:00 launcher.py:62] Shutting down FastAPI HTTP server.\n"
        "ERROR 05-02 09:13:00 engine.py:400] MQLLMEngine terminated\n"
    )
    assert "engine_dead" not in replay(text)[0]


# 4. The shell's job-status line -------------------------------------------------------------

# bash jobs.c notify_of_job_status (bash 5.2): `NAME: line N: PID TEXT (core dumped) COMMAND`,
# TEXT padded to 24 columns; the command after it is as long as the operator's.
LONG_COMMAND = "python3 -m vllm.entrypoints.openai.api_server --model /models/Llama-3.1-8B-Instruct --dtype bfloat16 --max-model-len 8192 --port 8000"


def test_a_long_command_killed_by_sigill_names_the_build() -> None:
    line = f"serve.sh: line 14: 23170 Illegal instruction     (core dumped) {LONG_COMMAND}\n"
    names, *_ = replay(V0_STATS.format(m=1, g="20.0", r=1) + line)
    assert names and names[0] == "build_machine_mismatch"


@pytest.mark.parametrize(
    "text", ["Killed                  ", "Aborted                 ", "Floating point exception"]
)
def test_the_shells_job_status_for_a_fatal_signal_is_a_crash(text: str) -> None:
    line = f"serve.sh: line 14: 23170 {text}{LONG_COMMAND}\n"
    names, cls, label, _ = replay(V0_STATS.format(m=1, g="20.0", r=1) + line)
    assert (names, cls) == ((), "crashed") and "the shell reports" in label


def test_a_helper_killed_while_the_server_serves_on_stays_quiet() -> None:
    line = "probe.sh: line 3: 23170 Killed                  nvidia-smi --query-gpu=memory.used --format=csv\n"
    text = V0_STATS.format(m=1, g="20.0", r=1) + line + V0_STATS.format(m=2, g="22.0", r=1)
    assert replay(text)[:2] == ((), None)
