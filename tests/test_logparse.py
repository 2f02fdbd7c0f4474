"""Tests for the pure log-line parser, mostly on real upstream log excerpts in tests/data/logs."""

from __future__ import annotations

import collections
import functools
import re
from pathlib import Path

import pytest

from tests.shipped import PATTERNS
from watchdog.core.model import LogEvent
from watchdog.sources.logs import parse
from watchdog.sources.logs.parse import clean_line, parse_elapsed

# Lines read in the shipped engines' formats, as the daemon's log source reads them.
parse_line = functools.partial(parse.parse_line, patterns=PATTERNS)


DATA = Path(__file__).parent / "data" / "logs"


def events(name: str, keep: re.Pattern[str] | None = None) -> list[LogEvent]:
    text = (DATA / name).read_text(encoding="utf-8")
    parsed = (parse_line(raw, source=name, keep=keep) for raw in text.splitlines())
    return [ev for ev in parsed if ev is not None]


def kinds(name: str) -> dict[str, int]:
    return dict(collections.Counter(ev.kind for ev in events(name)))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a_fi1728_cubin_sha256_mismatch.log", {"jit": 2}),
        ("a_fi4985_cubin_fetch_lock.log", {"jit": 2}),
        ("d_vllm2734_ray_stall_then_nccl_watchdog.log", {"stats": 2}),
        ("d_vllm48752_throughput_zero_then_shm_broadcast.log", {"stats": 2, "wait": 1}),
        ("f_club3090_93_specdecode_and_access_log.log", {"stats": 2}),
        ("f_tt3359_docker_timestamp_prefix.log", {"stats": 4}),
        ("f_vllm18916_noprefix_v1_docker_pipe.log", {"stats": 1}),
        ("f_vllm43295_apiserver_engine000.log", {"stats": 5}),
        ("g_vllm16050_processed_prompts_slowing.log", {"progress": 10}),
        (
            "g_vllm16301_offline_startup_then_stuck_0pct.log",
            {"milestone": 5, "compile": 2, "progress": 1},
        ),
        (
            "h_club3090_142_aot_compile_cache_with_shm_warning.log",
            {"compile": 1, "milestone": 2, "wait": 1},
        ),
        (
            "h_vllm19794_torch_compile_and_cudagraph_capture.log",
            {"compile": 1, "milestone": 3, "capture": 1},
        ),
        ("h_vllm27521_piecewise_cudagraph_capture_tqdm.log", {"capture": 9}),
        ("h_vllm44985_safetensors_weight_loading.log", {"loading": 6, "milestone": 2}),
        ("j_vllm25848_startup_complete_trtllm_autodetected.log", {"milestone": 1, "trtllm": 4}),
        ("j_vllm23762_api_server_version.log", {"version": 1}),
        ("j_vllm23762_v1_engine_version.log", {"version": 1}),
        ("j_ktrun13_flashinfer_jit_old_format.log", {"jit": 2}),
        # Failure excerpts: nothing here is a progress or startup kind (those are `keep` lines).
        ("b_proxmox2047_journald_flashinfer_jit.log", {}),
        ("e_svd348_shm_timeout_engine_fatal.log", {}),
        ("i_sgl3909_decode_batch_tp0.log", {"stats": 9}),  # SGLang, read through its profile
    ],
)
def test_real_samples_parse_to_expected_kinds(name: str, expected: dict[str, int]) -> None:
    assert kinds(name) == expected


def test_every_sample_parses_without_error_and_keep_catches_the_rest() -> None:
    keep = re.compile(r"EngineDeadError|shm_broadcast|Watchdog|NVLS|nvcc|ninja", re.IGNORECASE)
    total_line_events = 0
    for path in sorted(DATA.glob("*.log")):
        for ev in events(path.name, keep=keep):
            assert ev.source == path.name
            assert ev.line == clean_line(ev.line)
            total_line_events += ev.kind == "line"
    assert total_line_events > 20


def test_stats_fields_v1_with_prefix() -> None:
    ev = events("f_vllm43295_apiserver_engine000.log")[0]
    assert ev.fields == {
        "engine": 0,
        "aggregated": None,
        "prompt_tps": 0.0,
        "gen_tps": 1055.3,
        "running": 18,
        "waiting": 43,
        "kv_usage": 0.959,
        "proc": "APIServer",
        "pid": 3646,
    }


