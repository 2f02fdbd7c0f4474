"""A hard deadline for any blocking probe, so pre-flight always finishes.

Timeouts inside a library do not cover everything: httpx's timeout does not bound the DNS lookup
(getaddrinfo blocks in C), and `stat`/`statvfs` on a hung NFS mount block in the kernel with no
timeout at all. The probe runs in a daemon thread; past the deadline the caller moves on and the
thread is abandoned (it ends with the process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The probe did not return within its deadline; it may still be blocked in its thread."""


def call_with_deadline(fn: Callable[[], T], timeout_s: float, *, name: str = "preflight") -> T:
    """Return `fn()`, re-raise what it raised, or raise DeadlineExceeded after `timeout_s`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # handed to the caller, which decides what it expected
            box["error"] = e

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise DeadlineExceeded(f"{name} did not return within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
