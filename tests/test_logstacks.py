"""Stack dumps found inside logs: real dumps from upstream threads (tests/data/corpus/), engine
prefixes, interleaving, and random or truncated input (no exception, bounded output)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tests.shipped import PATTERNS
from watchdog.core.model import Frame, LogEvent, ThreadStack
from watchdog.core.state.logdumps import log_stacks
from watchdog.sources.logs.parse import clean_line
from watchdog.sources.logs.split import LineSplitter
from watchdog.sources.logs.stackdumps import StackScanner, scan_lines, strip_prefixes

CORPUS = Path(__file__).parent / "data" / "corpus"


def lines(name: str) -> list[str]:
    splitter = LineSplitter()
    raw = splitter.feed((CORPUS / name).read_bytes())
    tail = splitter.flush()
    return [clean_line(x) for x in raw + ([tail] if tail else [])]


def dumps(name: str) -> list[LogEvent]:
    return scan_lines(lines(name))


def names(thread: ThreadStack) -> list[str]:
    return [f.name for f in thread.frames]


def test_sglang_pyspy_dump_under_compose_prefix_is_found() -> None:
    found = dumps("n02_sgl12076_compose_pyspy_dump_eagle.log")
    sched = next(d for d in found if d.fields["pid"] == 309)
    assert sched.fields["format"] == "py-spy"
    assert sched.fields["title"] == "sglang::scheduler_TP6"
    main = sched.stack.threads[0]
    assert main.name == "MainThread" and main.active
    assert names(main)[:2] == ["_apply", "apply"]
    assert main.frames[0].filename == "penaltylib/min_new_tokens.py"
    assert main.frames[0].line == 78
    # The watchdog thread's dump above it (its header was cut) is a dump of its own.
    watchdog = next(d for d in found if d is not sched)
    assert "pyspy_dump_schedulers" in names(watchdog.stack.threads[0])


def test_pyspy_thread_without_id_is_parsed() -> None:
    (d,) = dumps("n28_sgl29073_pyspy_allreduce_fusion_rendezvous.log")
    assert names(d.stack.threads[0])[:2] == ["rendezvous", "_alloc_symm_buffer_bytes"]


def test_pyspy_absolute_paths_and_several_threads() -> None:
    (d,) = dumps("n27_sgl5034_pyspy_forward_thread_filelock.log")
    assert [t.name for t in d.stack.threads] == [
        "Thread-2",
        "Thread-3",
        "Thread-4 (forward_thread_func)",
    ]
    assert names(d.stack.threads[2])[:3] == ["acquire", "__enter__", "load_cuda_ops"]


def test_pyspy_native_frames_name_the_library() -> None:
    # py-spy src/dump.rs prints a native frame as `name (library)` without a line number,
    # column-padded in newer releases (vllm #42897 shows `cuEventSynchronize   (libcuda.so`).
    text = [
        "Process 77: VLLM::Worker_TP0",
        'Thread 77 (active): "MainThread"',
        "    cuEventSynchronize                                       (libcuda.so.1)",
        "    synchronize (torch/cuda/streams.py:224)",
    ]
    (d,) = scan_lines(text)
    first, second = d.stack.threads[0].frames
    assert (first.name, first.filename, first.line) == (
        "cuEventSynchronize",
        "libcuda.so.1",
        0,
    )
    assert (second.name, second.line) == ("synchronize", 224)


def test_gdb_thread_apply_all_bt_with_named_threads() -> None:
    (d,) = dumps("n49_trt2560_gdb_named_threads_ib_async.log")
    assert d.fields["format"] == "gdb"
    assert [t.thread_id for t in d.stack.threads] == [2791195, 2791192]
    assert names(d.stack.threads[0])[:4] == [
        "read",
        "ibv_get_async_event",
        "wrap_ibv_get_async_event",
        "ncclIbAsyncThreadMain",
    ]
    assert d.stack.threads[0].frames[3].filename.endswith("libnccl.so.2")


def test_gdb_bt_with_wrapped_argument_lines() -> None:
    (d,) = dumps("n09_ompi101_gdb_bt_ibv_poll.log")
    assert names(d.stack.threads[0]) == [
        "internal driver call",
        "internal driver call",
        "ibv_poll_cq",
        "poll_device",
        "progress_one_device",
    ]


def test_faulthandler_current_thread_and_stack_forms() -> None:
    (a,) = dumps("n37_vllm6252_faulthandler_segfault_flashinfer.log")
    assert a.fields["format"] == "faulthandler"
    assert names(a.stack.threads[0]) == ["begin_forward", "begin_forward"]
    assert a.stack.threads[0].frames[0].filename.endswith("flashinfer/decode.py")
    (b,) = dumps("n38_vllm3053_faulthandler_segfault_graph_capture.log")
    assert names(b.stack.threads[0])[0] == "capture_begin"
    assert names(b.stack.threads[0])[-1] == "capture_model"


def test_interleaved_worker_tracebacks_are_kept_apart() -> None:
    found = dumps("n07_llmscaler235_workerproc_exception.log")
    # Both workers started a traceback; the excerpt ends before any frame, so neither has
    # frames and neither is reported as a dump.
    assert found == []
    text = lines("n21_vllm9839_v0_engine_iteration_timeout.log")
    (d,) = scan_lines(text)
    assert d.fields["format"] == "traceback"
    # Tracebacks list the outermost frame first; dumps hold the innermost first.
    assert names(d.stack.threads[0]) == ["_wait", "wait", "run_engine_loop"]
    assert d.fields["exception"] == "asyncio.exceptions.CancelledError"


def test_two_processes_interleaved_line_by_line() -> None:
    a = "(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1] "
    b = "(Worker_TP1 pid=11) ERROR 01-12 02:58:31 [x.py:1] "
    text = [
        a + "Traceback (most recent call last):",
        b + "Traceback (most recent call last):",
        a + '  File "/v/torch/distributed/distributed_c10d.py", line 9, in all_reduce',
        b + '  File "/v/flashinfer/jit/cubin_loader.py", line 5, in download_file',
        a + "RuntimeError: a",
        b + "RuntimeError: b",
        "(APIServer pid=1) INFO 01-12 02:58:32 [api.py:1] unrelated",
    ]
    found = {e.fields["pid"]: e for e in scan_lines(text)}
    assert names(found[10].stack.threads[0]) == ["all_reduce"]
    assert names(found[11].stack.threads[0]) == ["download_file"]
    assert found[10].fields["stream"] == "Worker_TP0 pid=10"


def test_a_dump_ends_when_its_stream_goes_quiet_while_others_log() -> None:
    w = "(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1] "
    access = '(APIServer pid=1) INFO:     172.31.0.7:37016 - "POST /v1/completions HTTP/1.1" 200'
    scanner = StackScanner(max_span=50)
    head = [w + "Traceback (most recent call last):", w + '  File "/v/a.py", line 9, in step']
    out = [e for line in head for e in scanner.feed(line, "t")]
    out += [e for _ in range(49) for e in scanner.feed(access, "t")]
    assert out == [] and scanner.has_open  # within the span: other streams' lines leave it open
    out += scanner.feed(access, "t") + scanner.feed(access, "t")
    assert not scanner.has_open  # the span passed with no line of its own: it has ended
    (d,) = out
    assert names(d.stack.threads[0]) == ["step"]
    late = scanner.feed(w + '  File "/v/b.py", line 3, in late', "t")
    assert late == [] and not scanner.has_open  # a frame line alone starts nothing


def test_prefixes_are_stripped_one_after_another() -> None:
    msg, key, pid = strip_prefixes(
        '(EngineCore_DP0 pid=18052) ERROR 02-03 22:43:35 [core.py:968]   File "x.py", line 1, in f'
    )
    assert (key, pid) == ("EngineCore_DP0 pid=18052", 18052)
    assert msg.startswith("  File")
    msg, key, _ = strip_prefixes("[2025-10-29 11:25:58 DP0 TP6] Pyspy dump for PID 309:")
    assert (msg, key) == ("Pyspy dump for PID 309:", "DP0 TP6")


def test_a_dump_still_open_at_the_end_of_a_live_tick_closes_on_the_next() -> None:
    scanner = StackScanner()
    out = []
    for line in lines("n25_vllm50835_pyspy_enginecore_shm_dequeue.log"):
        out += scanner.feed(line, "live")
    assert out == []  # nothing ended it yet
    assert scanner.tick("live") == []  # it got lines this tick
    (ev,) = scanner.tick("live")  # and none since
    assert ev.kind == "stack" and ev.fields["pid"] == 4085279
    assert "dequeue" in names(ev.stack.threads[0])


def test_one_dump_is_one_dump_and_unchanged_needs_two() -> None:
    text = lines("n25_vllm50835_pyspy_enginecore_shm_dequeue.log")
    (once,) = log_stacks(scan_lines(text))
    assert not any(t.unchanged for t in once.threads)
    (twice,) = log_stacks(scan_lines(text + ["INFO later"] * 5 + text))
    assert all(t.unchanged for t in twice.threads)
    moved = [x.replace(":802)", ":803)") for x in text]
    (changed,) = log_stacks(scan_lines(text + ["INFO later"] * 5 + moved))
    assert not any(t.unchanged for t in changed.threads)


def _random_line(rng: random.Random) -> str:
    pieces = [
        "Thread ",
        "0x7f",
        ' (active): "',
        "#0  0x00 in ",
        '  File "',
        '", line ',
        " in ",
        "Traceback (most recent call last):",
        "    ",
        "(",
        ")",
        ":",
        "Process 1: ",
        "(Worker pid=3) ",
        "[2025-01-01 00:00:00 TP0] ",
        "x" * rng.randint(0, 50),
        " " * rng.randint(0, 300),
        "(" * rng.randint(0, 200),
        "\x00\x1b[0m",
        "é漢",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))


def test_fuzzed_and_truncated_input_never_raises_and_stays_bounded() -> None:
    rng = random.Random(12)
    real = lines("n02_sgl12076_compose_pyspy_dump_eagle.log") + lines(
        "n49_trt2560_gdb_named_threads_ib_async.log"
    )
    feed = []
    for _ in range(3000):
        if rng.random() < 0.5:
            line = rng.choice(real)
            feed.append(line[: rng.randint(0, len(line))])  # truncated mid-line
        else:
            feed.append(_random_line(rng))
    feed += ["    " + "(" * 4000 + "x (" + "a" * 5000 + ")"] * 20  # regex worst cases
    scanner = StackScanner(max_frames=50, max_threads=8)
    start = time.perf_counter()
    slowest = 0.0
    out = []
    for line in feed:
        t0 = time.perf_counter()
        out += scanner.feed(line)
        slowest = max(slowest, time.perf_counter() - t0)
    out += scanner.flush()
    total = time.perf_counter() - start
    print(f"\nfuzz: {len(feed)} lines in {total:.3f} s, slowest line {slowest * 1e3:.2f} ms")
    for ev in out:
        assert len(ev.stack.threads) <= 8
        assert all(len(t.frames) <= 50 for t in ev.stack.threads)


def test_a_dump_in_one_journal_record_reaches_the_log_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang logs its py-spy dump as one record; journald keeps it as one multi-line MESSAGE.
    A real `journalctl` stand-in serves it; the live LogSource finds the dump in it."""
    from tests.fakes import STANDIN, install_journalctl
    from watchdog.sources.logs.journal import JournalReader
    from watchdog.sources.logs.source import LogSource

    install_journalctl(tmp_path, monkeypatch, STANDIN)
    monkeypatch.setenv("STANDIN_OUT", str(tmp_path / "out"))
    dump = "\n".join(lines("n02_sgl12076_compose_pyspy_dump_eagle.log")[15:])
    record = {"__CURSOR": "s=1", "MESSAGE": dump}
    (tmp_path / "out").write_text(json.dumps(record) + "\n")
    source = LogSource([JournalReader("sglang.service", output="json")], patterns=PATTERNS)
    found = []
    try:
        deadline = time.monotonic() + 20
        while not found and time.monotonic() < deadline:
            found = [e for e in source.poll() if e.kind == "stack"]
            time.sleep(0.05)
    finally:
        source.close()
    assert found and found[0].fields["pid"] == 309
    assert found[0].fields["title"] == "sglang::scheduler_TP6"


