"""What the watchdog itself needs once the server runs: py-spy, ptrace, disk space, /dev/shm.

These do not doom the server, so they WARN (FAIL only where the server itself would break, e.g.
no room for FlashInfer's cubins when it must download them). Pre-flight usually runs as the
server's user (systemd `ExecStartPre=`) or in an initContainer, not as the watchdog, so what it
says about ptrace is about the host (Yama), never a promise about the watchdog's capabilities.
Every filesystem probe runs under a hard deadline: `stat` on a hung NFS mount never returns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned
from watchdog.sources.deadline import DeadlineExceeded, call_with_deadline
from watchdog.sources.stacks.parse import resolve_pyspy

GIB = 1024**3
MIB = 1024**2
CAP_SYS_PTRACE = 19
INCIDENT_MIN_FREE = 512 * MIB
# flashinfer-cubin 0.6.16 holds 23008 cubins, 4426 MiB (flashinfer #4337 collect-env output).
CACHE_WARN_FREE = 5 * GIB
CACHE_FAIL_FREE = 1 * GIB
# Docker's default /dev/shm is 64 MiB; NCCL and vLLM's shm broadcast need more with >1 GPU.
# The 1 GiB line is a heuristic (UNVERIFIED as a hard minimum).
SHM_MIN = 1 * GIB
# What the watchdog needs where Yama restricts ptrace; pre-flight cannot see the watchdog's own
# capabilities, so these are stated, not checked.
_WATCHDOG_PTRACE = (
    "the watchdog attaches with CAP_SYS_PTRACE, which hang-watchdog.service and the Kubernetes "
    "sidecar grant, or as the server's parent under `hang-watchdog run --`"
)
_PTRACE_FIXES = (
    "Yama ptrace_scope=3 cannot be lowered until reboot: set kernel.yama.ptrace_scope=1 in "
    "/etc/sysctl.d/ and reboot; until then verdicts carry no stack dumps",
)

DiskUsage = Callable[[Path], Any]  # shutil.disk_usage's shape: .total, .free


def check_pyspy(
    timeout_s: float,
    pyspy: str | None = None,
    resolve: Callable[[str | None], str | None] = resolve_pyspy,
) -> CheckResult:
    """The py-spy the watchdog would run is present and runs: stacks are its best evidence.

    Same lookup as the watchdog (`resolve_pyspy`): the configured `pyspy`, else beside this
    Python (a venv in /opt whose bin/ is not on PATH), else PATH.
    """
    found = resolve(pyspy)
    fix = ["pip install py-spy (into the watchdog's environment)"]
    if not found:
        where = pyspy or "beside the watchdog's Python or on PATH"
        return warned("py_spy", f"py-spy not found ({where}): verdicts will lack stacks", fix)
    try:
        proc = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return warned("py_spy", f"{found} does not run: {e}", fix)
    if proc.returncode != 0:
        return warned("py_spy", f"{found} --version exited {proc.returncode}", fix)
    return passed("py_spy", f"{proc.stdout.strip() or 'py-spy'} at {found}", path=found)


def _status_field(proc_root: Path, key: str) -> str | None:
    try:
        for line in (proc_root / "self" / "status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split()[1]
    except (OSError, IndexError):
        return None
    return None


def _this_process(proc_root: Path) -> str:
    """How this pre-flight process stands, worded so nobody reads it as the watchdog's."""
    uid, capeff = _status_field(proc_root, "Uid"), _status_field(proc_root, "CapEff")
    try:
        has_cap: bool | None = bool(int(capeff, 16) >> CAP_SYS_PTRACE & 1) if capeff else None
    except ValueError:
        has_cap = None
    who = f"uid {uid}" if uid is not None else "uid unknown"
    cap = {True: "has", False: "lacks", None: "may or may not have"}[has_cap]
    return f"this pre-flight process ({who}, not the watchdog) {cap} CAP_SYS_PTRACE"


