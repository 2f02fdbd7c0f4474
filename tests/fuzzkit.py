"""Shared pieces of the fuzz tests: deterministic hypothesis settings and a scaling check."""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import HealthCheck, settings

# Deterministic in CI (derandomize), no per-example deadline (2 shared cores), small budgets:
# the whole fuzz suite stays near 30 s.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def best_of(fn: Callable[[], object], runs: int = 3) -> float:
    """The fastest of `runs` timings of `fn()`, in seconds (the least noisy figure)."""
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def growth(make: Callable[[int], object], run: Callable[[object], object], n: int) -> float:
    """How much slower `run` gets when its input grows 8x: about 8 when linear, 64 when
    quadratic. A ratio, so the check does not depend on how fast the machine is."""
    small, big = make(n), make(8 * n)
    t_small = max(best_of(lambda: run(small)), 1e-4)
    return best_of(lambda: run(big)) / t_small
