"""Linux process details for the simulated tree: the kernel thread name and parent-death signal."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl(option: int, arg: int | bytes) -> None:
    """Call prctl(2) through libc; silently a no-op where libc cannot be loaded."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return
    libc.prctl(option, arg, 0, 0, 0)


def set_title(title: str) -> None:
    """Set /proc/self/comm like setproctitle does (truncated to 15 bytes by the kernel).

    vLLM sets `VLLM::EngineCore` with setproctitle (vllm/utils/system_utils.py
    set_process_title); the simulator cannot
    rewrite its argv, so the title is also an argv element (`--role VLLM::EngineCore`).
    """
    _prctl(PR_SET_NAME, title.encode()[:15])


def die_with_parent() -> None:
    """Get SIGTERM when the parent dies, so a killed API server never leaves an orphan engine."""
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
