"""Every watchdog a fault test started is stopped after it, even when the test failed early:
a fault test must never leave an orphan behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.harness import STARTED


@pytest.fixture(autouse=True)
def no_orphan_watchdogs() -> Iterator[None]:
    yield
    while STARTED:
        wd = STARTED.pop()
        if wd.proc.poll() is None:
            wd.proc.kill()
            wd.proc.wait(timeout=10)
        wd._close_files()
