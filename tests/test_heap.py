"""daemon/heap.py: freed C heap goes back to the kernel where the C library is glibc."""

from __future__ import annotations

import platform
import sys

import pytest

from watchdog.daemon.heap import release_free_heap


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_freed_heap_between_live_blocks_is_released() -> None:
    # 64 KiB blocks sit in the heap (below glibc's 128 KiB mmap threshold); every tenth stays
    # alive, so the free pages lie between live blocks, where only malloc_trim returns them.
    blocks = [bytearray(64 << 10) for _ in range(1000)]
    keep = blocks[::10]
    del blocks
    assert release_free_heap() is True
    assert len(keep) == 100
