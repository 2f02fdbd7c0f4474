"""Property tests for the parsers of what servers, collectors and py-spy write: only each
parser's documented error escapes, and hostile input is handled in linear time."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzzkit import FUZZ, growth
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import Observation
from watchdog.core.state.timeline import parse_timeline
from watchdog.core.state.window import Window
from watchdog.sources.gpu.dcgm import parse_dcgm
from watchdog.sources.gpu.file import BadLine
from watchdog.sources.gpu.file import parse_line as parse_gpu_line
from watchdog.sources.logs.split import LineSplitter, split_records
from watchdog.sources.stacks.parse import DumpParseError, parse_dump_json

SIGS = load_signatures([])

# JSON values of any shape, including the numbers that break float() and int().
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=25,
)
THREAD_KEYS = st.sampled_from(
    ["pid", "thread_id", "os_thread_id", "thread_name", "active", "owns_gil", "frames"]
)
FRAME_KEYS = st.sampled_from(["name", "filename", "module", "short_filename", "line", "locals"])
FRAME = st.dictionaries(FRAME_KEYS, JSON, max_size=6)
THREAD = st.dictionaries(THREAD_KEYS, JSON | st.lists(FRAME, max_size=4), max_size=7)


# -- py-spy JSON ----------------------------------------------------------------------------


@settings(parent=FUZZ, max_examples=60)
@given(st.lists(THREAD, max_size=3))
def test_pyspy_json_of_any_shape_is_parsed_or_refused(threads: list[dict]) -> None:
    text = json.dumps(threads, default=str)
    try:
        raw, parsed = parse_dump_json(text)
    except DumpParseError:
        return
    assert len(parsed) == len(raw)
    for t in parsed:
        assert isinstance(t.thread_id, int) and all(isinstance(f.line, int) for f in t.frames)


@FUZZ
@given(st.text(max_size=200))
def test_pyspy_text_that_is_not_json_is_refused(text: str) -> None:
    with contextlib.suppress(DumpParseError):
        parse_dump_json(text)


def test_pyspy_json_scales_linearly() -> None:
    def make(n: int) -> str:
        frame = {"name": "f", "filename": "x.py", "line": 1}
        return json.dumps([{"thread_id": i, "frames": [frame] * 20} for i in range(n)])

    assert growth(make, parse_dump_json, 200) < 24


# -- GPU file lines ---------------------------------------------------------------------------

GPU_KEYS = st.sampled_from(
    ["gpu", "sm", "dram", "ts", "procs", "pids", "uuid", "name", "cc", "power_w", "sm_clock_mhz"]
)


@FUZZ
@given(st.dictionaries(GPU_KEYS, JSON, max_size=8))
def test_gpu_file_line_is_a_sample_or_a_bad_line(obj: dict) -> None:
    try:
        sample, ts = parse_gpu_line(json.dumps(obj, default=str))
    except BadLine:
        return
    assert 0 <= sample.index <= 1023 and 0 <= sample.sm <= 1
    assert sample.dram is None or 0 <= sample.dram <= 1
    assert ts is None or isinstance(ts, float)


@FUZZ
@given(st.binary(max_size=300))
def test_gpu_file_bytes_are_a_sample_or_a_bad_line(data: bytes) -> None:
    with contextlib.suppress(BadLine):
        parse_gpu_line(data)


# -- the line splitter --------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=20), st.integers(min_value=1, max_value=64))
def test_line_splitter_keeps_every_byte_or_bounds_the_line(chunks: list[bytes], limit: int) -> None:
    splitter = LineSplitter(limit)
    lines: list[str] = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    tail = splitter.flush()
    lines += [tail] if tail else []
    assert all(isinstance(line, str) for line in lines)
    for line in lines:
        assert len(line.encode("utf-8", "surrogateescape")) <= 4 * limit + 64


@FUZZ
@given(st.text(max_size=400))
def test_split_records_returns_text(line: str) -> None:
    records = split_records(line)
    assert all(isinstance(r, str) for r in records)


def test_line_splitter_scales_linearly() -> None:
    def run(data: object) -> None:
        s = LineSplitter(65536)
        for i in range(0, len(data), 4096):  # type: ignore[arg-type]
            s.feed(data[i : i + 4096])  # type: ignore[index]

    assert growth(lambda n: b"x" * n + b"\r" * n + b"\n", run, 20_000) < 24


# -- timeline -------------------------------------------------------------------------------

OBS_KEYS = st.sampled_from(
    ["t", "wall", "gpus", "logs", "server", "procs", "conns", "stacks", "facts", "sources", "vllm"]
)


@FUZZ
@given(st.lists(st.dictionaries(OBS_KEYS, JSON, max_size=8), max_size=4))
def test_timeline_lines_are_observations_or_a_value_error(objs: list[dict]) -> None:
    data = "\n".join(json.dumps(o, default=str) for o in objs).encode()
    try:
        out = parse_timeline(data, "fuzz.jsonl")
    except ValueError as exc:
        assert str(exc).startswith("fuzz.jsonl")
        return
    assert all(isinstance(o, Observation) for o in out)
    window = Window()
    for o in sorted(out, key=lambda o: o.t):
        window.append(o)
        classify(window, SIGS, Thresholds())  # what replay does with it: must not raise


@FUZZ
@given(st.binary(max_size=300))
def test_timeline_bytes_are_observations_or_a_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        parse_timeline(data, "fuzz.jsonl")


def test_timeline_with_non_numeric_time_is_refused() -> None:
    with pytest.raises(ValueError, match="must be a number"):
        parse_timeline(b'{"t":"x","wall":2}', "bad.jsonl")


# -- DCGM exporter text ----------------------------------------------------------------------

DCGM_NAMES = st.sampled_from(
    [
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
    ]
)
VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1" * 400, "0x10", "", "1e999"]),
)
LABEL = st.text(st.characters(codec="ascii", exclude_characters='"\\\n'), max_size=30)


@FUZZ
@given(st.lists(st.tuples(DCGM_NAMES, LABEL, VALUE), max_size=12))
def test_dcgm_text_is_samples_or_a_value_error(rows: list[tuple[str, str, str]]) -> None:
    text = "".join(f'{name}{{gpu="{gpu}",UUID="GPU-1"}} {value}\n' for name, gpu, value in rows)
    try:
        samples = parse_dcgm(text)
    except ValueError:
        return
    for s in samples:
        assert s.index >= 0
        assert s.sm is None or 0 <= s.sm <= 1


@FUZZ
@given(st.text(max_size=300))
def test_dcgm_arbitrary_text_is_samples_or_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_dcgm(text)
