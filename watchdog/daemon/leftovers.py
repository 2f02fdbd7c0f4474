"""What a stopped server leaves behind that would fail the next one: NCCL shared-memory segments.

NCCL creates one `/dev/shm/nccl-XXXXXX` file per shared-memory channel (NVIDIA/nccl
src/misc/shmutils.cc, `ncclShmOpen`) and unlinks it at teardown; a server killed mid-run leaves
them, and a small `/dev/shm` (a container's 64 MB default) then fails the restart with "Error
while creating shared memory segment". Before a restart, segments no live process maps or holds
open are removed, and each removal (or failure to remove) is said.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("hang_watchdog.supervise")

NCCL_SHM_PREFIX = "nccl-"


def in_use(proc_root: Path) -> set[str]:
    """Paths under any /dev/shm that some process maps or has open (what we can read)."""
    used: set[str] = set()
    for pid_dir in proc_root.iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (pid_dir / "maps").read_text(errors="replace").splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if "/shm/" in path:
                    used.add(path.removesuffix(" (deleted)"))
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if "/shm/" in target:
                        used.add(target)
    return used


def report_leftovers(
    shm_dir: str | os.PathLike[str] = "/dev/shm", proc_root: str | os.PathLike[str] = "/proc"
) -> list[str]:
    """Remove our unused NCCL segments in `shm_dir`; the names removed (each one logged)."""
    shm = Path(shm_dir)
    try:
        mine = [
            p
            for p in shm.iterdir()
            if p.name.startswith(NCCL_SHM_PREFIX) and p.is_file() and p.stat().st_uid == os.getuid()
        ]
    except OSError:
        return []
    if not mine:
        return []
    used = in_use(Path(proc_root))
    removed: list[str] = []
    for path in mine:
        if str(path) in used or str(path.resolve()) in used:
            log.warning("NCCL segment %s is still in use by a live process; left alone", path)
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError as exc:
            log.warning("cannot remove the old server's NCCL segment %s: %s", path, exc)
            continue
        removed.append(path.name)
        log.warning(
            "removed the old server's NCCL segment %s (%d bytes) before restarting", path, size
        )
    return removed
