"""SourceHealth logs each outage, bounds what it remembers, and is not fooled by changing text."""

from __future__ import annotations

import logging

import pytest

from watchdog.sources.base import SourceHealth


def downs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "down" in r.getMessage()]


def test_a_second_outage_with_the_same_cause_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    h = SourceHealth("vllm")
    h.down("vllm poll did not return within 5.0 s")
    h.down("vllm poll did not return within 5.0 s")
    h.ok()
    h.down("vllm poll did not return within 5.0 s")
    assert len(downs(caplog)) == 2
    assert h.outages == 2


def test_changing_error_text_is_logged_a_bounded_number_of_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = SourceHealth("gpu", max_distinct=3)
    for i in range(200):
        h.down(f"unexpected error: KeyError('gpu-{chr(65 + i % 26)}{chr(97 + i // 26)}')")
    assert len(downs(caplog)) == 4  # three distinct, then one "still down ... not logged"
    assert "not logged" in downs(caplog)[-1]
    assert len(h._seen) <= 4


def test_numbers_in_an_error_do_not_make_it_new(caplog: pytest.LogCaptureFixture) -> None:
    h = SourceHealth("gpu")
    for i in range(50):
        h.down(f"no GPU samples for {i} s")
    assert len(downs(caplog)) == 1
