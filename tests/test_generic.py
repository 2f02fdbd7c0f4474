"""The generic layer (core/judge/generic.py): crashed, timed out, stalled and livelock from a log
alone, their near misses, `replay` exit codes per class, and the same classes in a live verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.obsbuilder import Timeline, events, final, procs
from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import (
    SignatureError,
    SignatureSet,
    load_file,
    load_signatures,
)
from watchdog.core.model import ServerSample

CORPUS = Path(__file__).parent / "data" / "corpus"


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A real `python -m watchdog replay FILE` (no network: a plain log is read only)."""
    return subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def traceback(*frames: tuple[str, int, str, str]) -> str:
    """A Python traceback's header and frames (file, line, function, code), no exception line."""
    body = "".join(f'  File "{f}", line {n}, in {fn}\n    {code}\n' for f, n, fn, code in frames)
    return "Traceback (most recent call last):\n" + body


def shown(text: str, sigs: SignatureSet) -> str | None:
    data = text.encode()
    _, evs = read_log(data, sigs, PATTERNS)
    if name_signatures(evs, sigs):
        return "signature"
    cv = log_classes(evs, data, sigs)
    return cv.primary.cls.id if cv is not None else None


# --- each class from a real excerpt (dev split), through the real CLI ----------------------


@pytest.mark.parametrize(
    ("name", "cls", "state"),
    [
        ("n37_vllm6252_faulthandler_segfault_flashinfer.log", "crashed", "dead"),
        ("g474_dynamo516_prefill_queue_handler_failed_attributeerror.log", "crashed", "dead"),
        ("g016_vllm5376_journald_cjk_month_api_traceback.log", "crashed", "dead"),
        # A timeout whose traceback ends the process: the class is the timeout, the state dead.
        ("g299_ray59249_vllm_qwen3vl_ray_channel_timeout.log", "timed_out", "dead"),
        # The store's wait timing out, and the traceback it raised, its frames cut.
        ("n20_trl3157_c10d_waitforinput_timeout.log", "timed_out", "dead"),
        ("n29_vllm51986_fi_allreduce_workspace_warnings.log", "timed_out", "hung"),
        ("n88_vllm17972_running1_zero_throughput_health200.log", "stalled", "stalled"),
        ("s_d_svd379_shm_broadcast_with_api_traffic.log", "stalled", "stalled"),
    ],
)
def test_replay_reports_the_class_its_line_and_exit_1(name: str, cls: str, state: str) -> None:
    done = replay(CORPUS / name)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"{cls} (state {state}, no signature names the cause)")
    assert "what would name the cause:" in done.stdout
    assert "run: hang-watchdog diagnose --pid PID --log-file LOG" in done.stdout
    doc = json.loads(replay(CORPUS / name, "--json").stdout)
    assert doc["matches"] == [] and doc["generic"]["class"] == cls
    assert doc["generic"]["state"] == state and doc["generic"]["line"]


