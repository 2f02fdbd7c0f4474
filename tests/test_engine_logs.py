"""Engine log formats read through the profiles: SGLang and TensorRT-LLM lines, linear time,
and lines whose numbers do not convert."""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

from tests.shipped import PATTERNS
from watchdog.core.model import LogEvent, Observation
from watchdog.core.state.window import Window
from watchdog.sources.logs import parse

# Lines read in the shipped engines' formats, as the daemon's log source reads them.
parse_line = functools.partial(parse.parse_line, patterns=PATTERNS)


DATA = Path(__file__).parent / "data" / "logs"


def events(name: str) -> list[LogEvent]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return [ev for ev in (parse_line(x, source=name) for x in lines) if ev is not None]


def test_sglang_decode_batch_old_format_with_rank_prefix() -> None:
    ev = events("i_sgl3909_decode_batch_tp0.log")[0]
    assert ev.kind == "stats"
    f = ev.fields
    assert (f["running"], f["waiting"], f["gen_tps"], f["rank"]) == (8, 0, 186.64, 0)
    assert f["stepped"] is True and f["batch"] == "decode" and f["ranks"] == "TP0"


def test_sglang_prefill_and_decode_comma_format() -> None:
    stats = [e for e in events("i_sgl22166_prefill_decode_comma_format.log") if e.kind == "stats"]
    decode = next(e.fields for e in stats if e.fields["batch"] == "decode")
    prefill = next(e.fields for e in stats if e.fields["batch"] == "prefill")
    assert (decode["running"], decode["waiting"], decode["gen_tps"]) == (32, 0, 1635.11)
    assert (prefill["new_tokens"], prefill["running"], prefill["prompt_tps"]) == (158, 31, 559.53)
    assert "rank" not in decode  # no rank prefix at TP=1


def test_sglang_oldest_prefill_format_with_queue() -> None:
    stats = [e for e in events("i_sgl1612_prefill_batch_time_only_prefix.log") if e.kind == "stats"]
    assert stats[1].fields["waiting"] == 38 and stats[1].fields["running"] == 1
    assert stats[1].fields["prompt_tps"] is None  # that release logged no throughput


def test_sglang_own_watchdog_and_sigquit_lines() -> None:
    evs = events("i_sgl3752_scheduler_watchdog_timeout.log")
    kinds = [e.kind for e in evs]
    assert kinds.count("watchdog") == 8 and kinds.count("crash") == 1
    assert {e.fields["rank"] for e in evs if e.kind == "watchdog"} == set(range(8))
    assert evs[0].fields["seconds"] == 300.0
    new = parse_line(
        "[2026-05-01 10:00:00] Scheduler watchdog timeout (self.watchdog_timeout=300, "
        "self.soft=False)"
    )
    assert new is not None and new.kind == "watchdog" and new.fields["soft"] == "False"


def test_sglang_startup_phases() -> None:
    # Format strings from sglang 0.5.23 srt/model_executor/model_runner.py (Load weight
    # begin/end), model_runner_components/cuda_graph_setup.py, entrypoints/http_server.py.
    lines = {
        "[2026-05-01 10:00:00] Load weight begin. avail mem=78.12 GB": "loading",
        "[2026-05-01 10:00:09] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
        "avail mem=62.10 GB, mem usage=16.02 GB.": "milestone",
        "[2026-05-01 10:00:10] Capture cuda graph begin. This can take up to several minutes. "
        "avail mem=20.25 GB": "capture",
        "Capturing batches (bs=160 avail_mem=20.25 GB):  23%|██▎       | 8/35 "
        "[00:02<00:06,  3.90it/s]": "capture",
        "[2026-05-01 10:00:20] Capture cuda graph end. Time elapsed: 9.87 s. mem usage=0.5 GB.": (
            "milestone"
        ),
        "[2026-05-01 10:00:31] The server is fired up and ready to roll!": "milestone",
    }
    got = {line: getattr(parse_line(line), "kind", None) for line in lines}
    assert got == lines


def test_sglang_window_progress_from_batch_lines() -> None:
    w = Window(span_s=60)
    for t, line in enumerate(
        (DATA / "i_sgl3909_decode_batch_tp0.log").read_text(encoding="utf-8").splitlines()
    ):
        ev = parse_line(line)
        w.append(Observation(t=float(t), wall=float(t), logs=(ev,) if ev else ()))
    assert w.progress.phase == "ready" and w.progress.stats_pending
    assert w.progress.last_progress_t == 8.0


