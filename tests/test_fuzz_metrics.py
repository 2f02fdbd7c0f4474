"""Fuzz the server's /metrics parser: any text is a ServerSample or its one documented error."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzkit import FUZZ, growth
from watchdog.core.model import ServerSample
from watchdog.engines.loader import load_engines
from watchdog.sources.server import parse_server_metrics, samples_of

SAMPLES = samples_of(load_engines())  # every shipped profile's samples

# Pieces of real exposition text (vLLM, SGLang and TensorRT-LLM names from the shipped
# profiles) and the hostile values a server or a proxy can put in their place.
NAMES = st.sampled_from(
    [
        "vllm:iteration_tokens_total_count",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "sglang:generation_tokens_total",
        "sglang:num_queue_reqs",
        "unrelated_metric_total",
    ]
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=0, max_value=10**400).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "", "x", "1" * 5000]),
)
LABELS = st.sampled_from(["", '{engine="0"}', '{model_name="m",engine="1"}', "{", '{a="}"}'])
LINE = st.one_of(
    st.tuples(NAMES, LABELS, VALUES).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.sampled_from(["# HELP x y", "# TYPE x counter", "", "   "]),
    st.text(max_size=80),
)


def _parsed_or_refused(text: str) -> None:
    try:
        sample = parse_server_metrics(text, SAMPLES)
    except ValueError as exc:
        assert "/metrics" in str(exc)  # the message says what was wrong
        return
    assert isinstance(sample, ServerSample) and sample.up
    for value in (sample.iterations, sample.generation_tokens, sample.running, sample.waiting):
        assert value is None or math.isfinite(value)


@FUZZ
@given(st.lists(LINE, max_size=40))
def test_any_exposition_text_is_a_sample_or_a_value_error(lines: list[str]) -> None:
    _parsed_or_refused("\n".join(lines))


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes_decoded_are_a_sample_or_a_value_error(data: bytes) -> None:
    _parsed_or_refused(data.decode("utf-8", errors="replace"))


def test_a_page_of_unrelated_series_parses_in_linear_time() -> None:
    def page(n: int) -> str:
        wanted = "vllm:generation_tokens_total 5\n"
        return wanted + "".join(f'other_metric{{id="{i}"}} {i}\n' for i in range(n))

    ratio = growth(page, lambda text: parse_server_metrics(text, SAMPLES), 5000)  # type: ignore[arg-type]
    assert ratio < 24, f"8x the page took {ratio:.0f}x the time (linear is ~8)"