def test_a_signature_that_matches_wins_over_the_class() -> None:
    done = replay(CORPUS / "n01_sgl7783_watchdog_timeout_pyspy_missing.log", "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 1
    assert doc["matches"][0]["signature"] == "sglang_scheduler_watchdog_timeout"
    assert doc["generic"] is None


def test_livelock_from_lines_that_repeat_with_no_progress(tmp_path: Path) -> None:
    # SGLang's retract line (srt/managers/scheduler.py update_running_batch) every step, no
    # batch finishing: the scheduler turns without making progress.
    line = (
        "[2026-03-02 10:{:02d}:{:02d} TP0] KV cache pool is full. Retract requests. "
        "#retracted_reqs: 1, #new_token_ratio: 0.7000 -> 1.0000"
    )
    log = tmp_path / "retract.log"
    log.write_text("\n".join(line.format(*divmod(s * 5, 60)) for s in range(12)) + "\n")
    done = replay(log)
    assert done.returncode == 1
    assert done.stdout.startswith("livelock (state stalled")
    assert "12 times in a row at the end" in done.stdout


def test_the_same_error_in_a_burst_of_seconds_is_no_livelock(sigs: SignatureSet) -> None:
    # One per-request error line a dozen times within two seconds (TensorRT-LLM's logger stamps
    # `[MM/DD/YYYY-HH:MM:SS]`): a busy server failing requests, not a loop. Over minutes, a loop.
    line = "[03/02/2026-10:{:02d}:{:02d}] [TRT-LLM] [E] Failed to detokenize output for request 0"
    burst = "".join(line.format(0, s // 6) + "\n" for s in range(12))
    assert shown(burst, sigs) is None
    minutes = "".join(line.format(*divmod(s * 10, 60)) + "\n" for s in range(12))
    assert shown(minutes, sigs) == "livelock"


def test_lines_timed_only_by_their_collector_are_judged_by_that_time(sigs: SignatureSet) -> None:
    # A Rust `tracing` line (Dynamo's frontend) has the shape of `docker logs -t`'s stamp, which
    # the reader strips as a collector's; journald's prefix carries the time the same way. The
    # time it gave is the line's: a dozen times over two minutes is a loop, within a second not.
    rust = (
        "2026-03-02T10:{:02d}:{:02d}.120044Z  WARN dynamo_llm::kv_router: "
        "no worker has capacity, waiting\n"
    )
    assert shown("".join(rust.format(*divmod(s * 10, 60)) for s in range(12)), sigs) == "livelock"
    assert shown("".join(rust.format(0, 1) for _ in range(12)), sigs) is None
    journald = "Mar 02 10:{:02d}:{:02d} node7 dynamo[812]: no worker has capacity, waiting\n"
    minutes = "".join(journald.format(*divmod(s * 10, 60)) for s in range(12))
    assert shown(minutes, sigs) == "livelock"
    assert shown("".join(journald.format(0, 1) for _ in range(12)), sigs) is None


def test_one_line_from_each_rank_is_no_livelock(sigs: SignatureSet) -> None:
    # Eight workers each log the same line once (a connector's per-step note), a minute apart:
    # one event seen eight times. One process saying it eight times over minutes is a loop, and
    # the same eight lines with no time of their own cannot show that they lasted.
    note = "connector: injected 512 tokens for the step -- adapter.py:650"
    ranks = "".join(
        f"(VllmWorkerProcess pid={100 + r}) DEBUG 03-02 10:{r:02d}:00 {note}\n" for r in range(8)
    )
    assert shown(ranks, sigs) is None
    one = "".join(
        f"(VllmWorkerProcess pid=100) DEBUG 03-02 10:{m:02d}:00 {note}\n" for m in range(8)
    )
    assert shown(one, sigs) == "livelock"
    untimed = "".join(f"(VllmWorkerProcess pid=100) DEBUG {note}\n" for _ in range(8))
    assert shown(untimed, sigs) is None
    tp = "".join(
        f"[2026-03-02 10:{r:02d}:00 TP{r}] KV cache pool is full. Retract.\n" for r in range(8)
    )
    assert shown(tp, sigs) is None


# --- near misses: each must stay quiet ------------------------------------------------------


def test_handled_cuda_oom_that_the_server_recovers_from_is_quiet(sigs: SignatureSet) -> None:
    text = (
        "ERROR 03-02 10:00:00 [serving_chat.py:250] Error in chat completion: "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.06 GiB is free.\n"
        'INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 500 '
        "Internal Server Error\n"
        "INFO 03-02 10:00:10 [loggers.py:111] Engine 000: Avg prompt throughput: 120.0 tokens/s, "
        "Avg generation throughput: 340.5 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV "
        "cache usage: 41.0%, Prefix cache hit rate: 0.0%\n"
    )
    assert shown(text, sigs) is None
    # The same OOM as the log's last word is a crash.
    assert shown(text.split("INFO:")[0], sigs) == "crashed"


def test_deprecation_warning_that_mentions_a_timeout_is_quiet(sigs: SignatureSet) -> None:
    text = (
        "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:4631: "
        "FutureWarning: `TimeoutError` raised by barrier() is deprecated and will be "
        "DistBackendError; a barrier timed out after timeout=600 s raises it\n"
        "INFO 03-02 10:00:00 [api_server.py:1000] Starting vLLM API server 0 on "
        "http://0.0.0.0:8000\n"
    )
    assert shown(text, sigs) is None
    # Without the warning category the same words are a timeout.
    assert shown("ERROR a barrier timed out after 600 s\n", sigs) == "timed_out"


def test_a_healthy_servers_periodic_idle_lines_are_quiet(sigs: SignatureSet) -> None:
    idle = (CORPUS / "n48_vllm16361_idle_stats.log").read_text()
    access = "".join(
        f'INFO:     10.0.0.{i % 2}:4000{i % 2} - "GET /health HTTP/1.1" 200 OK\n' for i in range(20)
    )
    assert shown(idle + access, sigs) is None
    # vLLM V0's client poll repeats the same way when idle: no livelock either.
    poll = (CORPUS / "g051_neuron1163_mqllmengine_waiting_repeats.log").read_text()
    assert shown(poll, sigs) is None


def test_a_traceback_the_server_moves_past_is_quiet(sigs: SignatureSet) -> None:
    text = (
        "ERROR 03-02 10:00:00 [serving_chat.py:250] Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_chat.py", '
        "line 240, in create_chat_completion\n"
        "    raise ValueError(msg)\n"
        "ValueError: This model's maximum context length is 8192 tokens.\n"
        "INFO 03-02 10:00:10 [loggers.py:111] Engine 000: Avg prompt throughput: 12.0 tokens/s, "
        "Avg generation throughput: 30.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n"
    )
    assert shown(text, sigs) is None
    # Ending the log, the same traceback is a crash unless a handler that survives logged it:
    # vLLM's serving layer answers that one request with an error (the class's `survived`).
    assert shown(text.split("INFO")[0], sigs) is None
    ended = (
        text.split("INFO")[0]
        .replace("[serving_chat.py:250]", "[gpu_worker.py:250]")
        .replace("entrypoints/openai/serving_chat.py", "v1/worker/gpu_worker.py")
        .replace("create_chat_completion", "execute_model")
    )
    assert shown(ended, sigs) == "crashed"


def test_a_cut_traceback_of_a_request_the_server_answered_is_quiet(sigs: SignatureSet) -> None:
    # vLLM 0.6-0.8's prefix (`serving_chat.py:N]`, no bracket before it), the traceback's header
    # cut by the excerpt: uvicorn's access line after it shows the request was answered.
    tb = (
        'ERROR 02-08 11:19:09 serving_chat.py:193]   File "/usr/lib/json/__init__.py", '
        "line 346, in loads\n"
        "ERROR 02-08 11:19:09 serving_chat.py:193]     return _default_decoder.decode(s)\n"
        'ERROR 02-08 11:19:09 serving_chat.py:193]   File "/usr/lib/python3.12/json/decoder.py", '
        "line 338, in decode\n"
        "ERROR 02-08 11:19:09 serving_chat.py:193]     obj, end = self.raw_decode(s, idx=0)\n"
        'ERROR 02-08 11:19:09 serving_chat.py:193]   File "/usr/lib/python3.12/json/decoder.py", '
        "line 356, in raw_decode\n"
        'ERROR 02-08 11:19:09 serving_chat.py:193]     raise JSONDecodeError("Expecting value")\n'
        "ERROR 02-08 11:19:09 serving_chat.py:193] json.decoder.JSONDecodeError: Expecting value: "
        "line 1 column 1 (char 0)\n"
    )
    answered = 'INFO:     10.0.0.5:1886 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
    assert shown(tb + answered, sigs) is None
    # Without the answer, a cut traceback that ends the log is still a crash.
    assert shown(tb, sigs) == "crashed"
    # Nor does an answer save a traceback a handler that survives did not log.
    other = tb.replace("serving_chat.py:193]", "gpu_worker.py:193]")
    assert shown(other + answered, sigs) == "crashed"


def test_a_traceback_through_a_request_route_is_one_requests_error(sigs: SignatureSet) -> None:
    # SGLang 0.3's chat route (srt/server.py openai_v1_chat_completions, through the OpenAI
    # adapter into TokenizerManager.generate_request), the header and exception cut: Starlette
    # answers the route's exception with a 500 and uvicorn serves on.
    route = traceback(
        (
            "/sg/lib/python3.11/site-packages/sglang/srt/server.py",
            158,
            "openai_v1_chat_completions",
            "return await v1_chat_completions(tm, raw_request)",
        ),
        (
            "/sg/lib/python3.11/site-packages/sglang/srt/openai_api/adapter.py",
            828,
            "v1_chat_completions",
            "ret = await tokenizer_manager.generate_request(",
        ),
        (
            "/sg/lib/python3.11/site-packages/sglang/srt/managers/tokenizer_manager.py",
            150,
            "generate_request",
            "async for response in self._handle_batch_request(obj, request):",
        ),
    ).split("\n", 1)[1]
    assert shown(route, sigs) is None
    # The engine's own failure re-raised into the request (vLLM V0's engine client) is no
    # request's error: a crash seen from the API side.
    engine = traceback(
        (
            "/vllm/entrypoints/openai/serving_chat.py",
            320,
            "chat_completion_stream_generator",
            "async for res in result_generator:",
        ),
        ("/vllm/engine/multiprocessing/client.py", 656, "_process_request", "raise request_output"),
    ).split("\n", 1)[1]
    assert shown(engine, sigs) == "crashed"
    # A process's own traceback, its header cut, after a route's traceback that ended: the
    # route's frame belongs to the first one.
    crash = traceback(
        ("/vllm/worker/model_runner.py", 1700, "execute_model", "hidden = model(**inputs)"),
        ("/vllm/model_executor/models/llama.py", 340, "forward", "x = layer(x)"),
    ).split("\n", 1)[1]
    served = (
        traceback(
            (
                "/vllm/entrypoints/openai/api_server.py",
                410,
                "create_chat_completion",
                "generator = await handler.create_chat_completion(request, raw_request)",
            ),
        )
        + "ValueError: too long\n"
    )
    assert shown(served, sigs) is None
    assert shown(served + crash, sigs) == "crashed"
    # Any FastAPI app's endpoint, and TensorRT-LLM's route (openai_server.py logs the traceback
    # and answers an error response), but not the executor's own error, which stops its server.
    fastapi = (
        traceback(
            (
                "/py/site-packages/uvicorn/protocols/http/httptools_impl.py",
                409,
                "run_asgi",
                "result = await app(self.scope, self.receive, self.send)",
            ),
            (
                "/py/site-packages/fastapi/routing.py",
                212,
                "run_endpoint_function",
                "return await dependant.call(**values)",
            ),
            ("/srv/app.py", 40, "chat", "return await engine.generate(prompt)"),
        )
        + "KeyError: 'messages'\n"
    )
    assert shown(fastapi, sigs) is None
    # Starlette's exception wrapper runs for http and websocket scopes only (its middleware
    # passes a lifespan straight on): a traceback through it is one request's, cut as it may be.
    starlette = traceback(
        (
            "/py/site-packages/starlette/middleware/exceptions.py",
            65,
            "__call__",
            "await wrap_app_handling_exceptions(self.app, conn)(scope, receive, send)",
        ),
        (
            "/py/site-packages/starlette/_exception_handler.py",
            53,
            "wrapped_app",
            "await app(scope, receive, sender)",
        ),
        (
            "/py/site-packages/starlette/routing.py",
            776,
            "app",
            "await route.handle(scope, receive, send)",
        ),
    ).split("\n", 1)[1]
    assert shown(starlette, sigs) is None
    # An `@app.middleware("http")` function (BaseHTTPMiddleware) and FastAPI's request handler:
    # both run only for a request.
    middleware = (
        traceback(
            (
                "/py/site-packages/starlette/middleware/base.py",
                144,
                "coro",
                "await self.app(scope, receive_or_disconnect, send_no_error)",
            ),
            ("/py/site-packages/fastapi/routing.py", 112, "app", "response = await f(request)"),
            ("/srv/app.py", 40, "chat", "return await engine.generate(prompt)"),
        ).split("\n", 1)[1]
        + "ValueError: bad sampling parameters\n"
    )
    assert shown(middleware, sigs) is None
    assert (
        shown(
            middleware.replace("fastapi/routing.py", "srv/loop.py").replace(
                "starlette/middleware/base.py", "srv/engine.py"
            ),
            sigs,
        )
        == "crashed"
    )
    # A streaming response's disconnect listener cancelled, chained to a second traceback whose
    # header ends the excerpt: the chain is one request's.
    stream = (
        traceback(
            ("/py/site-packages/starlette/responses.py", 261, "wrap", "await func()"),
            (
                "/py/site-packages/starlette/responses.py",
                238,
                "listen_for_disconnect",
                "message = await receive()",
            ),
            (
                "/py/site-packages/uvicorn/protocols/http/httptools_impl.py",
                553,
                "receive",
                "await self.message_event.wait()",
            ),
        )
        + "asyncio.exceptions.CancelledError: Cancelled by cancel scope 757f107d7cd0\n\n"
        + "During handling of the above exception, another exception occurred:\n\n"
        + "Traceback (most recent call last):\n"
    )
    assert shown(stream, sigs) is None
    engine = stream.replace("starlette/responses.py", "srv/engine.py")
    engine = engine.replace("uvicorn/protocols/http/httptools_impl.py", "srv/loop.py")
    assert shown(engine, sigs) == "crashed"
    lifespan = (
        traceback(
            (
                "/py/site-packages/starlette/routing.py",
                693,
                "lifespan",
                "async with self.lifespan_context(app) as maybe_state:",
            ),
            ("/srv/app.py", 20, "lifespan", "engine = build_engine()"),
        )
        + "RuntimeError: no GPU\n"
    )
    assert shown(lifespan, sigs) == "crashed"
    trt = traceback(
        (
            "/py/site-packages/tensorrt_llm/serve/openai_server.py",
            478,
            "openai_chat",
            "response = await create_chat_response(promise, postproc_params)",
        ),
        (
            "/py/site-packages/tensorrt_llm/executor/result.py",
            700,
            "aresult",
            "await self._aresult_step()",
        ),
    )
    assert shown(trt + "ValueError: bad stop words\n", sigs) is None
    dead = trt + "tensorrt_llm.executor.utils.CppExecutorError: Executor loop crashed\n"
    assert shown(dead, sigs) == "crashed"
    # A serving class's constructor runs at start-up, not for a request.
    init = (
        traceback(
            ("/vllm/entrypoints/openai/api_server.py", 900, "run_server", "await init_app_state()"),
            ("/vllm/entrypoints/openai/serving_chat.py", 60, "__init__", "self.load_template()"),
        )
        + "ValueError: bad chat template\n"
    )
    assert shown(init, sigs) == "crashed"


@pytest.mark.parametrize(
    "exc",
    [
        # FastAPI answers the request with the exception's status.
        "fastapi.exceptions.HTTPException: 500: error during inference",
        # TensorRT-LLM's executor ended the active requests with this error and steps on
        # (executorImpl.cpp forwardAsync); a request handler raised it again.
        "c_python_backend_utils.TritonModelException: Executor failed process requestId 16 due"
        " to the following error: Encountered an error in forwardAsync function: [TensorRT-LLM]"
        "[ERROR] Assertion failed: mNextBlocks.empty()",
    ],
)
def test_a_request_answered_with_an_error_is_no_crash(exc: str, sigs: SignatureSet) -> None:
    tb = traceback(
        ("/srv/model.py", 94, "execute", "for res in res_gen:"),
        ("/srv/lib/decode.py", 190, "decode", "gen_response = self._generate()"),
        ("/srv/lib/handler.py", 136, "_generate", "raise err"),
    )
    assert shown(tb + exc + "\n", sigs) is None
    # The same traceback ending in an error nobody answered is a crash.
    assert shown(
        tb + "RuntimeError: CUDA error: an illegal memory access was encountered\n", sigs
    ) == ("crashed")


def test_a_sticky_cuda_error_the_executor_ends_requests_with_is_a_crash(
    sigs: SignatureSet,
) -> None:
    # CUDA leaves the context unusable after an illegal address (cudaErrorIllegalAddress): the
    # executor's next step fails with it again, whatever it did with the requests.
    line = (
        "[TensorRT-LLM][ERROR] Encountered an error in forwardAsync function: [TensorRT-LLM]"
        "[ERROR] CUDA runtime error in cudaMemcpyAsync(dst, src.data(), src.getSizeInBytes(), "
        "cudaMemcpyDefault, mStream->get()): an illegal memory access was encountered "
        "(/src/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:156)\n"
    )
    assert shown(line, sigs) == "crashed"
    handled = line.replace("CUDA runtime error in", "Assertion failed in").replace(
        "an illegal memory access was encountered", "mNextBlocks.empty()"
    )
    assert shown(handled, sigs) is None


def test_a_stop_escalated_from_sigterm_to_sigkill_is_no_crash(sigs: SignatureSet) -> None:
    # llm-d fast-model-actuation's launcher stopping an instance it began stopping with SIGTERM.
    stop = (
        "2026-09-18 15:09:03,397 - INFO - Stopping pid 1371 with SIGTERM because it remains\n"
        "2026-09-18 15:09:03,397 - INFO - Stopping pid 1358 with SIGKILL because SIGTERM "
        "was not enough\n"
    )
    assert shown(stop, sigs) is None
    # A SIGKILL nobody escalated to is still a death.
    assert shown("Worker 1358 was killed by SIGKILL\n", sigs) == "crashed"


def test_ctrl_c_and_a_connect_nccl_retries_are_no_failure(sigs: SignatureSet) -> None:
    # CPython's SIGINT handler raises KeyboardInterrupt: the stop someone asked for.
    ctrl_c = traceback(
        ("/srv/test.py", 96, "<module>", "main()"),
        ("/srv/test.py", 56, "main", "res = engine.generate(prompt)"),
        ("/srv/omni.py", 859, "_run_generation", "time.sleep(0.005)"),
    ) + ("KeyboardInterrupt\n")
    assert shown(ctrl_c, sigs) is None
    assert shown(ctrl_c.replace("KeyboardInterrupt", "RuntimeError: boom"), sigs) == "crashed"
    # NCCL src/misc/socket.cc: one connect attempt timed out, and it is retried.
    retry = (
        "[misc/socket.cc:602] NCCL WARN socketPollConnect poll() failed, ret 1, error Connection "
        "timed out, revents 8, connect to 172.16.30.229:39953\n"
        "[misc/socket.cc:551] NCCL INFO socketPollConnect: connect returned Connection timed out, "
        "retrying (1/34) after sleep for 100 msec\n"
    )
    assert shown(retry, sigs) is None
    assert shown("[rank1]: RuntimeError: Connection timed out after 600 s\n", sigs) == "timed_out"


def test_route_frames_a_terminal_wrapped_are_read_whole(sigs: SignatureSet) -> None:
    # A terminal wraps every line at its width, inside a frame's path, in `line N` or before the
    # function's name: the frames are joined again before they are read, and uvicorn's
    # run_asgi frame still marks one request's traceback.
    site = "/srv/venv/lib/python3.10/site-packages"
    wrapped = (
        "Traceback (most recent call last):\n"
        f'  File "{site}/uvicorn/protocols/http/httptools_impl.py\n'
        '", line 409, in run_asgi\n'
        "    result = await app(  # type: ignore[func-returns-value]\n"
        f'  File "{site}/uvicorn/middleware/proxy_headers.py", li\n'
        "ne 60, in __call__\n"
        "    return await self.app(scope, receive, send)\n"
        f'  File "{site}/starlette/applications.py", line 112, in\n'
        " __call__\n"
        "    await self.middleware_stack(scope, receive, send)\n"
    )
    assert shown(wrapped, sigs) is None
    # The same wrapped frames of a start-up (no route among them) are a crash.
    startup = wrapped.replace("uvicorn/protocols/http/httptools_impl", "vllm/engine/core")
    assert shown(startup, sigs) == "crashed"


def test_uvicorns_per_request_exception_is_no_crash(sigs: SignatureSet) -> None:
    # uvicorn run_asgi logs an app's exception for one request and answers it 500.
    tb = traceback(
        ("/usr/lib/uvicorn/protocols/http/httptools_impl.py", 426, "run_asgi", "await app()"),
        ("/usr/lib/vllm/entrypoints/openai/api_server.py", 100, "create", "raise ValueError(m)"),
        ("/usr/lib/vllm/sampling_params.py", 180, "_verify_args", "raise ValueError(m)"),
    ) + ("ValueError: max_tokens must be at least 1, got -1.\n")
    assert shown("ERROR:    Exception in ASGI application\n" + tb, sigs) is None
    # run_asgi's frame alone says the same (uvicorn runs it for an HTTP request only); the same
    # exception out of the server's start-up is a crash.
    assert shown(tb, sigs) is None
    startup = traceback(
        ("/usr/lib/vllm/entrypoints/openai/api_server.py", 100, "run_server", "await init()"),
        ("/usr/lib/vllm/sampling_params.py", 180, "_verify_args", "raise ValueError(m)"),
    ) + ("ValueError: max_tokens must be at least 1, got -1.\n")
    assert shown(startup, sigs) == "crashed"


def test_a_timeout_that_ends_in_a_crash_is_a_timeout(sigs: SignatureSet) -> None:
    text = (
        "[rank0]: RuntimeError: rpc call timed out after 300 s\nSegmentation fault (core dumped)\n"
    )
    data = text.encode()
    _, evs = read_log(data, sigs, PATTERNS)
    cv = log_classes(evs, data, sigs)
    assert cv is not None and cv.primary.cls.id == "timed_out" and cv.state == "dead"


def test_a_ucx_endpoint_timeout_is_a_timeout(sigs: SignatureSet) -> None:
    # NIXL's UCX backend reports UCS_ERR_ENDPOINT_TIMEOUT by UCX's own status string.
    text = (
        "W0613 08:28:11.555796    7053 ucx_utils.cpp:43] Unexpected UCX error: Endpoint timeout\n"
    )
    assert shown(text, sigs) == "timed_out"


# --- a process killed or failed, as its supervisor says it (lines in each one's own words) ---

HEALTHY_TAIL = (
    "INFO 03-02 10:00:10 [loggers.py:111] Engine 000: Avg prompt throughput: 12.0 tokens/s, "
    "Avg generation throughput: 30.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n"
)


@pytest.mark.parametrize(
    "line",
    [
        # Open MPI's mpirun, after a TensorRT-LLM rank dies.
        "mpirun noticed that process rank 3 with PID 0 on node gpu-07 exited on signal 11 "
        "(Segmentation fault).",
        "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD with errorcode 1.",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        # torchrun (torch elastic) on a worker killed by the kernel.
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) "
        "local_rank: 0 (pid: 4242) of binary: /usr/bin/python3",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        # Ray, under a vLLM Ray executor.
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        # The kernel's OOM killer and a memory cgroup, as dmesg or the journal shows them.
        "kernel: Out of memory: Killed process 91234 (python3) total-vm:812345678kB, "
        "anon-rss:70123456kB",
        "kernel: Memory cgroup out of memory: Killed process 5150 (VLLM::EngineCor) total-vm:1kB",
        "kernel: python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE)",
        # systemd and Kubernetes.
        "vllm.service: Main process exited, code=killed, status=9/KILL",
        "vllm.service: Failed with result 'oom-kill'.",
        "      Reason:       OOMKilled",
        # glibc aborting the process, and the shell's death lines.
        "double free or corruption (!prev)",
        "*** stack smashing detected ***: terminated",
        "Bus error (core dumped)",
        # (`Illegal instruction (core dumped)` names build_machine_mismatch now:
        # tests/test_causes_mechanisms.py)
        # torch's driver-API check and cuBLAS.
        "RuntimeError: CUDA driver error: unknown error",
        "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle)`",
        # A container's end as its platform or a harness reports it, a model server that could
        # not load its model, and LLVM's fatal error (Triton's JIT compiler, in-process).
        "  Warning  BackOff  2m (x14 over 9m)  kubelet  Back-off restarting failed container "
        "vllm in pod vllm-0_default(3f1c)",
        "16:53:24 - ❌ Crashed container in pod: vllm-standalone-845945945-dljsw, container: vllm",
        "E0218 20:57:33.147956 130 model_lifecycle.cc:654] \"failed to load 'ensemble' version "
        '1: Internal: unexpected error when creating modelInstanceState"',
        "error: creating server: Internal - failed to load all models",
        "E0625 08:07:38.858565 1073 model_repository_manager.cc:579] Invalid argument: ensemble "
        "'ensemble' depends on 'tensorrt_llm' which has no loaded version. Model 'tensorrt_llm' "
        "loading failed with error: version 1 is at UNAVAILABLE state: Invalid argument",
        "LLVM ERROR: Failed to compute parent layout for slice layout.",
        # Open MPI's job abort, nccl-tests' checks failing, and a Rust thread's panic.
        "a non-zero exit code. Per user-direction, the job has been aborted.",
        "c2211f46f318: Test NCCL failure common.cu:1005 'unhandled CUDA error'",
        " .. fengyun pid 3164639: Test failure common.cu:844",
        "thread '<unnamed>' panicked at /opt/dynamo/lib/runtime/src/storage/kv.rs:440:29:",
        # NVSHMEM's IB transport failing to create an endpoint's queue pair (ibrc.cpp ep_create).
        "/workspace/nvshmem/src/modules/transport/ibrc/ibrc.cpp:349: NULL value qp creation failed",
        # torch's std::terminate handler (Windows), and a Ray Serve replica that did not start.
        "Unhandled exception caught in c10/util/AbortHandler.h",
        "          A replica failed to start with exception. Retrying 19 more time(s). Error:",
        # A pod's last container exit (kubectl describe), and TensorRT-LLM's exception frames
        # through a plugin deserialized with the engine.
        "      Exit Code:    137",
        "5       0x7fb30cc1dcef tensorrt_llm::plugins::GemmPluginCreator::deserializePlugin(char "
        "const*, void const*, unsigned long) + 191",
        # Triton's model table: a model that did not load, with its Status (core status.cc).
        "| tensorrt_llm | 1       | UNAVAILABLE: Not found: unable to load shared library: "
        "/opt/tritonserver/backends/tensorrtllm/libtriton_tensorrtllm.so: undefined symbol: "
        "_ZNK12tensorrt_llm8executor8Response11getErrorMsgB5cxx11Ev |",
        # SGLang's CUDA-graph capture failing at start-up (cuda_graph_runner.py), DeepEP's host
        # assertion (exception.cuh EP_HOST_ASSERT) and nvcc failing a JIT build.
        "Exception: Capture cuda graph failed: Error in function 'run' at",
        "RuntimeError: Failed: Assertion error /workspace/DeepEP/csrc/kernels/internode.cu:1713 "
        "'num_max_nvl_chunked_recv_tokens / num_rdma_ranks > 0'",
        '7 errors detected in the compilation of "/root/.cache/flashinfer/0.6.4/90a/generated/'
        'gdn_prefill_sm90/gdn_prefill_kernel.cu".',
        # TensorRT-LLM's builder got no engine from TensorRT (builder.py build_engine).
        "[08/11/2024-06:10:36] [TRT-LLM] [E] Engine building failed, please check the error log.",
        # Ray: an actor whose constructor raised.
        "Exception raised in creation task: The actor died because of an error raised in its "
        "creation task, ray::AsyncVLLMInferenceEngine.__init__() (pid=31036)",
    ],
)
def test_a_process_killed_or_failed_is_a_crash(line: str, sigs: SignatureSet) -> None:
    assert shown(line + "\n", sigs) == "crashed"
    # A death line the server's own progress came after is not a verdict on the server now.
    assert shown(line + "\n" + HEALTHY_TAIL, sigs) is None


@pytest.mark.parametrize(
    "line",
    [
        "vllm.service: Main process exited, code=exited, status=0/SUCCESS",
        "vllm.service: Deactivated successfully.",
        "torch.distributed.elastic.multiprocessing.api: [INFO] Sending process 4242 closing "
        "signal SIGTERM",
        "mpirun: process rank 0 exited normally",
        "INFO 03-02 10:00:00 [scheduler.py:1] Request cmpl-1 aborted by the client",
        "CUBLAS_STATUS_SUCCESS returned by cublasCreate",
        # An image the kubelet cannot pull yet: the container never ran, nothing crashed.
        '  Warning  Failed   1m  kubelet  Back-off pulling image "vllm/vllm-openai:v0.32.0"',
        'I0218 20:57:40.127411 130 model_lifecycle.cc:835] "successfully loaded '
        "'tensorrt_llm' version 1\"",
        # A container that completed.
        "      Exit Code:    0",
        # Triton's table for a model unloaded on request.
        "| tensorrt_llm | 1       | UNAVAILABLE: unloaded |",
    ],
)
def test_orderly_exits_and_lookalikes_are_quiet(line: str, sigs: SignatureSet) -> None:
    assert shown(line + "\n", sigs) is None


# --- the data: parsed, validated, replaceable -----------------------------------------------


def test_a_bad_generic_class_is_an_error_naming_file_entry_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text('[[generic]]\nid = "mine"\n[[generic.rule]]\nkind = "sometimes"\n')
    with pytest.raises(SignatureError, match=r"mine\.toml: generic 'mine': rule\[0\]: key 'kind'"):
        load_file(bad)
    bad.write_text(
        '[[generic]]\nid = "mine"\nstate = "sad"\n[[generic.rule]]\nkind = "same_lines"\n'
    )
    with pytest.raises(SignatureError, match=r"generic 'mine': key 'state'"):
        load_file(bad)
    bad.write_text('[[generic]]\nid = "mine"\n[[generic.rule]]\nkind = "line"\n')
    with pytest.raises(SignatureError, match=r"rule\[0\]: key 'pattern'"):
        load_file(bad)


def test_an_operator_class_with_a_shipped_id_replaces_it_in_place(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[[generic]]\nid = "crashed"\nstate = "dead"\ntitle = "ours"\n'
        "[[generic.rule]]\nkind = \"line\"\npattern = 'OUR_FATAL'\n"
    )
    merged = load_signatures([mine])
    ids = [c.id for c in merged.generic]
    assert ids == [c.id for c in load_signatures().generic]
    crashed = next(c for c in merged.generic if c.id == "crashed")
    assert crashed.title == "ours" and len(crashed.rules) == 1
    assert shown("boom OUR_FATAL\n", merged) == "crashed"
    assert shown("Fatal Python error: Segmentation fault\n", merged) is None


def test_generic_patterns_keep_their_lines_in_the_live_source(sigs: SignatureSet) -> None:
    keep = sigs.log_keep_pattern()
    assert keep is not None and keep.search("NVRM: Xid (PCI:0000:10:00): 31, pid=1")
    assert keep.search("[4] /opt/lib/libplugin.so(_ZN6plugin7enqueueEv+0x4a)[0x7f0000004123]")
    assert keep.search("It looks like orte_init failed for some reason; your parallel process is")
    assert keep.search("[2026-03-02 10:00:00] Rank 0 scheduler is dead. Please check the logs.")


# --- the same classes in a live verdict (run / diagnose) ------------------------------------


def test_live_crash_line_after_the_last_progress_is_reported(sigs: SignatureSet) -> None:
    tl = Timeline(procs=procs(), server=ServerSample(up=True, health_status=200))
    tl.ticks(3)
    crash = events(
        [
            "(Worker_TP1 pid=7) ERROR 03-02 10:00:00 RuntimeError: CUDA error: an illegal"
            " memory access was encountered"
        ],
        sigs,
    )
    tl.tick(logs=crash)
    tl.ticks(2)
    v = final(tl.obs, sigs)
    assert v.signature is None and v.state == "dead"
    assert (
        v.evidence[0].kind == "generic:crashed" and "illegal memory access" in v.evidence[0].detail
    )
    assert "py-spy" in v.fix and v.commands


def test_live_line_the_server_progressed_past_is_not_reported(sigs: SignatureSet) -> None:
    tl = Timeline(procs=procs(), server=ServerSample(up=True, health_status=200))
    oom = events(["ERROR 03-02 10:00:00 torch.OutOfMemoryError: CUDA out of memory."], sigs)
    tl.tick(logs=oom)
    stats = events(
        [
            "INFO 03-02 10:00:10 [loggers.py:111] Engine 000: Avg prompt throughput: 10.0 tokens/s,"
            " Avg generation throughput: 50.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs"
        ],
        sigs,
    )
    tl.tick(logs=stats)
    tl.ticks(2)
    v = final(tl.obs, sigs)
    assert not any(e.kind.startswith("generic:") for e in v.evidence), v


def test_live_wait_lines_during_a_compile_leave_the_compile_alone(sigs: SignatureSet) -> None:
    """vLLM logs its shm broadcast wait during long compiles too: no `stalled` over `compiling`."""
    wait = events(
        [
            "(EngineCore_DP0 pid=9) INFO 03-02 10:00:00 [shm_broadcast.py:466] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when some "
            "processes are hanging or doing some time-consuming work (e.g. compilation)."
        ],
        sigs,
    )
    tl = Timeline(procs=procs(compilers=("nvcc",)))
    tl.tick()
    tl.tick(logs=wait)
    tl.tick(logs=wait)
    v = final(tl.obs, sigs)
    assert v.state == "compiling" and not any(e.kind.startswith("generic:") for e in v.evidence)
    # The same two lines while serving are a stall the log shows.
    tl2 = Timeline(procs=procs(), server=ServerSample(up=True, health_status=200))
    tl2.tick()  # the window's first tick is its own start
    tl2.tick(logs=wait)
    tl2.tick(logs=wait)
    v2 = final(tl2.obs, sigs)
    assert v2.state == "stalled" and v2.evidence[0].kind == "generic:stalled"


# --- tracebacks: how a log ends inside one, and frames that are no traceback ------------------


def test_a_traceback_ending_in_a_bare_exception_is_a_crash(sigs: SignatureSet) -> None:
    # `raise Exception(...)` prints `Exception: ...`: no prefix before the word.
    text = (
        '  File "/srv/app/runtime.py", line 38, in wrapper\n'
        "    runtime = connect(loop)\n"
        '  File "/srv/app/client.py", line 12, in connect\n'
        "    raise Exception(f'no control plane at {url}')\n"
        "Exception: no control plane at http://127.0.0.1:2379\n"
    )
    assert shown(text, sigs) == "crashed"


def test_two_processes_tracebacks_ending_interleaved_with_carets_are_a_crash(
    sigs: SignatureSet,
) -> None:
    # Two workers print the same traceback at once; Python 3.11+ marks each expression with
    # carets. After the last frame come both code lines, both exceptions and their carets.
    frame = '  File "/srv/app/worker.py", line 90, in start\n'
    text = (
        frame
        + frame
        + "    self.comm = Comm(rank)\n"
        + "    self.comm = Comm(rank)\n"
        + "                ^^^^^^^^^^\n"
        + "RuntimeError: rendezvous store unreachable\n"
        + "                ^^^^^^^^^^\n"
        + "RuntimeError: rendezvous store unreachable\n"
    )
    assert shown(text, sigs) == "crashed"


def test_a_stack_dump_innermost_frame_first_is_no_crash(sigs: SignatureSet) -> None:
    # py-spy and faulthandler print the innermost frame first: each code line calls the frame
    # above it. A thread parked in a wait, not a traceback cut before its exception.
    text = (
        '  File "/usr/lib/python3.12/threading.py", line 359, in wait\n'
        "    waiter.acquire()\n"
        '  File "/srv/app/queue.py", line 41, in get_result\n'
        "    self.ready.wait()\n"
        '  File "/srv/app/loop.py", line 7, in step\n'
        "    out = q.get_result()\n"
    )
    assert shown(text, sigs) is None
    # The same frames outermost first (a traceback whose end the log lost) are a crash.
    outer_first = (
        '  File "/srv/app/loop.py", line 7, in step\n'
        "    out = q.get_result()\n"
        '  File "/srv/app/queue.py", line 41, in get_result\n'
        "    self.ready.wait()\n"
        '  File "/usr/lib/python3.12/threading.py", line 359, in wait\n'
        "    waiter.acquire()\n"
    )
    assert shown(outer_first, sigs) == "crashed"


@pytest.mark.parametrize("level", ["[TRT-LLM] [V]", "WARNING", "DEBUG"])
def test_a_traceback_logged_below_error_is_handled(level: str, sigs: SignatureSet) -> None:
    # A request's error logged for the record (the server answers 500 and serves on).
    text = (
        f"[03/02/2026-10:00:00] {level} request failed: Traceback (most recent call last):\n"
        '  File "/srv/app/server.py", line 957, in chat\n'
        "    response = await make_response(promise)\n"
        '  File "/srv/app/result.py", line 794, in make_response\n'
        "    await promise.result()\n"
    )
    assert shown(text, sigs) is None
    assert shown(text.replace(level, "ERROR"), sigs) == "crashed"


_FRAMES = (
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/x.py", line 88, in run\n'
    "    out = self.step(req)\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/y.py", line 41, in step\n'
    "    raise ValueError(msg)\n"
    "ValueError: the request cannot be served\n"
)


@pytest.mark.parametrize(
    ("record", "prefixed"),
    [
        # vLLM's OpenAI serving layer, per request (0.32 `serving.py`; older `serving_chat.py`).
        ("ERROR 12-04 10:00:00 [serving.py:412] Error in preprocessing prompt inputs", False),
        ("ERROR 12-04 10:00:00 [serving_chat.py:230] Error in preprocessing prompt inputs", False),
        ("ERROR 12-04 10:00:00 [hermes_tool_parser.py:117] Error in extracting tool call", False),
        # A utility call's exception goes back to its caller (v1/engine/core.py).
        (
            "(EngineCore pid=7) ERROR 12-04 10:00:00 [core.py:1750] Invocation of "
            "collective_rpc method failed",
            True,
        ),
        # One KV transfer or handshake failed (the NIXL connector's _log_failure).
        (
            "(Worker_TP0 pid=9) ERROR 12-04 10:00:00 [nixl_connector.py:1263] NIXL transfer "
            "failure: handshake_setup_failed | Context: {}",
            True,
        ),
    ],
)
def test_a_traceback_a_handler_logs_and_survives_is_quiet(
    record: str, prefixed: bool, sigs: SignatureSet
) -> None:
    prefix = record.split("] ", 1)[0] + "] " if prefixed else ""
    frames = "".join(prefix + line + "\n" for line in _FRAMES.splitlines())
    assert shown(record + "\n" + frames, sigs) is None
    # The same traceback under a record that is not such a handler's is the end of a process.
    fatal = "(Worker pid=7) ERROR 12-04 10:00:00 [runner.py:900] the step failed"
    fatal_prefix = fatal.split("] ", 1)[0] + "] " if prefixed else ""
    frames = "".join(fatal_prefix + line + "\n" for line in _FRAMES.splitlines())
    assert shown(fatal + "\n" + frames, sigs) == "crashed"


def test_survived_is_read_from_the_class_data(tmp_path: Path) -> None:
    """An operator's class names its own survived handlers; a bad pattern is an error naming
    the key."""
    text = "ERROR 12-04 10:00:00 [my_handler.py:3] request 12 failed\n" + _FRAMES
    mine = tmp_path / "mine.toml"
    entry = (
        '[[generic]]\nid = "crashed"\nstate = "dead"\ntitle = "t"\nneeds = "n"\n'
        "commands = []\nsurvived = [{survived}]\n"
        '[[generic.rule]]\nkind = "traceback_end"\nlabel = "a traceback"\n'
    )
    mine.write_text(entry.format(survived=""))
    assert shown(text, load_file(mine)) == "crashed"
    mine.write_text(entry.format(survived="'request \\d+ failed'"))
    assert shown(text, load_file(mine)) is None
    mine.write_text(entry.format(survived="'(unclosed'"))
    with pytest.raises(SignatureError, match=r"generic 'crashed': key 'survived'"):
        load_file(mine)


# --- native and launcher deaths ----------------------------------------------------------------


def test_a_native_backtrace_of_three_frames_is_a_crash(sigs: SignatureSet) -> None:
    frame = "[{n}] /opt/lib/libplugin.so(_ZN6plugin7enqueueEv+0x{n}a)[0x7f00000{n}123]\n"
    three = "".join(frame.format(n=n) for n in (3, 4, 5))
    assert shown(three, sigs) == "crashed"
    assert shown(three[: three.index("[5]")], sigs) is None  # two frames are not enough
    # TensorRT-LLM's own exception frames are another format (errors it may serve past).
    own = "".join(f"{n}       0x7fac7ac778fd tensorrt_llm::common::run() + 97\n" for n in (1, 2, 3))
    assert shown(own, sigs) is None


@pytest.mark.parametrize(
    "text",
    [
        # Open MPI's help text (orte/runtime/help-orte-runtime.txt), wrapped as it prints it.
        "It looks like orte_init failed for some reason; your parallel process is\n"
        "likely to abort.  There are many reasons that a parallel process can\n",
        "It looks like MPI_INIT failed for some reason; your parallel process is\n",
        # torch's older NCCL check: `Error`, capitalised.
        "[rank3]: RuntimeError: NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO)\n",
    ],
)
def test_launcher_and_library_death_lines_are_a_crash(text: str, sigs: SignatureSet) -> None:
    assert shown(text, sigs) == "crashed"
    assert shown(text + HEALTHY_TAIL, sigs) is None


@pytest.mark.parametrize(
    "line",
    [
        # SGLang's overlap thread and detokenizer SIGQUIT the launcher as the scheduler does.
        "[2026-03-02 10:00:00 TP1] TpModelWorkerClient hit an exception: Traceback (most recent",
        "[2026-03-02 10:00:00] DetokenizerManager hit an exception: Traceback (most recent",
        # The launcher, when a scheduler died before it was ready.
        "[2026-03-02 10:00:00] Rank 0 scheduler is dead. Please check if there are relevant logs.",
    ],
)
def test_sglang_children_that_kill_the_launcher_name_the_child_failure(
    line: str, sigs: SignatureSet
) -> None:
    _, evs = read_log((line + "\n").encode(), sigs, PATTERNS)
    assert [m.signature.id for m in name_signatures(evs, sigs)] == ["sglang_scheduler_crashed"]


# --- the same readings in other launchers' and releases' words --------------------------------


def test_a_traceback_cut_inside_a_frame_path_or_after_one_frame_is_a_crash(
    sigs: SignatureSet,
) -> None:
    cut = (
        "[10:00:08 TP4] Exception in model runner:\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/app/runner.py", line 147, in __init__\n'
        "    self.capture()\n"
        '  File "/srv/app/gra\n'
    )
    assert shown(cut, sigs) == "crashed"
    one = (
        "Traceback (most recent call last):\n"
        '  File "/srv/run.py", line 504, in <module>\n'
        "    main()\n"
    )
    assert shown(one, sigs) == "crashed"
    # One frame without the header is a line that names a file, nothing more...
    assert shown('  File "/srv/run.py", line 504, in <module>\n    main()\n', sigs) is None
    # ... unless the exception that ends the log follows it: then the excepthook's last line
    # reads as it does alone (a thread's traceback, its header cut).
    thread = (
        "Exception in thread Thread-1 (_manager_spawn):\n"
        '  File "/srv/mpi4py/futures/_lib.py", line 938, in client_spawn\n'
        "    comm = MPI.COMM_SELF.Spawn(python_exe, args, max_workers, info)\n"
        "mpi4py.MPI.Exception: MPI_ERR_UNKNOWN: unknown error\n"
    )
    assert shown(thread, sigs) == "crashed"
    assert shown(thread + HEALTHY_TAIL, sigs) is None
    # A log that stops at a header: the traceback it begins was cut; logged below ERROR it is
    # a handled error's record.
    header = (
        "[11/21/2024-10:26:11] [TRT-LLM] [I] Executor shutdown.\n"
        "Traceback (most recent call last):\n"
    )
    assert shown(header, sigs) == "crashed"
    assert (
        shown("WARNING 03-02 10:00:00 [x.py:1] Traceback (most recent call last):\n", sigs) is None
    )


def test_an_uncaught_exception_line_ends_the_log_but_a_logged_one_does_not(
    sigs: SignatureSet,
) -> None:
    # Python's excepthook prints the last line unprefixed; its message may run on.
    text = "AssertionError: profiling saw no free memory change.\nCheck other processes.\n"
    assert shown(text, sigs) == "crashed"
    # A logger's ERROR line with an exception in it may be one the code handled and served past.
    logged = (
        "(Worker pid=7) ERROR 03-02 10:00:00 [connector.py:815] RuntimeError: remote agent id "
        "mismatch\n(Worker pid=7) ERROR 03-02 10:00:00 [connector.py:827] Handshake failed for "
        "request 1\n"
    )
    assert shown(logged, sigs) is None


@pytest.mark.parametrize("prefix", [" 7: ", "12: ", "[1,7]<stderr>:"])
def test_rank_tags_of_srun_and_mpirun_are_read_through(prefix: str, sigs: SignatureSet) -> None:
    frames = (
        "Traceback (most recent call last):",
        '  File "/srv/app/loader.py", line 48, in from_config',
        "    model = cls(config)",
        '  File "/srv/app/model.py", line 1640, in __init__',
        "    self.layers = build(config)",
    )
    text = "".join(prefix + f + "\n" for f in frames)
    assert shown(text, sigs) == "crashed"


def test_sglangs_fatal_out_of_memory_is_a_crash_and_its_retract_is_not(sigs: SignatureSet) -> None:
    fatal = (
        "RuntimeError: Prefill out of memory. Try to lower your batch size.\n"
        "Try to allocate 9 tokens.\n"
    )
    assert shown(fatal, sigs) == "crashed"
    retract = (
        "[2026-03-02 10:00:00 TP0] Decode out of memory happened. #retracted_reqs: 1, "
        "#new_token_ratio: 0.1 -> 0.2\n"
    )
    assert shown(retract, sigs) is None


def test_the_heartbeat_monitor_is_a_timeout_not_a_named_collective(sigs: SignatureSet) -> None:
    # torch ProcessGroupNCCL.cpp HeartbeatMonitor's message (it mentions a timeout setting).
    line = (
        "[rank1]:[F302 10:00:00.1 ProcessGroupNCCL.cpp:1169] [PG 2 Rank 1] ProcessGroupNCCL's "
        "watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives. ... you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC)\n"
    )
    assert shown(line, sigs) == "timed_out"