def check_ptrace(proc_root: Path) -> CheckResult:
    """The host's Yama ptrace_scope: whether anything (the watchdog included) may attach."""
    try:
        scope = int((proc_root / "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None
    here = _this_process(proc_root)
    if scope == 3:
        reason = "kernel.yama.ptrace_scope=3: no process may attach, not even the watchdog"
        return warned("ptrace", f"{reason}; {here}", _PTRACE_FIXES, ptrace_scope=3)
    rule = {
        None: "no Yama: same-user processes may attach",
        0: "kernel.yama.ptrace_scope=0: same-user processes may attach",
        1: "kernel.yama.ptrace_scope=1: only descendants, or with CAP_SYS_PTRACE",
        2: "kernel.yama.ptrace_scope=2: only with CAP_SYS_PTRACE",
    }.get(scope, f"kernel.yama.ptrace_scope={scope}")
    return passed("ptrace", f"{rule}; {_WATCHDOG_PTRACE}; {here}", ptrace_scope=scope)


def _unusable_dir(path: Path) -> str | None:
    """Why `path` cannot hold incident bundles (a file, or not writable), or None."""
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    if not os.access(where, os.W_OK | os.X_OK):
        return f"{where} is not writable by this user"
    return None


def _free(path: Path, timeout_s: float, usage: DiskUsage) -> tuple[Path, int] | str:
    """Free bytes at `path` or its nearest existing parent, or why not (error or deadline)."""

    def probe() -> tuple[Path, int]:
        where = path
        while not where.exists() and where != where.parent:
            where = where.parent
        return where, usage(where).free

    try:
        return call_with_deadline(probe, timeout_s, name="preflight-statvfs")
    except DeadlineExceeded:
        return f"stat of {path} did not return within {timeout_s:g} s (hung network mount?)"
    except OSError as e:
        return f"cannot stat {path}: {e}"


def check_incident_space(
    incident_dir: Path | None, timeout_s: float = 3.0, usage: DiskUsage = shutil.disk_usage
) -> CheckResult:
    """Room for incident bundles (stack dumps, timeline, log tail)."""
    if incident_dir is None:
        return skipped("incident_space", "no --incident-dir given")
    try:  # the same test `run` makes at start (daemon/wiring.py _incident_root)
        problem = call_with_deadline(
            lambda: _unusable_dir(incident_dir), timeout_s, name="preflight-incident-dir"
        )
    except DeadlineExceeded:
        problem = None  # _free below reports the hung mount
    if problem:
        fix = "give a writable directory with --incident-dir (it is created if missing)"
        return failed("incident_space", f"{problem}; `hang-watchdog run` refuses it", [fix])
    got = _free(incident_dir, timeout_s, usage)
    if isinstance(got, str):
        return warned("incident_space", got, ["create it on a local, responsive disk"])
    where, free = got
    text = f"{free / GIB:.1f} GiB free at {where}"
    if free < INCIDENT_MIN_FREE:
        return warned("incident_space", text, [f"free space or move --incident-dir off {where}"])
    return passed("incident_space", text)


def flashinfer_cache_dir(environ: Mapping[str, str]) -> Path:
    """$FLASHINFER_WORKSPACE_BASE (or $HOME)/.cache/flashinfer (flashinfer jit/env.py)."""
    base = environ.get("FLASHINFER_WORKSPACE_BASE") or environ.get("HOME") or "/root"
    return Path(base) / ".cache" / "flashinfer"


def check_cache_space(
    environ: Mapping[str, str],
    downloads: bool | None,
    timeout_s: float = 3.0,
    usage: DiskUsage = shutil.disk_usage,
) -> CheckResult:
    """Room in FlashInfer's cache for downloaded cubins and JIT builds."""
    cache = flashinfer_cache_dir(environ)
    got = _free(cache, timeout_s, usage)
    if isinstance(got, str):
        return warned("cache_space", got, ["set FLASHINFER_WORKSPACE_BASE to a local disk"])
    where, free = got
    text = f"{free / GIB:.1f} GiB free for {cache} (at {where})"
    fixes = [f"free space at {where} or set FLASHINFER_WORKSPACE_BASE to a larger disk"]
    if downloads and free < CACHE_FAIL_FREE:
        return failed("cache_space", text + "; cubin downloads will not fit", fixes)
    if free < CACHE_WARN_FREE:
        return warned("cache_space", text, fixes)
    return passed("cache_space", text)


def check_shm(
    inv: GpuInventory,
    shm: Path,
    timeout_s: float = 3.0,
    usage: DiskUsage = shutil.disk_usage,
) -> CheckResult:
    """/dev/shm big enough for multi-GPU NCCL and vLLM's shared-memory broadcast."""
    if inv.gpus is None or len(inv.gpus) < 2:
        return skipped("shm", "single GPU or GPUs unknown")
    try:
        total = call_with_deadline(lambda: usage(shm).total, timeout_s, name="preflight-shm")
    except DeadlineExceeded:
        reason = f"stat of {shm} did not return within {timeout_s:g} s"
        return warned("shm", reason, ["mount a tmpfs at /dev/shm"])
    except OSError as e:
        return warned("shm", f"cannot stat {shm}: {e}", ["mount a tmpfs at /dev/shm"])
    text = f"{shm} is {total / MIB:.0f} MiB for {len(inv.gpus)} GPUs"
    if total < SHM_MIN:
        return warned(
            "shm",
            text,
            [
                "docker: --shm-size=16g (or --ipc=host)",
                "Kubernetes: mount an emptyDir {medium: Memory} at /dev/shm",
            ],
        )
    return passed("shm", text)