def test_trtllm_iteration_line_hang_detector_and_forward_error() -> None:
    # tensorrt_llm/logger.py Logger.log prefix; py_executor.py _executor_loop iteration line
    it = parse_line(
        "[05/01/2026-10:00:00] [TRT-LLM] [I] iter = 120, global_rank = 0, rank = 0, "
        "currank_total_requests = 8/8, host_step_time = 21.5ms, prev_device_step_time = "
        "20.1ms, timestamp = 2026-05-01 10:00:00, num_scheduled_requests: 8, states = "
        "{'num_ctx_requests': 0, 'num_ctx_tokens': 0, 'num_generation_tokens': 8}"
    )
    assert it is not None and it.kind == "stats"
    assert (it.fields["iteration"], it.fields["running"], it.fields["stepped"]) == (120, 8, True)
    hang = parse_line("[TRT-LLM] [MPI_Rank 3] [E] Hang detected after 300 seconds.")
    assert hang is not None and hang.kind == "watchdog"
    assert (hang.fields["seconds"], hang.fields["rank"]) == (300.0, 3)
    err = parse_line("[TRT-LLM] [E] Encountered an error in forward function: CUDA error: x")
    assert err is not None and err.kind == "line" and err.fields["error"] == "CUDA error: x"
    assert err.fields["fatal"] is False  # _forward_step fails the batch and serves on


CORPUS = Path(__file__).parent / "data" / "corpus"


def corpus_lines(name: str) -> list[str]:
    return (CORPUS / name).read_text(encoding="utf-8").splitlines()


def test_trtllm_step_errors_from_real_threads_are_not_the_executor_dying() -> None:
    # TensorRT-LLM #2708 (Executor API forwardAsync), #1279 (docker-timestamped forward function),
    # tensorrtllm_backend #435 (the request error, then `Step function failed, continuing.`)
    lines = [
        corpus_lines("n97_trt2708_forwardasync_assertion_kvcache.log")[0],
        corpus_lines("n98_trt1279_forward_function_assertion_freeblock.log")[0],
        *corpus_lines("n102_trtbackend435_step_failed_continuing.log"),
    ]
    evs = [parse_line(x) for x in lines]
    assert all(ev is not None and ev.kind == "line" for ev in evs), evs
    assert [ev.fields.get("fatal") for ev in evs if ev] == [False] * 5
    assert evs[0] and evs[0].fields["error"].startswith("[TensorRT-LLM][ERROR] Assertion failed")
    assert evs[2] and evs[2].fields["error"] == "std::bad_cast"
    assert evs[4] and evs[4].fields["continuing"] is True
    # The fatal spelling: py_executor.py _event_loop_wrapper, the executor thread ends.
    dead = parse_line("[05/01/2026-10:00:00] [TRT-LLM] [E] Error in event loop: Sampling failed")
    assert dead is not None and dead.kind == "crash" and dead.fields["fatal"] is True
    # Near misses: another step's error message, and a `continuing` line of another loop part.
    assert parse_line("[TRT-LLM] [E] Encountered an error in decode: x") is None
    assert parse_line("[TensorRT-LLM][WARNING] Fetching new requests failed, continuing.") is None


def test_trtllm_cpp_logger_prefixes_with_the_rank_where_printed() -> None:
    keep = re.compile(r"MPI size|Rank \d|Encountered")
    old = parse_line(corpus_lines("n99_trt2683_cpp_runtime_startup_tp8.log")[0], keep=keep)
    assert old is not None and old.line.startswith("[TensorRT-LLM][INFO] MPI size: 8")
    assert "rank" not in old.fields  # `rank: 5` is in the message, not the logger's prefix
    ranked = parse_line("[TensorRT-LLM][ERROR][3] Encountered an error in forwardAsync function: e")
    assert ranked is not None and ranked.fields["rank"] == 3 and ranked.fields["error"] == "e"
    new = parse_line(
        "12-01-2026 10:00:00.123456 [TRT-LLM] [E] [5] Encountered an error in forward function: e"
    )
    assert new is not None and new.fields["rank"] == 5 and new.fields["error"] == "e"
    # Near miss: a bracketed number after the prefix's own space is message text, not a rank.
    loose = parse_line("[TensorRT-LLM][ERROR] [7] Encountered an error in forwardAsync function: e")
    assert loose is not None and "rank" not in loose.fields
    for name, version in (
        ("n100_trt1826_mpirun_version_nccl_bootstrap.log", "0.11.0.dev2024061800"),
        ("n101_trt2667_trtllm_serve_version_only.log", "0.16.0"),
    ):
        ev = parse_line(corpus_lines(name)[0])
        assert ev is not None and ev.kind == "version" and ev.fields["version"] == version
    # Near miss: a level the C++ logger never prints is no prefix, so no rank is read from it.
    other = parse_line("[TensorRT-LLM][NOTICE][4] Encountered an error in forward function: e")
    assert other is not None and "rank" not in other.fields


