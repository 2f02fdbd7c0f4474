"""GPU samples from a JSON Lines file another program appends to (`--gpu-source file:PATH`).

For hosts where the watchdog may not touch NVML itself: any collector (a DCGM script, a
vendor tool, a test) writes one JSON object per line; this source follows the file like
`tail -F` (the file may appear later, be truncated, or be replaced by rename; a partial last
line waits until its newline arrives). The line format is documented in the README.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeGuard

from watchdog.core.model import GpuSample
from watchdog.sources.base import Deadline, SourceHealth, SourceTick

log = logging.getLogger("hang_watchdog.sources.gpu.file")

MAX_LINE_BYTES = 1 << 20  # a "line" longer than this without a newline is dropped as bad
# A file that already holds samples is joined near its end, as `tail -F` would: the newest
# samples are what counts, and a collector's file of many megabytes must not stall the start.
START_TAIL_BYTES = 1 << 20
READ_CHUNK_BYTES = 8 << 20  # at most this much per poll; the rest waits for the next one
WARN_LIMIT = 10  # per-line warnings before the rest are only counted
PID_MAX = 1 << 22  # the kernel's ceiling for /proc/sys/kernel/pid_max
MAX_GPU_INDEX = 1023  # NVML numbers GPUs from 0; no host has more (a larger one is a typo)


class BadLine(ValueError):
    """One line of the GPU file that is not a valid sample."""


@dataclass(frozen=True)
class _Seen:
    sample: GpuSample
    ts: float | None  # the line's own timestamp
    arrived: float  # when this source read it (same clock as `ts`: Unix seconds)


class GpuFileSource:
    """Follows a JSON Lines file of GPU samples; poll() gives the newest sample per GPU."""

    part = "gpus"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stale_after_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        name: str = "gpu",
        logger: logging.Logger = log,
    ) -> None:
        self.name = name
        self.health = SourceHealth(name)
        self.path = os.fspath(path)
        self.stale_after_s = stale_after_s
        self.bad_lines = 0  # lines skipped (bad JSON, missing or out-of-range fields)
        self._clock = clock
        self._log = logger
        self._fh: IO[bytes] | None = None
        self._buf = b""
        self._line_no = 0
        self._warned = 0
        self._latest: dict[int, _Seen] = {}
        self._silent: set[int] = set()  # GPUs already reported as silent
        self._joined = False  # the first open starts near the end; later files from the start

    def deadline(self, tick_s: float) -> Deadline:
        # A FIFO or a hung network mount at the path blocks open() or read() for ever.
        return Deadline(3.0, hint="a FIFO or a hung network mount at the GPU file?")

    def poll(self, tick: SourceTick | None = None) -> tuple[GpuSample, ...]:
        """The newest sample of each GPU; () while down (no file, nothing yet, or stale)."""
        try:
            self._follow()
        except OSError as exc:
            self.health.down(f"cannot read GPU samples from {self.path}: {exc}")
            return ()
        if not self._latest:
            if self._fh is None:
                self.health.down(f"GPU sample file {self.path} does not exist (yet)")
            else:
                self.health.down(f"no GPU samples in {self.path} yet")
            return ()
        now = self._clock()
        ages = {i: now - _stamp(s) for i, s in self._latest.items()}
        fresh = sorted(i for i, age in ages.items() if age <= self.stale_after_s)
        self._say_silent(ages)
        if not fresh:
            self.health.down(f"no GPU samples in {self.path} for {min(ages.values()):.0f} s")
            return ()
        self.health.ok()
        # A GPU that went silent has no current figures: reporting its last ones for ever
        # would hide exactly the GPU that stopped (its collector died with it, or it fell off).
        return tuple(self._latest[i].sample for i in fresh)

    def _say_silent(self, ages: dict[int, float]) -> None:
        silent = {i for i, age in ages.items() if age > self.stale_after_s}
        for i in sorted(silent - self._silent):
            self._log.warning(
                "%s: no sample for GPU %d for %.0f s; its figures are dropped until it reports",
                self.path, i, ages[i],
            )  # fmt: skip
        self._silent = silent

    def close(self) -> None:
        """Close the followed file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- following the file ------------------------------------------------------------------

    def _follow(self) -> None:
        """Read what is new; handle a late file, truncation, and replacement by rename."""
        if self._fh is None and not self._open():
            return
        assert self._fh is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._read_new()  # renamed away, no successor yet: finish the old file
            return
        mine = os.fstat(self._fh.fileno())
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            self._read_new()  # drain the old file, then switch to the new one
            self.close()
            self._open()
        elif st.st_size < self._fh.tell():
            self._log.info("%s was truncated; reading it from the start", self.path)
            self._fh.seek(0)
            self._restart()
        self._read_new()

    def _open(self) -> bool:
        try:
            self._fh = open(self.path, "rb")  # noqa: SIM115 - held open across polls on purpose
        except FileNotFoundError:
            return False
        self._restart()
        if not self._joined:
            self._joined = True
            size = os.fstat(self._fh.fileno()).st_size
            if size > START_TAIL_BYTES:
                self._fh.seek(size - START_TAIL_BYTES)
                self._fh.readline()  # the rest of a line cut in the middle
                self._log.info(
                    "%s holds %d bytes already; reading its last %d", self.path, size,
                    START_TAIL_BYTES,
                )  # fmt: skip
        return True

    def _restart(self) -> None:
        self._buf = b""
        self._line_no = 0

    def _read_new(self) -> None:
        assert self._fh is not None
        data = self._fh.read(READ_CHUNK_BYTES)
        if not data:
            return
        *lines, self._buf = (self._buf + data).split(b"\n")
        for raw in lines:
            self._line_no += 1
            self._take(raw)
        if len(self._buf) > MAX_LINE_BYTES:
            self._line_no += 1
            self._reject(f"line longer than {MAX_LINE_BYTES} bytes without a newline")
            self._buf = b""

    def _take(self, raw: bytes) -> None:
        text = raw.strip()
        if not text:
            return
        try:
            sample, ts = parse_line(text)
        except BadLine as exc:
            self._reject(str(exc))
            return
        self._latest[sample.index] = _Seen(sample, ts, self._clock())

    def _reject(self, why: str) -> None:
        self.bad_lines += 1
        self._warned += 1
        if self._warned <= WARN_LIMIT:
            self._log.warning("%s line %d skipped: %s", self.path, self._line_no, why)
        if self._warned == WARN_LIMIT:
            self._log.warning("%s: further bad lines are counted, not logged", self.path)


