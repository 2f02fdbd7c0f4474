"""What py-spy says and whether it can run: its output as model types, its errors with fixes.

Kept apart from the capture machinery in `capture.py` so these small pieces are cheap to test.
JSON format (py-spy 0.4 `dump --json`): a list of thread objects with keys `pid`, `thread_id`,
`thread_name`, `os_thread_id`, `active`, `owns_gil`, `frames`; frames innermost first, each with
`name`, `filename`, `module`, `short_filename`, `line`, `locals`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from watchdog.core.model import Frame, ThreadStack

CAP_SYS_PTRACE = 19  # bit in /proc/PID/status CapEff (linux/capability.h)

FIX_INSTALL = "install py-spy (pip install py-spy) in the watchdog's environment"
FIX_PERMISSION = (
    "run as root or add CAP_SYS_PTRACE (Docker: --cap-add SYS_PTRACE; Kubernetes: "
    "securityContext.capabilities.add [SYS_PTRACE]); in Kubernetes the sidecar needs "
    "shareProcessNamespace: true; with kernel.yama.ptrace_scope=1 a non-root watchdog can only "
    "dump its own children (sysctl kernel.yama.ptrace_scope=0, or add CAP_SYS_PTRACE)"
)
FIX_TIMEOUT = (
    "py-spy did not finish before its deadline and was killed (sglang #17941 hung forever "
    "inside py-spy); raise stack_deadline_s, or try `py-spy dump --pid PID` by hand"
)


class DumpParseError(ValueError):
    """py-spy printed something that is not its JSON thread list."""


@dataclass(frozen=True)
class PyspyFailure:
    """What a failed py-spy run means: a result kind, a one-line error, and the fix."""

    kind: str  # permission_denied | not_found | not_python | gone | native | error
    error: str
    fix: str | None


MAX_FRAMES = 4096  # per thread; deeper is a runaway recursion, and the top frames say it


def parse_dump_json(text: str) -> tuple[list[dict[str, Any]], tuple[ThreadStack, ...]]:
    """Parse `py-spy dump --json` output into the raw list and the model's ThreadStacks;
    DumpParseError (and nothing else) for output of any other shape."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpParseError(f"py-spy printed invalid JSON ({e})") from e
    except RecursionError as e:  # `[[[[...` nested past the parser's depth limit
        raise DumpParseError("py-spy printed JSON nested too deeply") from e
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise DumpParseError("py-spy JSON is not a list of thread objects")
    threads = []
    for i, raw in enumerate(data):
        try:
            threads.append(_thread(raw))
        except (TypeError, ValueError, OverflowError, AttributeError) as e:
            raise DumpParseError(f"py-spy JSON thread {i} has a malformed field ({e})") from e
    return data, tuple(threads)


def _thread(raw: dict[str, Any]) -> ThreadStack:
    frames_raw = raw.get("frames") or ()
    if not isinstance(frames_raw, list):
        raise TypeError(f'"frames" is {type(frames_raw).__name__}, not a list')
    frames = tuple(
        Frame(
            name=_text(f.get("name")),
            filename=_text(f.get("filename")),
            line=_int(f.get("line")),
            module=_text(f.get("module")),
        )
        for f in frames_raw[:MAX_FRAMES]
        if isinstance(f, dict)
    )
    tid = raw.get("os_thread_id") or raw.get("thread_id") or 0
    return ThreadStack(
        thread_id=_int(tid),
        name=_text(raw.get("thread_name")),
        frames=frames,
        active=bool(raw.get("active")),
    )