def test_trtllm_hang_detector_both_spellings_with_the_rank() -> None:
    # hang_detector.py _detect_hang, then py_executor.py on_detected: graceful and hard-kill forms
    after = parse_line("[TRT-LLM] [E] Hang detected after 300 seconds.")
    assert after is not None and after.kind == "watchdog" and after.fields["seconds"] == 300.0
    for line in (
        "[TRT-LLM] [MPI_Rank 1] [E] Hang detected on rank 3 in PyExecutor.",
        "[TRT-LLM] [E] Hang detected on rank 3 in PyExecutor; hard-killing and propagating to "
        "peer ranks.",
    ):
        ev = parse_line(line)
        assert ev is not None and ev.kind == "watchdog", line
        assert ev.fields["rank"] == 3 and ev.fields["fatal"] is True  # the message's rank wins
    # Near misses: the shutdown line after it, and a rank that is not PyExecutor's.
    assert parse_line("[TRT-LLM] [E] Hang detected, shutting down immediately.") is None
    assert parse_line("[TRT-LLM] [E] Hang detected on rank 3 in the proxy.") is None


def test_trtllm_cuda_graph_warmup_is_capture_not_a_stall() -> None:
    # model_engine.py warmup, three spellings over its history
    lines = [
        "[05/01/2026-10:00:00] [TRT-LLM] [I] Run generation only CUDA graph warmup for "
        "batch size=8",
        "[05/01/2026-10:00:01] [TRT-LLM] [I] Run generation-only CUDA graph warmup for "
        "batch size=4, draft_len=0",
        "[05/01/2026-10:00:02] [TRT-LLM] [I] Run generation-only CUDA graph warmup for "
        "batch size=2, draft_len=0, max_seq_len=4096",
    ]
    evs = [parse_line(x) for x in lines]
    assert [ev.kind if ev else None for ev in evs] == ["capture"] * 3
    assert [ev.fields["n"] for ev in evs if ev] == [8, 4, 2]
    w = Window()
    for t, ev in enumerate(evs):
        w.append(Observation(t=float(t), wall=float(t), logs=(ev,) if ev else ()))
    assert w.progress.phase == "capturing" and w.progress.last_progress_t == 2.0
    # Near miss: a warmup line that is not CUDA-graph capture.
    assert parse_line("[TRT-LLM] [I] Run generation-only warmup for batch size=4") is None


def test_malformed_numbers_keep_the_line_and_never_raise() -> None:
    keep = re.compile("Graph capturing|Avg prompt|Decode batch")
    for line in (
        "Graph capturing finished in . sec",
        "Graph capturing finished in 1.2.3 secs",
        "Avg prompt throughput: 1.2.3 tokens/s, Avg generation throughput: 1 tokens/s, "
        "Running: 1 reqs, Waiting: 0 reqs",
        "Decode batch, #running-req: " + "9" * 5000 + ", #queue-req: 0",
        "Running: 1 reqs, Engine " + "7" * 5000 + ": Avg prompt throughput: 1 tokens/s",
    ):
        ev = parse_line(line, keep=keep)
        assert ev is not None and ev.kind == "line", line[:60]


def _cost(line: str) -> float:
    """Best of five runs: the least disturbed by other work on the machine."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        parse_line(line)
        best = min(best, time.perf_counter() - start)
    return best


def test_every_pattern_is_linear_in_the_line_length() -> None:
    # Shapes that made the old patterns backtrack (`it [` guard, optional `\d+` before the stats
    # text) and one per family.
    shapes = (
        ("edit it [x] ", "word "),
        ("", "1"),
        ("Avg prompt throughput", " 1"),
        ("x: ", "1:"),
        ("desc: 50%|", "|"),
        ("Loading ", "a"),
        ("Compiling a graph for ", "Compiling a graph for "),
        ("Decode batch, #running-req: 1, ", "#queue-req: "),
        ("flashinfer.jit: Fetching ", "a"),
        ("sha256 mismatch ", " for"),
        ("[TRT-LLM] [I] iter = 1, global_rank = 1, rank = 1, ", "num_scheduled_requests"),
        ("[TensorRT-LLM][INFO][", "1"),
        ("12-01-2026 10:00:00.123456 [TRT-LLM] [I] [", "1"),
        ("Run generation-only CUDA graph warmup for batch size=", "1"),
    )
    worst = 0.0
    for head, unit in shapes:
        small, big = head + unit * 2000, head + unit * 20000
        _cost(small)
        ratio = _cost(big) / max(_cost(small), 1e-6)
        worst = max(worst, ratio)
        assert ratio < 30, f"{head!r}+{unit!r}: 10x input took {ratio:.1f}x time"
    print(f"worst 10x-input time ratio: {worst:.1f}")