# -- the line format -------------------------------------------------------------------------

_OPTIONAL_NUMBERS = ("power_w", "sm_clock_mhz", "power_limit_w", "sm_clock_max_mhz")
_OPTIONAL_TEXT = ("uuid", "name", "cc")


def parse_line(text: bytes | str) -> tuple[GpuSample, float | None]:
    """One JSON line as (sample, ts); raises BadLine saying what is wrong."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadLine(f"not valid JSON ({exc})") from exc
    except RecursionError as exc:  # `[[[[...` nested past the parser's depth limit
        raise BadLine("JSON nested too deeply for a GPU sample") from exc
    if not isinstance(obj, dict):
        raise BadLine("not a JSON object")
    index = obj.get("gpu")
    if not _is_int(index) or not 0 <= index <= MAX_GPU_INDEX:
        shown = repr(index) if not _is_int(index) or index < 10**12 else "a huge number"
        raise BadLine(f'"gpu" must be a GPU index (integer 0-{MAX_GPU_INDEX}), got {shown}')
    sm = _ratio(obj, "sm")
    # `"dram": null` says the collector has no DRAM figure (GB10, GeForce without GPM); the
    # spin is then judged by power. A missing key is still an error: it is usually a typo.
    dram = None if "dram" in obj and obj["dram"] is None else _ratio(obj, "dram")
    tensor = None if obj.get("tensor") is None else _ratio(obj, "tensor")  # optional
    extra: dict[str, Any] = {}
    for key in _OPTIONAL_NUMBERS:
        extra[key] = _optional(obj, key, _is_number, "a number")
    for key in _OPTIONAL_TEXT:
        extra[key] = _optional(obj, key, lambda v: isinstance(v, str), "a string")
    procs = _optional(obj, "procs", lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    pids = _optional(obj, "pids", _is_pid_list, "a list of integer PIDs")
    ts = _optional(obj, "ts", _is_number, "Unix seconds")
    sample = GpuSample(
        index=index,
        sm=sm,
        dram=dram,
        procs=procs if procs is not None else (len(pids) if pids is not None else None),
        pids=tuple(pids or ()),
        tensor=tensor,
        method="file",
        **extra,
    )
    return sample, float(ts) if ts is not None else None


def _stamp(seen: _Seen) -> float:
    """When a sample was taken: its own `ts`, but never later than its arrival (a `ts` in the
    future, from a skewed clock, would keep a dead writer's last sample fresh for ever)."""
    return seen.arrived if seen.ts is None else min(seen.ts, seen.arrived)


def _ratio(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if not _is_number(value):
        raise BadLine(f'"{key}" is required and must be a ratio 0-1, got {value!r}')
    if not 0.0 <= value <= 1.0:
        raise BadLine(f'"{key}" is {value!r}, outside 0-1 (write ratios, not percent)')
    return float(value)


def _optional(obj: dict[str, Any], key: str, ok: Callable[[Any], bool], what: str) -> Any:
    value = obj.get(key)
    if value is not None and not ok(value):
        raise BadLine(f'"{key}" must be {what}, got {value!r}')
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float; JSON allows integers too large for a float (OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value == value and -1e300 < value < 1e300


def _is_pid_list(value: object) -> bool:
    return isinstance(value, list) and all(_is_int(v) and 0 < v <= PID_MAX for v in value)