def _text(value: Any) -> str:
    """A string field; anything else (a nested object a hostile dump put there) is refused."""
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)[:1024]
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _int(value: Any) -> int:
    """An integer field (line number, thread id) within 64 bits."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if isinstance(value, str) and (len(value) > 20 or not value.lstrip("-").isdigit()):
        raise ValueError(f"expected an integer, got {value[:40]!r}")
    number = int(value)
    if not -(1 << 63) <= number < 1 << 64:
        raise OverflowError("integer beyond 64 bits")
    return number


def mark_unchanged(
    first: Sequence[ThreadStack], second: Sequence[ThreadStack]
) -> tuple[ThreadStack, ...]:
    """Mark each thread of `first` whose frames are identical in `second` (same thread id),
    and how many of its outermost frames (same function and file) both dumps share: a thread
    that retries a download (FlashInfer: 10 s attempts, 5/10/20 s sleeps between them) moves
    inside `download_file` but never leaves it."""
    later = {t.thread_id: t.frames for t in second}
    return tuple(
        replace(
            t,
            unchanged=bool(t.frames) and later.get(t.thread_id) == t.frames,
            held=common_outer(t.frames, later.get(t.thread_id, ())),
        )
        for t in first
    )


def common_outer(a: Sequence[Frame], b: Sequence[Frame]) -> int:
    """How many outermost frames (same function and file) `a` and `b` share."""
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if (x.name, x.filename) != (y.name, y.filename):
            break
        n += 1
    return n


def classify_failure(returncode: int, stderr: str, *, native: bool) -> PyspyFailure:
    """Map a non-zero py-spy exit and its stderr to a failure kind with a fix."""
    first = _first_line(stderr) or f"py-spy exited with status {returncode}"
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return PyspyFailure("permission_denied", f"permission denied: {first}", FIX_PERMISSION)
    if "failed to find python version" in low:
        return PyspyFailure(
            "not_python", f"not a Python process (py-spy exit {returncode}: {first})", None
        )
    if "no such file or directory" in low or "no such process" in low:
        return PyspyFailure("gone", f"process exited before it could be dumped: {first}", None)
    if native:
        # Native unwinding fails on some builds and targets; the caller retries without --native.
        return PyspyFailure("native", f"native unwinding failed: {first}", None)
    return PyspyFailure("error", f"py-spy failed: {first}", "run `py-spy dump --pid PID` by hand")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Stack backtrace", "Caused by")):
            return line[:300]
    return ""


def resolve_pyspy(pyspy: str | None) -> str | None:
    """The py-spy to run: an explicit path or name, else beside our Python, else on PATH."""
    if pyspy:
        if os.sep in pyspy:
            return pyspy if os.access(pyspy, os.X_OK) and os.path.isfile(pyspy) else None
        return shutil.which(pyspy)
    # pip installs py-spy beside the interpreter; a systemd unit may not have that dir on PATH.
    sibling = Path(sys.executable).parent / "py-spy"
    if os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("py-spy")


def is_python_process(pid: int, proc_root: str = "/proc") -> bool:
    """True unless /proc says the executable is not a Python interpreter (nvcc, ninja, ...)."""
    try:
        exe = os.path.basename(os.readlink(f"{proc_root}/{pid}/exe"))
    except OSError:
        return True  # unreadable (another user, namespace): let py-spy decide
    return exe.startswith(("python", "pypy"))


def preflight_pyspy(
    pyspy: str | None, pid: int | None, *, proc_root: str = "/proc"
) -> tuple[bool, str]:
    """Say up front whether py-spy can dump `pid` from here, and the fix when it cannot."""
    exe = resolve_pyspy(pyspy)
    if exe is None:
        return False, f"py-spy not found ({pyspy or 'beside Python or on PATH'}): {FIX_INSTALL}"
    cap = _has_cap_ptrace(proc_root)
    scope = _read_int(f"{proc_root}/sys/kernel/yama/ptrace_scope")
    if scope == 3:
        return (
            False,
            "kernel.yama.ptrace_scope=3 forbids all ptrace until reboot; py-spy cannot run",
        )
    if scope == 2 and not cap:
        return False, f"kernel.yama.ptrace_scope=2 needs CAP_SYS_PTRACE: {FIX_PERMISSION}"
    if pid is None:
        return True, f"py-spy at {exe}; CAP_SYS_PTRACE {'present' if cap else 'absent'}"
    uids = _status_field(f"{proc_root}/{pid}/status", "Uid")
    if uids is None:
        return False, (
            f"pid {pid} is not visible from the watchdog (another PID namespace?); in "
            "Kubernetes set shareProcessNamespace: true, with Docker use --pid=container:NAME"
        )
    if not cap:
        if any(int(u) != os.geteuid() for u in uids.split()):
            return False, f"pid {pid} belongs to another user and CAP_SYS_PTRACE is absent: " + (
                FIX_PERMISSION
            )
        if scope == 1 and not _is_descendant(pid, proc_root):
            return False, (
                f"kernel.yama.ptrace_scope=1 and pid {pid} is not the watchdog's child: "
                + FIX_PERMISSION
            )
    return True, f"py-spy at {exe} can attach to pid {pid}"


def _has_cap_ptrace(proc_root: str) -> bool:
    eff = _status_field(f"{proc_root}/self/status", "CapEff")
    try:
        return eff is not None and bool(int(eff, 16) >> CAP_SYS_PTRACE & 1)
    except ValueError:
        return False


def _status_field(path: str, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == key:
                    return value.strip()
    except OSError:
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama LSM: only uid and capability checks apply


def _is_descendant(pid: int, proc_root: str) -> bool:
    me = str(os.getpid())
    cur: str | None = str(pid)
    for _ in range(64):
        cur = _status_field(f"{proc_root}/{cur}/status", "PPid")
        if cur is None or cur in ("0", "1"):
            return False
        if cur == me:
            return True
    return False
