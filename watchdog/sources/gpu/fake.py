"""A scripted GPU backend for tests and demos: the same interface as NvmlBackend, no hardware.

Script each GPU with a list of samples (one per `sample()` call; the last repeats) or a
callable `f(call_number) -> GpuSample`. Inject failures per call name ("init", "device_count",
"sample", "driver_version", "fabric", "shutdown"):

    fake = FakeGpuBackend({0: [GpuSample(index=0, sm=0.99, dram=0.0)]})
    fake.fail_next("sample", GpuError("boom"))     # the next sample() raises
    fake.hang_next("sample", 30.0)                 # the next sample() blocks up to 30 s
    fake.release()                                 # unblocks every hung call now
    fake.lost.add(1)                               # GPU 1 raises "GPU 1 is lost" until removed
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from watchdog.core.model import GpuSample
from watchdog.sources.gpu.backend import FabricInfo, GpuError

Script = Sequence[GpuSample] | Callable[[int], GpuSample]


class FakeGpuBackend:
    """`GpuBackend` whose answers, errors and hangs the test decides. Thread-safe."""

    def __init__(
        self,
        script: Mapping[int, Script] | int = 1,
        *,
        driver: str | None = "580.00.00",
        fabric: Mapping[int, FabricInfo | None] | None = None,
    ) -> None:
        if isinstance(script, int):
            script = {
                i: [GpuSample(index=i, sm=0.0, dram=0.0, procs=0, method="fake")]
                for i in range(script)
            }
        self._script: dict[int, Script] = dict(script)
        self._driver = driver
        self._fabric = dict(fabric or {})
        self._counts: dict[int, int] = {}
        self._fail: dict[str, list[Exception]] = {}
        self._hang: dict[str, list[float]] = {}
        self._releases: list[threading.Event] = []
        self._lock = threading.Lock()
        self.lost: set[int] = set()  # indexes whose sample()/fabric() raise GpuError("... lost")
        self.calls: list[str] = []  # every call name, in order ("sample:0", "init", ...)
        self.initialised = False

    # -- scripting ---------------------------------------------------------------------------

    def fail_next(self, call: str, error: Exception, times: int = 1) -> None:
        """Make the next `times` calls named `call` raise `error`."""
        with self._lock:
            self._fail.setdefault(call, []).extend([error] * times)

    def hang_next(self, call: str, seconds: float) -> None:
        """Make the next call named `call` block for `seconds` (or until `release()`)."""
        with self._lock:
            self._hang.setdefault(call, []).append(seconds)

    def release(self) -> None:
        """Unblock every call hanging now."""
        with self._lock:
            events, self._releases = self._releases, []
        for event in events:
            event.set()

    def set_script(self, index: int, script: Script) -> None:
        """Replace one GPU's script (adds the GPU if new); its call count restarts at 0."""
        with self._lock:
            self._script[index] = script
            self._counts[index] = 0

    # -- GpuBackend --------------------------------------------------------------------------

    def init(self) -> None:
        self._enter("init")
        self.initialised = True

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self._script)

    def sample(self, index: int) -> GpuSample:
        self._enter("sample", index)
        with self._lock:
            script = self._script.get(index)
            n = self._counts.get(index, 0)
            self._counts[index] = n + 1
        if script is None:
            raise GpuError(f"GPU {index} does not exist (fake has {len(self._script)})")
        got = script(n) if callable(script) else script[min(n, len(script) - 1)]
        return got if got.index == index else replace(got, index=index)

    def driver_version(self) -> str | None:
        self._enter("driver_version")
        return self._driver

    def fabric(self, index: int) -> FabricInfo | None:
        self._enter("fabric", index)
        return self._fabric.get(index)

    def shutdown(self) -> None:
        self._enter("shutdown")
        self.initialised = False

    # -- internals ---------------------------------------------------------------------------

    def _enter(self, call: str, index: int | None = None) -> None:
        """Record the call, then apply any scripted hang, error, or lost GPU."""
        with self._lock:
            self.calls.append(call if index is None else f"{call}:{index}")
            hang = self._hang[call].pop(0) if self._hang.get(call) else None
            error = self._fail[call].pop(0) if self._fail.get(call) else None
            event = threading.Event()
            if hang is not None:
                self._releases.append(event)
        if hang is not None:
            event.wait(hang)
        if error is not None:
            raise error
        if index is not None and index in self.lost:
            raise GpuError(f"GPU {index} is lost (fake)")