def test_stats_v0_pending_counts_as_waiting_and_extra_fields_are_ignored() -> None:
    v0 = events("d_vllm2734_ray_stall_then_nccl_watchdog.log")[0].fields
    assert (v0["engine"], v0["running"], v0["waiting"], v0["gen_tps"]) == (None, 1, 0, 0.0)
    corrupted = events("d_vllm48752_throughput_zero_then_shm_broadcast.log")[1].fields
    assert (corrupted["prompt_tps"], corrupted["running"], corrupted["kv_usage"]) == (0.0, 3, 0.007)


def test_stats_aggregated_and_coloured() -> None:
    # Built from vllm/v1/metrics/loggers.py's parts ("{N} Engines Aggregated: ", Preemptions).
    line = (
        "\x1b[36m(APIServer pid=7)\x1b[0m INFO 01-12 02:58:15 [loggers.py:123] 2 Engines "
        "Aggregated: Avg prompt throughput: 10.5 tokens/s, Avg generation throughput: 3.0 "
        "tokens/s, Running: 4 reqs, Waiting: 2 reqs, Preemptions: 0, GPU KV cache usage: 50.0%, "
        "Prefix cache hit rate: 0.0%"
    )
    ev = parse_line(line)
    assert ev is not None and ev.kind == "stats"
    assert ev.fields["aggregated"] == 2 and ev.fields["engine"] is None
    assert (ev.fields["running"], ev.fields["waiting"], ev.fields["kv_usage"]) == (4, 2, 0.5)
    assert ev.fields["proc"] == "APIServer" and "\x1b" not in ev.line


def test_progress_fields_and_frozen_zero_percent() -> None:
    stuck = events("g_vllm16301_offline_startup_then_stuck_0pct.log")[-1]
    assert stuck.kind == "progress"
    assert stuck.fields["desc"] == "Processed prompts"
    assert (stuck.fields["n"], stuck.fields["total"], stuck.fields["pct"]) == (0, 1, 0.0)
    assert stuck.fields["output_tps"] == 0.0
    moving = [ev.fields for ev in events("g_vllm16050_processed_prompts_slowing.log")]
    assert [f["n"] for f in moving] == sorted(f["n"] for f in moving)
    assert moving[-1]["elapsed_s"] > moving[0]["elapsed_s"]


def test_adding_requests_and_no_total_bars_are_progress() -> None:
    # tqdm 4.x rendering of vLLM's `tqdm(it, desc="Adding requests")` (vllm/entrypoints/llm.py)
    ev = parse_line("Adding requests: 100%|██████████| 768/768 [00:01<00:00, 640.12it/s]")
    assert ev is not None and ev.kind == "progress"
    assert (ev.fields["desc"], ev.fields["n"], ev.fields["total"]) == ("Adding requests", 768, 768)
    batches = [
        e for e in events("i_sgl1612_prefill_batch_time_only_prefix.log") if e.kind == "progress"
    ]  # the file also has SGLang's Prefill batch lines
    assert [(e.kind, e.fields["n"], e.fields["total"]) for e in batches][-1] == (
        "progress",
        2,
        None,
    )


def test_loading_and_capture_bars() -> None:
    loading = [ev.fields for ev in events("h_vllm44985_safetensors_weight_loading.log")]
    assert [(f.get("n"), f.get("total")) for f in loading[:6]] == [
        (0, 4),
        (1, 4),
        (2, 4),
        (3, 4),
        (4, 4),
        (4, 4),
    ]
    capture = events("h_vllm27521_piecewise_cudagraph_capture_tqdm.log")
    assert capture[0].fields["desc"] == "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    assert [ev.fields["n"] for ev in capture] == list(range(len(capture)))
    assert all(ev.fields["total"] == 67 for ev in capture)


def test_milestones_in_startup_order() -> None:
    names = [
        ev.fields["name"]
        for ev in events("g_vllm16301_offline_startup_then_stuck_0pct.log")
        if ev.kind == "milestone"
    ]
    assert names == [
        "weights_loaded",
        "model_loaded",
        "compile_done",
        "graph_captured",
        "engine_ready",
    ]
    h = [ev.fields for ev in events("h_vllm19794_torch_compile_and_cudagraph_capture.log")]
    graph = next(f for f in h if f.get("name") == "graph_captured")
    assert (graph["seconds"], graph["gib"]) == (14.0, 0.84)
    model = next(
        ev.fields
        for ev in events("h_vllm44985_safetensors_weight_loading.log")
        if ev.fields.get("name") == "model_loaded"
    )
    assert (model["gib"], model["seconds"]) == (8.91, 194.454138)


