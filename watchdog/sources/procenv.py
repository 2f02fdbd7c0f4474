"""Small /proc readers (environment, command line, namespaced PIDs) with a replaceable root.

A process that vanished or belongs to another user reads as empty, never as an exception:
the callers run every tick and must not fail because a process exited between two reads.
"""

from __future__ import annotations

from pathlib import Path


def _read_bytes(pid: int, name: str, proc_root: str) -> bytes:
    try:
        return (Path(proc_root) / str(pid) / name).read_bytes()
    except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
        return b""


def _split_nul(raw: bytes) -> list[str]:
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """The process's initial environment (NUL-separated `KEY=VALUE`); {} when unreadable."""
    env: dict[str, str] = {}
    for item in _split_nul(_read_bytes(pid, "environ", proc_root)):
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    return env


def read_children(pid: int, proc_root: str = "/proc", limit: int = 64) -> list[int]:
    """The process's descendants, breadth first, from /proc/PID/task/TID/children (at most
    `limit`); [] when the kernel has no children files or the process is gone."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < limit:
        parent = todo.pop(0)
        try:
            tasks = list((Path(proc_root) / str(parent) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out[:limit]


def read_server_environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """The server's environment: the fullest of its own and its descendants'.

    setproctitle (vLLM titles its processes `VLLM::EngineCore`, `VLLM::APIServer`) writes a long
    title over the argv area and the environment block after it, so /proc/PID/environ of a
    titled process reads as fragments. Children inherit the environment, and the ones that are
    never titled (multiprocessing's resource tracker) keep it whole.
    """
    best = read_environ(pid, proc_root)
    for child in read_children(pid, proc_root):
        env = read_environ(child, proc_root)
        if len(env) > len(best):
            best = env
    return best


def read_cmdline(pid: int, proc_root: str = "/proc") -> list[str]:
    """The process's argv (after any setproctitle rewrite); [] when unreadable or a zombie."""
    return _split_nul(_read_bytes(pid, "cmdline", proc_root))


def tracer_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """The `TracerPid:` of /proc/PID/status: who ptrace-attached to it (0: nobody); None when
    unreadable. py-spy pauses its target with ptrace, so a second py-spy (another watchdog, a
    person's, a debugger) attached at that moment makes ours fail with EPERM, not a missing
    capability."""
    text = _read_bytes(pid, "status", proc_root).decode("utf-8", "replace")
    for line in text.splitlines():
        if line.startswith("TracerPid:"):
            value = line.split()[1:2]
            return int(value[0]) if value and value[0].isdigit() else None
    return None


def ns_pid(pid: int, proc_root: str = "/proc") -> list[int]:
    """The `NSpid:` line of /proc/PID/status: the PID in each nested PID namespace.

    The first entry is the PID as seen from the namespace that mounted `proc_root`, the last
    the PID inside the innermost namespace (the container). NVML reports host PIDs (NVIDIA/
    nvidia-docker #1483), so a watchdog reading the host's /proc maps them to container PIDs
    with this. [] when unreadable or the kernel has no NSpid line (before Linux 4.1).
    """
    text = _read_bytes(pid, "status", proc_root).decode("utf-8", "replace")
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(v) for v in line.split()[1:]]
            except ValueError:
                return []
    return []
