"""The scorecard's short form (one run of one class) against the real engine: the command the
full card runs outside CI works, and its row says what the run showed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.real_engine.engine import REPO


def test_one_run_of_the_worker_exception_class_prints_its_row(
    real_python: str, serving_dtype: str
) -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "scorecard.py"), "--runs", "1"]
    argv += ["--classes", "worker_exception", "--dtype", serving_dtype]
    env = {**os.environ, "HANG_WATCHDOG_REAL_ENGINE_PYTHON": real_python}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    row = next(x for x in out.stdout.splitlines() if x.startswith("| exception in the worker"))
    print(f"\n{row}")
    assert "| 1 |" in row and "1/1 `engine_dead`" in row, out.stdout[-3000:]


pytestmark = pytest.mark.real_engine