def _tb(exc: str) -> list[str]:
    # cpython Lib/traceback.py format; the frames are those of sglang #29073's py-spy dump.
    return [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/site-packages/flashinfer/comm/allreduce.py", line 442, '
        "in create_allreduce_fusion_workspace",
        "    workspace = MNNVLAllReduceFusionWorkspace(...)",
        '  File "/usr/lib/python3.12/site-packages/torch/distributed/_symmetric_memory/'
        '__init__.py", line 1991, in rendezvous',
        "    return _SymmetricMemory.rendezvous(tensor, group_name)",
        exc,
    ]


def test_a_raised_exception_is_no_parked_thread_but_an_interrupted_wait_is() -> None:
    raised = log_stacks(scan_lines(_tb("RuntimeError: CUDA driver error")))
    assert raised == ()
    (waited,) = log_stacks(scan_lines(_tb("KeyboardInterrupt")))
    assert [f.name for f in waited.threads[0].frames] == [
        "rendezvous",
        "create_allreduce_fusion_workspace",
    ]


def test_real_native_dump_quoted_from_a_comment() -> None:
    (d,) = dumps("n83_vllm43885_pyspy_native_culaunchkernel_sampling.log")
    frames = d.stack.threads[0].frames
    assert len(frames) == 17
    assert frames[0] == Frame(name="0x754925c6309a", filename="libcuda.so.1.1", line=0)
    names_ = [f.name for f in frames]
    assert "cuLaunchKernel" in names_ and "top_k_mask_logits" in names_
    assert "flashinfer::sampling::RadixTopKMaskLogitsMultiCTA<float, int>" in names_


