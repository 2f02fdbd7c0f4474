"""The one deadline mechanism: a blocking call runs in a long-lived daemon thread, and the
caller waits for it no longer than its deadline.

The loop polls each source through a `DeadlineCall`, the GPU source runs its NVML calls on its
own `Worker`, and pre-flight's probes go through `call_with_deadline`. A hung driver call or a
read of `/proc/PID/cmdline` or `environ` (which waits for the target's mmap lock, held by a
process stuck in the driver) must not freeze the loop: the self-watchdog would stop pinging,
systemd would restart the watchdog, and it would block again. A call past its deadline marks
the source down; later calls skip the source until the stuck one returns, so stuck threads
never pile up.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from watchdog.sources.base import PROC_HINT, SourceHealth
from watchdog.sources.schedstat import run_queue_wait_s

T = TypeVar("T")

Job = tuple[Callable[[], Any], "Future[Any]"]


# Run-queue wait over this share of a missed deadline reads as CPU starvation.
STARVED_SHARE = 0.5


class Worker:
    """One long-lived daemon thread running jobs in order (daemon: a call stuck in the driver
    must not block interpreter exit, which ThreadPoolExecutor's non-daemon threads would)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except Exception as exc:  # relayed to the caller through the future, not swallowed
                fut.set_exception(exc)


class DeadlineCall:
    """Calls into one source from a worker thread; None (and the source down) past the deadline.

    Exceptions from the call propagate to the caller, whose own guard decides what they mean.
    """

    def __init__(
        self,
        name: str,
        health: SourceHealth | None,
        deadline_s: float,
        *,
        hint: str = PROC_HINT,
        keep_late: bool = False,
        run_queue: Callable[[], float | None] = run_queue_wait_s,
    ) -> None:
        self.name, self.health, self.deadline_s = name, health, deadline_s
        # Read before every call (the loop passes its RunQueueMeter's, which costs less).
        self._run_queue = run_queue
        self.hint = hint
        # keep_late: a call that returns after its deadline hands its result to the next call
        # (log lines read late are still evidence; a late GPU sample is only stale).
        self.keep_late = keep_late
        self._worker: Worker | None = None
        self._stuck: Future[Any] | None = None

    def __call__(self, fn: Callable[[], T]) -> T | None:
        if self._stuck is not None:
            if not self._stuck.done():
                self._down()
                return None
            late, self._stuck = self._stuck, None
            if self.keep_late:
                return late.result()
        if self._worker is None:
            self._worker = Worker(f"{self.name}-poll")
        waited = self._run_queue()
        fut = self._worker.submit(fn)
        try:
            return fut.result(timeout=self.deadline_s)
        except FutureTimeout:
            self._stuck = fut
            after = self._run_queue()
            starved = None if waited is None or after is None else after - waited
            self._down(starved)
            return None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _down(self, starved_s: float | None = None) -> None:
        if self.health is None:
            return
        hint = self.hint
        if starved_s is not None and starved_s >= STARVED_SHARE * self.deadline_s:
            hint = (
                f"the watchdog's threads waited {starved_s:.1f} s for a CPU meanwhile: the host "
                "is saturated, not the read stuck; give the watchdog CPU priority (systemd "
                "CPUWeight=/Nice=, a Kubernetes CPU request)"
            )
        self.health.down(
            f"{self.name} poll did not return within {self.deadline_s:.1f} s ({hint}); "
            "skipped until it does"
        )


class DeadlineExceeded(TimeoutError):
    """The call did not return within its deadline; it may still be blocked in its thread."""


def call_with_deadline(fn: Callable[[], T], timeout_s: float, *, name: str = "probe") -> T:
    """Return `fn()`, re-raise what it raised, or raise DeadlineExceeded after `timeout_s`.

    For one-off probes (pre-flight): timeouts inside a library do not cover everything (httpx's
    does not bound the DNS lookup, `statvfs` on a hung NFS mount has none). Past the deadline
    the caller moves on and the thread is abandoned; it ends with the process.
    """
    worker = Worker(name)
    fut = worker.submit(fn)
    worker.stop()  # the thread ends after this one job
    try:
        return fut.result(timeout=timeout_s)
    except FutureTimeout:
        raise DeadlineExceeded(f"{name} did not return within {timeout_s:g} s") from None