def test_compile_phases() -> None:
    phases = [
        (ev.fields["phase"], ev.fields.get("seconds"))
        for ev in events("g_vllm16301_offline_startup_then_stuck_0pct.log")
        if ev.kind == "compile"
    ]
    assert phases == [("dynamo", 16.61), ("cache_load", None)]
    graph = events("h_vllm19794_torch_compile_and_cudagraph_capture.log")[0]
    assert graph.fields == {"phase": "graph", "shape": "general shape", "seconds": 14.65}


def test_jit_real_lines() -> None:
    fetch, lock = events("a_fi4985_cubin_fetch_lock.log")
    assert fetch.fields["action"] == "fetching"
    assert fetch.fields["host"] == "edge.urm.nvidia.com"
    assert fetch.fields["uri"].startswith("https://edge.urm.nvidia.com/artifactory/")
    assert lock.fields["action"] == "lock" and lock.fields["path"].startswith("/root/.cache")
    mismatch = events("a_fi1728_cubin_sha256_mismatch.log")[0]
    assert mismatch.fields["action"] == "sha256_mismatch"
    old = events("j_ktrun13_flashinfer_jit_old_format.log")
    assert [ev.fields["action"] for ev in old] == ["other", "other"]


# Built from the format strings in flashinfer/jit/cubin_loader.py (v0.6.7 and later); no real
# excerpt of these was found (see tests/data/logs/README.md).
_JIT_PREFIX = "2026-03-30 10:00:00,000 - INFO - cubin_loader.py:90 - flashinfer.jit: "
_URI = "https://edge.urm.nvidia.com/artifactory/x/e7afc413/fmha/trtllm-gen/k.cubin"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (f"Fetching cubin k.cubin from {_URI}", {"action": "fetching", "file": "k.cubin"}),
        (f"Fetching file from {_URI}", {"action": "fetching", "uri": _URI}),
        (f"Fetching k.cubin from {_URI}", {"action": "fetching", "host": "edge.urm.nvidia.com"}),
        (f"File downloaded successfully: {_URI} -> /c/k.cubin", {"action": "downloaded"}),
        ("File copied successfully: /c/k.cubin", {"action": "downloaded", "path": "/c/k.cubin"}),
        (
            f"Downloading {_URI}: attempt 2 failed: 403 Client Error: Forbidden",
            {"action": "attempt_failed", "attempt": 2, "error": "403 Client Error: Forbidden"},
        ),
        ("Retrying in 10 seconds...", {"action": "retrying", "delay_s": 10.0}),
        ("Retrying in 3.27 seconds...", {"action": "retrying", "delay_s": 3.27}),
        ("Max retries reached. Download failed.", {"action": "max_retries"}),
        ("Loading from /c/k.cubin", {"action": "loading", "path": "/c/k.cubin"}),
        ("Something new", {"action": "other", "message": "Something new"}),
    ],
)
def test_jit_actions_from_format_strings(message: str, expected: dict[str, object]) -> None:
    ev = parse_line(_JIT_PREFIX + message)
    assert ev is not None and ev.kind == "jit"
    assert expected.items() <= ev.fields.items()


def test_versions() -> None:
    (api,) = events("j_vllm23762_api_server_version.log")
    assert api.fields == {"component": "api_server", "version": "0.10.1rc2.dev310+g4f35be10a"}
    (engine,) = events("j_vllm23762_v1_engine_version.log")
    assert engine.fields["version"] == "0.10.1rc2.dev310+g4f35be10a"
    assert (engine.fields["proc"], engine.fields["pid"]) == ("EngineCore_0", 259025)
    # V0 format string: "Initializing an LLM engine (v%s) with config: " (vllm/engine/llm_engine.py)
    v0 = parse_line(
        "INFO 12-06 11:39:30 llm_engine.py:249] Initializing an LLM engine (v0.6.4.post1) "
        "with config: model='m'"
    )
    assert v0 is not None and v0.fields["version"] == "0.6.4.post1"


