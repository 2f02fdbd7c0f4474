"""Splitting a byte stream into log records: tqdm's bare `\r`, partial lines, glued records."""

from __future__ import annotations

import pytest

from watchdog.sources.logs.parse import parse_line
from watchdog.sources.logs.split import LineSplitter, split_records


def test_splitter_handles_tqdm_carriage_returns_and_partial_lines() -> None:
    s = LineSplitter()
    out = s.feed(b"Processed prompts:   0%|  | 0/8 [00:00<?, ?it/s]\rProcessed prompts:  12%|")
    assert out == ["Processed prompts:   0%|  | 0/8 [00:00<?, ?it/s]"]
    out = s.feed(b"# | 1/8 [00:01<00:07, 1.00it/s]\r\n")
    assert out == ["Processed prompts:  12%|# | 1/8 [00:01<00:07, 1.00it/s]"]
    assert s.feed(b"tail-without-newline") == []
    assert s.flush() == "tail-without-newline"
    assert s.flush() == ""


def test_splitter_crlf_split_across_chunks_is_one_line_end() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r") == ["a"]
    assert s.feed(b"\nb\n") == ["b"]


def test_splitter_drops_nul_and_replaces_invalid_utf8() -> None:
    s = LineSplitter()
    assert s.feed(b"ab\x00c\xff\xfed\n") == ["abc\ufffd\ufffdd"]


def test_splitter_bounds_a_10mb_line() -> None:
    s = LineSplitter(max_line_bytes=1000)
    chunk = b"x" * 65536
    out: list[str] = []
    for _ in range(160):  # 10 MiB without a newline
        out += s.feed(chunk)
        assert len(s.peek()) <= 1000  # bounded while the line is still open
    out += s.feed(b"\nnext\n")
    assert out[0] == "x" * 1000 + " …[truncated]"
    assert out[1] == "next"


def test_splitter_rejects_bad_limit() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineSplitter(0)


def test_split_records_separates_a_log_record_glued_to_a_tqdm_bar() -> None:
    # tqdm writes no newline after a redraw, so the next record lands on the bar's line.
    bar = (
        "Processed prompts:   0%|          | 0/768 [00:00<?, ?it/s, est. speed input: 0.00 "
        "toks/s, output: 0.00 toks/s]"
    )
    jit = (
        "2026-11-30 08:08:29,185 - INFO - cubin_loader.py:167 - flashinfer.jit: Fetching cubin "
        "a.cubin from http://127.0.0.1:9/x"
    )
    parts = split_records(bar + jit)
    assert parts == [bar, jit]
    kinds = [ev.kind for ev in (parse_line(p) for p in parts) if ev is not None]
    assert kinds == ["progress", "jit"]


def test_split_records_leaves_ordinary_lines_whole() -> None:
    for line in (
        "(APIServer pid=1) INFO 01-12 02:58:15 [loggers.py:123] Engine 000: Avg prompt throughput",
        "Aug 19 18:34:27 vllm vllm[8727]: (EngineCore pid=8727) ERROR 08-19 18:34:27 [core.py:1] x",
        "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation",
    ):
        assert split_records(line) == [line]
