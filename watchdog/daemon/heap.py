"""Gives the C heap that start-up freed back to the kernel, so a long-running daemon's RSS is
what its ticks use.

Start-up parses TOML, compiles a few hundred regexes and builds the knowledge; much of what it
allocates in C (glibc malloc) is freed again, but glibc keeps freed heap mapped and counted in
RSS for the life of the process. glibc's `malloc_trim(0)` (malloc/malloc.c; since glibc 2.8 it
also releases free pages inside the heap, not only at its top) returns it: about 0.8 MiB for a
default `run`, and about 15 MiB where the log prefilter's Hyperscan database had to be compiled
in-process (sources/logs/hsbuild.py: its compiler's working memory). Where the C library has no
`malloc_trim` (musl, macOS) this does nothing.
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