def test_trtllm_lines() -> None:
    evs = [ev for ev in events("j_vllm25848_startup_complete_trtllm_autodetected.log")]
    trt = [ev for ev in evs if ev.kind == "trtllm"]
    assert {ev.fields["proc"] for ev in trt} == {f"Worker_TP{i}_EP{i}" for i in range(4)}
    assert all(ev.fields["enabled"] is True for ev in trt)
    newer = parse_line(
        "WARNING 04-01 10:00:00 [flashinfer.py:300] Using TRTLLM decode attention (auto-detected)."
    )
    assert newer is not None and newer.fields["phase"] == "decode"
    forced = parse_line(
        "Using TRTLLM attention (--attention-config.use_trtllm_attention is set to 1)"
    )
    assert forced is not None and forced.kind == "trtllm"
    unsupported = (
        "TRTLLM attention is not supported on this platform for decode, but --x is set to 1"
    )
    assert parse_line(unsupported) is None


def test_keep_pattern_makes_line_events_only_when_matching() -> None:
    line = "(APIServer pid=1) ERROR 05-04 [a.py:1] vllm.v1.engine.exceptions.EngineDeadError: x"
    assert parse_line(line) is None
    assert parse_line(line, keep=re.compile("nothing-like-this")) is None
    ev = parse_line(line, source="f", keep=re.compile("EngineDeadError"))
    assert ev is not None and (ev.kind, ev.source, ev.fields["pid"]) == ("line", "f", 1)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("2026-05-12T07:54:39.312201059Z (APIServer pid=1) INFO x", "(APIServer pid=1) INFO x"),
        ("qwen3-vl-32b  | (APIServer pid=104) ERROR y", "(APIServer pid=104) ERROR y"),
        (
            "Aug 19 18:34:27 vllm vllm[8727]: (EngineCore pid=8727) ERROR z",
            "(EngineCore pid=8727) ERROR z",
        ),
        ("rdma-test-gpu-worker-0: host:1:2 [5] NCCL INFO a", "host:1:2 [5] NCCL INFO a"),
        ('51.22   File "/x.py", line 3, in f', '  File "/x.py", line 3, in f'),
        (
            "2025-05-30 09:55:22.281 | INFO 05-30 07:55:22 [a.py:1] b",
            "INFO 05-30 07:55:22 [a.py:1] b",
        ),
        ("2026-01-01T00:00:00Z web-1  | INFO c", "INFO c"),
        # A log pasted as a Markdown quote, and quoted again in a reply.
        ('> [rank3]:   File "/x.py", line 3, in f', '[rank3]:   File "/x.py", line 3, in f'),
        ("> > > host:1:2 [0] NCCL INFO Init COMPLETE", "host:1:2 [0] NCCL INFO Init COMPLETE"),
        ("-> not a quote", "-> not a quote"),
        ("\x1b[32mINFO\x1b[0m d\x00 \r", "INFO d"),
        ("RuntimeError: Ninja build failed.", "RuntimeError: Ninja build failed."),
        ("flashinfer.jit: Fetching x", "flashinfer.jit: Fetching x"),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: e",
            "vllm.v1.engine.exceptions.EngineDeadError: e",
        ),
        (
            'INFO:     127.0.0.1:1 - "POST / HTTP/1.1" 200 OK',
            'INFO:     127.0.0.1:1 - "POST / HTTP/1.1" 200 OK',
        ),
        # Ray's driver de-duplication note at the end, not the line's words.
        (
            '(RayWorkerWrapper pid=9) ERROR [worker_base.py:620]   File "/w.py", line 186, in '
            "init_device [repeated 2x across cluster]",
            '(RayWorkerWrapper pid=9) ERROR [worker_base.py:620]   File "/w.py", line 186, in '
            "init_device",
        ),
        ("a [repeated 2x across cluster] b", "a [repeated 2x across cluster] b"),
    ],
)
def test_clean_line_strips_collector_prefixes_only(raw: str, clean: str) -> None:
    assert clean_line(raw) == clean
    assert clean_line(clean) == clean  # idempotent


def test_parse_elapsed() -> None:
    assert parse_elapsed("01:33") == 93.0
    assert parse_elapsed("1:02:03") == 3723.0
    assert parse_elapsed("?") is None
