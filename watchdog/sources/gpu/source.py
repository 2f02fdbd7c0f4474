"""The GPU source: calls a GpuBackend in one worker thread with a deadline per poll.

NVML calls can block for a long time when the driver is wedged (the very situation the
watchdog exists for), so the loop never calls the backend directly: a stuck call marks the
source down, later polls return () at once while it is still stuck, and the source recovers
when the call returns. The worker is the deadline module's (sources/deadline.py), and the loop
polls this source inline (`Deadline.inline`), so an NVML call runs on that one thread.
`make_gpu_source` turns the `--gpu-source` option into a source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

from watchdog.core.model import GpuSample
from watchdog.sources.base import Deadline, SourceHealth, SourceTick
from watchdog.sources.deadline import Worker
from watchdog.sources.gpu.backend import FabricInfo, GpuBackend, GpuError
from watchdog.sources.gpu.file import GpuFileSource
from watchdog.sources.gpu.nvml import NvmlBackend

if TYPE_CHECKING:  # the dcgm: source (httpx, prometheus_client's parser) loads only when used
    import httpx

    from watchdog.sources.gpu.dcgm import DcgmSource

log = logging.getLogger("hang_watchdog.sources.gpu.backend")

T = TypeVar("T")


class GpuSource:
    """GPU samples from a backend, never blocking the caller longer than `deadline_s` per call."""

    part = "gpus"

    def __init__(
        self,
        backend: GpuBackend,
        *,
        deadline_s: float = 2.0,
        name: str = "gpu",
        clock: Callable[[], float] = time.monotonic,
        init_retry_s: float = 60.0,
        logger: logging.Logger = log,
    ) -> None:
        self.name = name
        self.health = SourceHealth(name)
        self._backend = backend
        self._deadline_s = deadline_s
        self._clock = clock
        self._init_retry_s = init_retry_s
        self._log = logger
        self._worker: Worker | None = None  # started on first use, not at construction
        self._pending: tuple[str, Future[Any]] | None = None  # a call past its deadline
        self._ready = False
        self._next_init_at: float | None = None
        self._lost_seen: set[str] = set()

    def deadline(self, tick_s: float) -> Deadline:
        """Inline: the worker bounds each call; a poll is at most an init and a read."""
        return Deadline(2 * self._deadline_s, inline=True)

    def poll(self, tick: SourceTick | None = None) -> tuple[GpuSample, ...]:
        """Every GPU now; () while down. Never raises, never blocks past the deadline."""
        if not self._settle_pending() or not self._ensure_init():
            return ()
        got = self._call("poll", self._read_all)
        if got is None:
            return ()
        samples, lost = got
        for message in lost:
            if message not in self._lost_seen:
                self._lost_seen.add(message)
                self._log.warning("%s: %s (reported as an empty placeholder)", self.name, message)
        self.health.ok()
        return tuple(samples)

    def driver_version(self) -> str | None:
        """The driver version, or None when the source is down or the call fails."""
        if not self._settle_pending() or not self._ensure_init():
            return None
        return self._call("driver_version", self._backend.driver_version)

    def fabric(self, index: int) -> FabricInfo | None:
        """NVLink fabric state of one GPU, or None when unknown or unsupported."""
        if not self._settle_pending() or not self._ensure_init():
            return None
        return self._call("fabric", lambda: self._backend.fabric(index))

    def close(self) -> None:
        """Shut the backend down (unless a call is stuck) and stop the worker."""
        if self._worker is None:
            return
        if self._ready and self._settle_pending():
            self._call("shutdown", self._backend.shutdown)
        self._worker.stop()
        self._worker = None
        self._ready = False

    # -- internals ---------------------------------------------------------------------------

    def _read_all(self) -> tuple[list[GpuSample], list[str]]:
        """Runs in the worker: every GPU, a placeholder for each one that fails."""
        samples: list[GpuSample] = []
        lost: list[str] = []
        for index in range(self._backend.device_count()):
            try:
                samples.append(self._backend.sample(index))
            except GpuError as exc:
                samples.append(GpuSample(index=index))
                lost.append(str(exc))
        return samples, lost

    def _call(self, kind: str, fn: Callable[[], T]) -> T | None:
        """Run fn in the worker and wait up to the deadline; down (and None) on error/timeout."""
        if self._worker is None:
            self._worker = Worker(f"{self.name}-backend")
        fut = self._worker.submit(fn)
        try:
            return fut.result(timeout=self._deadline_s)
        except FutureTimeout:
            self._pending = (kind, fut)
            self.health.down(self._stuck_message())
        except (GpuError, OSError) as exc:
            self.health.down(str(exc))
        return None

    @property
    def deadline_s(self) -> float:
        """The longest a poll waits on the backend."""
        return self._deadline_s

    def _stuck_message(self) -> str:
        return f"NVML call did not return within {self._deadline_s:.1f} s; GPU source down"

    def _settle_pending(self) -> bool:
        """False while a call that missed its deadline is still running."""
        if self._pending is None:
            return True
        kind, fut = self._pending
        if not fut.done():
            self.health.down(self._stuck_message())
            return False
        self._pending = None
        if kind == "init":
            exc = fut.exception()
            self._ready = exc is None
            if exc is not None:
                self.health.down(str(exc))
        return True

    def _ensure_init(self) -> bool:
        """Init the backend once; after a failure retry only every `init_retry_s`."""
        if self._ready:
            return True
        now = self._clock()
        if self._next_init_at is not None and now < self._next_init_at:
            return False
        self._next_init_at = now + self._init_retry_s
        fut_ok = self._call("init", self._init_backend)
        self._ready = bool(fut_ok)
        return self._ready

    def _init_backend(self) -> bool:
        self._backend.init()
        return True


class NullGpuSource:
    """`--gpu-source none`: always down, always empty, says why."""

    deadline_s = 0.0  # never waits on anything
    part = "gpus"

    def __init__(self, name: str = "gpu") -> None:
        self.name = name
        self.health = SourceHealth(name)
        # Set directly, not via down(): disabling on purpose is not worth a warning.
        self.health.last_error = "GPU source disabled (--gpu-source none)"

    def deadline(self, tick_s: float) -> Deadline:
        return Deadline(0.0, inline=True)

    def poll(self, tick: SourceTick | None = None) -> tuple[GpuSample, ...]:
        return ()

    def close(self) -> None:
        return None


if TYPE_CHECKING:
    AnyGpuSource = GpuSource | DcgmSource | GpuFileSource | NullGpuSource

SPEC_HELP = (
    "expected one of: nvml, dcgm:URL (e.g. dcgm:http://127.0.0.1:9400/metrics), "
    "file:PATH (a JSON Lines file), none"
)


def make_gpu_source(
    spec: str,
    *,
    clock: Callable[[], float] = time.monotonic,
    http_client: httpx.Client | None = None,
) -> AnyGpuSource:
    """Build the source named by `--gpu-source`; ValueError with the accepted forms if bad."""
    kind, sep, arg = spec.strip().partition(":")
    if spec.strip() == "nvml":
        return GpuSource(NvmlBackend(), clock=clock)
    if spec.strip() == "none":
        return NullGpuSource()
    if kind == "dcgm" and sep and arg.startswith(("http://", "https://")):
        from watchdog.sources.gpu.dcgm import DcgmSource

        return DcgmSource(arg, client=http_client)
    if kind == "dcgm":
        raise ValueError(f"--gpu-source {spec!r}: dcgm needs an http(s) URL; {SPEC_HELP}")
    if kind == "file" and sep and arg:
        return GpuFileSource(arg)
    raise ValueError(f"--gpu-source {spec!r} is not valid; {SPEC_HELP}")
