"""Property tests for the log-line parser: any line gives an event or None, never an
exception, and no line shape makes it slower than linear (one logged prompt must not freeze
the loop)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzkit import FUZZ, growth
from watchdog.core.model import LogEvent
from watchdog.sources.logs.parse import clean_line, parse_line

# Pieces of real vLLM/SGLang/tqdm lines, so the fuzzer reaches the parsers' deeper branches.
PIECES = st.sampled_from(
    [
        "INFO 12-01 10:00:00 [loggers.py:1] ",
        "(EngineCore_DP0 pid=42) ",
        "Engine 000: ",
        "Avg prompt throughput: ",
        "Running: ",
        " reqs, Waiting: ",
        "Loading safetensors checkpoint shards: ",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): ",
        "Graph capturing finished in ",
        " secs",
        " sec",
        "it [",
        "it/s]",
        "%|",
        "█",
        "| ",
        "/",
        "[",
        "]",
        "<",
        ", ",
        "flashinfer.jit: Fetching ",
        "attempt ",
        " failed",
        "EngineDeadError",
        "\x1b[32m",
        "\r",
        ".",
        "e",
    ]
)
NUMBER = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(["", ".", "1.", ".5", "nan", "inf", "1e999", "9" * 5000, "-1", "0x1f"]),
)
LINE = st.lists(PIECES | NUMBER | st.text(max_size=8), max_size=30).map("".join)


@FUZZ
@given(LINE)
def test_any_log_line_is_an_event_or_none(line: str) -> None:
    event = parse_line(clean_line(line), source="fuzz")
    assert event is None or isinstance(event, LogEvent)


def test_a_malformed_number_is_an_event_or_none() -> None:
    event = parse_line(clean_line("Graph capturing finished in . sec"), source="fuzz")
    assert event is None or isinstance(event, LogEvent)


@FUZZ
@given(st.text(max_size=500))
def test_arbitrary_text_is_an_event_or_none(line: str) -> None:
    event = parse_line(clean_line(line))
    assert event is None or isinstance(event, LogEvent)


# Line shapes that made the old patterns backtrack: a logged prompt with a
# tqdm-like guard and many words, stats-like text, and long digit and bracket runs.
HOSTILE = {
    "bar_guard_then_words": lambda n: "edit it [x] " + "word " * n,
    "stats_prefix_then_spaces": lambda n: "Engine 000: Avg prompt throughput: " + "1 " * n,
    "digits": lambda n: "Running: " + "9" * n,
    "brackets": lambda n: "it [" * n,
    "percent_bars": lambda n: "%|" * n,
    "colons_and_numbers": lambda n: "1:" * n,
}


@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_hostile_lines_parse_in_linear_time(shape: str) -> None:
    make = HOSTILE[shape]
    ratio = growth(make, lambda line: parse_line(line), 200)  # type: ignore[arg-type]
    assert ratio < 24, f"{shape}: 8x the input took {ratio:.0f}x the time (linear is ~8)"


# -- stack dumps found in logs (watchdog/sources/logs/stackdumps.py) ------------------------------

DUMP_PIECES = st.sampled_from(
    [
        "Process 42: python -m vllm\n",
        "Python v3.12.1 (/usr/bin/python3.12)\n",
        'Thread 42 (active+gil): "MainThread"\n',
        "    synchronize (torch/cuda/streams.py:224)\n",
        "    cudaStreamSynchronize (libcudart.so.12)\n",
        "Thread 0x00007f0000000000 (most recent call first):\n",
        "Current thread 0x00007f (most recent call first):\n",
        '  File "/x/y.py", line 12 in wait\n',
        "Traceback (most recent call last):\n",
        '  File "/x/y.py", line 3, in <module>\n',
        "Thread 2 (Thread 0x7f (LWP 43)):\n",
        "#0  0x00007f in pthread_cond_wait () from /lib/libc.so.6\n",
        "#1  0x0000 in ncclGroupEnd () at src/group.cc:100\n",
        "(Worker_TP1 pid=7) ",
        "[2025-01-01 12:00:00 TP0] ",
        "\n",
        "RuntimeError: boom\n",
    ]
)


@FUZZ
@given(st.lists(DUMP_PIECES | st.text(max_size=12), max_size=40).map("".join))
def test_any_log_text_gives_stack_events_or_none(text: str) -> None:
    from watchdog.sources.logs.stackdumps import scan_lines

    events = scan_lines(text.split("\n"), source="fuzz")
    assert all(isinstance(e, LogEvent) and e.kind == "stack" for e in events)


def test_stack_scanning_scales_linearly() -> None:
    from watchdog.sources.logs.stackdumps import scan_lines

    def make(n: int) -> list[str]:
        head = ["Thread 0x00007f0000000000 (most recent call first):"]
        return head + ['  File "/x/y.py", line 12 in wait'] * n + ["", "INFO done"]

    assert growth(make, lambda lines: scan_lines(lines), 2000) < 24  # type: ignore[arg-type]
