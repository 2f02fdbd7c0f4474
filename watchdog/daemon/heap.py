"""Gives the C heap that start-up freed back to the kernel, so a long-running daemon's RSS is
what its ticks use.

Building the log prefilter compiles a Hyperscan database (`hs_compile_multi`): the database kept
is about 240 KB, but the compiler's working memory (about 15 MiB for the shipped keys, measured
with /proc/self/statm around `Database.compile`) is freed into glibc's heap, which keeps it
mapped and counted in RSS for the life of the process. glibc's `malloc_trim(0)` (malloc/malloc.c,
glibc >= 2.8 also releases free pages inside the heap, not only at its top) returns it. Where
the C library has no `malloc_trim` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("hang_watchdog.heap")


def release_free_heap() -> bool:
    """Return freed C-heap pages to the kernel; True when the C library did (glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    released = bool(trim(0))
    log.debug("malloc_trim(0): %s", "memory released" if released else "nothing to release")
    return released