def test_a_dump_travels_typed_and_round_trips_through_a_timeline() -> None:
    from watchdog.core.model import Observation, StackSample, from_dict, to_dict

    (ev,) = dumps("n25_vllm50835_pyspy_enginecore_shm_dequeue.log")
    assert isinstance(ev.stack, StackSample) and "threads" not in ev.fields
    assert ev.stack.pid == ev.fields["pid"] == 4085279
    obs = Observation(t=1.0, wall=2.0, logs=(ev,))
    (back,) = from_dict(Observation, json.loads(json.dumps(to_dict(obs)))).logs
    assert back == ev
    assert log_stacks([back]) == log_stacks([ev])


def test_a_timeline_recorded_with_dumps_as_dicts_still_reads_the_same_stacks() -> None:
    """Timelines written before `LogEvent.stack` held each dump's threads as dicts in fields."""
    from watchdog.core.model import Observation, from_dict, to_dict

    (ev,) = dumps("n25_vllm50835_pyspy_enginecore_shm_dequeue.log")
    assert ev.stack is not None
    old = to_dict(ev)
    old.pop("stack")
    old["fields"]["threads"] = [
        {
            "thread_id": t.thread_id,
            "name": t.name,
            "active": t.active,
            "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in t.frames],
        }
        for t in ev.stack.threads
    ]
    recorded = {"t": 1.0, "wall": 2.0, "logs": [old]}
    (back,) = from_dict(Observation, json.loads(json.dumps(recorded))).logs
    assert back.stack is None
    (sample,) = log_stacks([back])
    assert sample == log_stacks([ev])[0] and sample.threads
