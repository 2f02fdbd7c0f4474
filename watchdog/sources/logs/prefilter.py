"""Which lines of a block of log bytes can matter, found without looking at each line.

Every line that yields a LogEvent contains one of a few literal keys: the parser's guards
(`logparse.literal_keys()`) and a literal that every match of the signatures' keep pattern
must contain (derived here from the pattern itself). One scan of the whole block for those
keys finds the few lines worth decoding and parsing; a busy server's access lines are never
split, decoded or cleaned. Lines with an ANSI escape are always candidates, because removing
the escape can join a key that the raw bytes split.

The scan uses Hyperscan (Intel's multi-literal matcher, PyPI `hyperscan`) where it is
installed: it finds all keys in one pass at several GB/s. Without it, one `bytes.find` pass per
key (stdlib: about 35 ms a MB over the shipped ~180 keys, still far faster than per-line
regexes). A long-running daemon loads Hyperscan only once its log's volume asks for it (1 MiB
within 10 s: below that `bytes.find` costs under 0.4 % of a core, and the binding with the
libstdc++ it brings is about 2 MiB of RSS), and compiles its database in a child process
(sources/logs/hsbuild.py): the compiler's memory and code pages leave with the child.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from watchdog.core.knowledge.literals import required_literals
from watchdog.sources.logs.hsbuild import compile_apart
from watchdog.sources.logs.split import line_spans

# A daemon's log that brings this many bytes within the window is busy enough for Hyperscan.
VOLUME_BYTES = 1 << 20
VOLUME_WINDOW_S = 10.0

_ESC = b"\x1b"
_Lits = tuple[str, ...]

__all__ = ["Prefilter", "keys_of", "required_literals", "spans_at"]


class Prefilter:
    """Finds the lines of a block that contain any key (or an ANSI escape)."""

    def __init__(
        self,
        keys: Iterable[str] | None,
        *,
        hyperscan: bool = True,
        in_child: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`keys=None` disables the filter: every line is a candidate; `hyperscan=False`
        uses the stdlib scan even where Hyperscan is installed (tests run both); `in_child`
        is the long-running daemon: Hyperscan is loaded once the log brings VOLUME_BYTES
        within VOLUME_WINDOW_S, and its database is compiled in a child process (hsbuild.py)."""
        self.keys: tuple[bytes, ...] | None = None
        self._db = None
        self._pending = False  # Hyperscan wanted, waiting for the volume that pays for it
        self._in_child = in_child
        self._clock = clock
        self._since = 0.0
        self._seen = 0
        if keys is None:
            return
        uniq = sorted({k.encode() for k in keys if k} | {_ESC})
        self.keys = tuple(k for k in uniq if not any(o != k and o in k for o in uniq))
        if hyperscan and in_child:
            self._pending = True
        elif hyperscan:
            self._load()

    def _load(self) -> None:
        """Hyperscan's database of the keys, where the binding is installed and will build."""
        self._pending = False
        hs = _hyperscan()
        if hs is None or self.keys is None:
            return
        db = compile_apart(hs, self.keys) if self._in_child else None
        self._db = db if db is not None else _compile(hs, self.keys)

    def _busy(self, size: int) -> bool:
        """Has the log brought VOLUME_BYTES within VOLUME_WINDOW_S, this block included?"""
        now = self._clock()
        if now - self._since > VOLUME_WINDOW_S:
            self._since, self._seen = now, 0
        self._seen += size
        return self._seen >= VOLUME_BYTES

    @property
    def engine(self) -> str:
        """Which scanner runs: "hyperscan", "find" or "off" (shown by the benchmarks)."""
        if self.keys is None:
            return "off"
        return "hyperscan" if self._db is not None else "find"

    def hits(self, block: bytes) -> list[int]:
        """Offsets in `block` where some key ends (unsorted, may repeat); None-filter: []."""
        if self.keys is None:
            return []
        if self._pending and self._busy(len(block)):
            self._load()
        if self._db is not None:
            found: list[int] = []
            self._db.scan(block, match_event_handler=_collector(found))
            return found
        out: list[int] = []
        for key in self.keys:
            i = block.find(key)
            while i >= 0:
                out.append(i)
                i = block.find(key, i + len(key))
        return out

    def spans(self, block: bytes) -> list[tuple[int, int]]:
        """(start, end) of each candidate line, in order, EOLs excluded; all lines if off."""
        if self.keys is None:
            return line_spans(block)
        return spans_at(block, self.hits(block))


def spans_at(block: bytes, positions: Iterable[int]) -> list[tuple[int, int]]:
    """(start, end) of each line holding one of `positions`, in order, once each."""
    out: list[tuple[int, int]] = []
    last_end = -1
    for pos in sorted(positions):
        if pos < last_end:
            continue
        start = _line_start(block, pos)
        end = _line_end(block, pos)
        out.append((start, end))
        last_end = end
    return out


def keys_of(patterns: Iterable[re.Pattern[str] | None]) -> _Lits | None:
    """The literal keys of every pattern together; None if one of them has none."""
    out: list[str] = []
    for pattern in patterns:
        found = required_literals(pattern)
        if found is None:
            return None
        out += found
    return tuple(out)


def _line_start(block: bytes, pos: int) -> int:
    """Where the line holding `pos` starts (each search bounded by the line, not the block)."""
    nl = block.rfind(b"\n", 0, pos)
    return max(nl, block.rfind(b"\r", nl + 1, pos)) + 1


def _line_end(block: bytes, pos: int) -> int:
    nl = block.find(b"\n", pos)
    cr = block.find(b"\r", pos, nl if nl >= 0 else len(block))
    if cr >= 0:
        return cr
    return nl if nl >= 0 else len(block)


def _hyperscan() -> Any | None:
    """The Hyperscan binding (an optional one, without type information), or None."""
    try:
        return importlib.import_module("hyperscan")
    except ImportError:  # pragma: no cover - depends on the platform's wheels
        return None


def _compile(hs: Any, keys: Sequence[bytes]) -> Any:
    """A Hyperscan block-mode database of the keys; None (stdlib scan) if it will not build."""
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    exprs = [re.escape(k) for k in keys]
    try:
        db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs))
    except hs.error:  # pragma: no cover - a CPU without SSSE3, say
        return None
    return db


def _collector(found: list[int]):  # noqa: ANN202 - hyperscan's callback signature
    append = found.append

    def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
        append(end - 1)

    return on_match
