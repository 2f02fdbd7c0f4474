"""Inputs the fuzzer found that escaped a parser's documented error: each parser of outside
input raises only its own error (which the source turns into "down, with the reason")."""

from __future__ import annotations

import contextlib

import pytest

from watchdog.sources.gpu.dcgm import parse_dcgm
from watchdog.sources.rasreport import RasError, parse_report


@pytest.mark.parametrize("text", ["# TYPE \xa0 0", "# TYPE \u2003", "# HELP \xa0"])
def test_dcgm_text_with_a_lone_unicode_space_is_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):  # the documented error: the source goes down with it
        parse_dcgm(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"communicators": [{"hash": "0x1", "size": 1e400}]}', "out of range"),
        ('{"communicators": [{"hash": "0x1", "size": 2, "ranks": [{"rank": -1e999}]}]}', "range"),
    ],
)
def test_a_ras_report_nested_deep_or_out_of_range_is_a_ras_error(text: str, why: str) -> None:
    with pytest.raises(RasError, match=why):
        parse_report(text)
