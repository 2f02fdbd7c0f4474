"""Engine log formats read through the profiles: SGLang and TensorRT-LLM lines, linear time,
and lines whose numbers do not convert."""

from __future__ import annotations

import re
import time
from pathlib import Path

from watchdog.core.model import LogEvent, Observation
from watchdog.core.window import Window
from watchdog.sources.logparse import parse_line

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
    assert err is not None and err.kind == "crash" and err.fields["error"] == "CUDA error: x"


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
    # Issue 11.1 shapes (`it [` guard, optional `\d+` before the stats text) and one per family.
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
    )
    worst = 0.0
    for head, unit in shapes:
        small, big = head + unit * 2000, head + unit * 20000
        _cost(small)
        ratio = _cost(big) / max(_cost(small), 1e-6)
        worst = max(worst, ratio)
        assert ratio < 30, f"{head!r}+{unit!r}: 10x input took {ratio:.1f}x time"
    print(f"worst 10x-input time ratio: {worst:.1f}")
