"""What the watchdog itself needs once the server runs: py-spy, ptrace, disk space, /dev/shm.

These do not doom the server, so they WARN (FAIL only where the server itself would break, e.g.
no room for FlashInfer's cubins when it must download them).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned

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
_PTRACE_FIXES = (
    "run the watchdog as root or with CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE; Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE] and shareProcessNamespace: true)",
    "or relax Yama: sysctl kernel.yama.ptrace_scope=0",
)


def check_pyspy(environ: Mapping[str, str], timeout_s: float) -> CheckResult:
    """py-spy on PATH and runnable: stack dumps are the watchdog's best evidence."""
    found = shutil.which("py-spy", path=environ.get("PATH", ""))
    fix = ["pip install py-spy (into the watchdog's environment)"]
    if not found:
        return warned("py_spy", "py-spy not on PATH: verdicts will lack stack evidence", fix)
    try:
        proc = subprocess.run(
            [found, "--version"],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return warned("py_spy", f"{found} does not run: {e}", fix)
    if proc.returncode != 0:
        return warned("py_spy", f"{found} --version exited {proc.returncode}", fix)
    return passed("py_spy", f"{proc.stdout.strip() or 'py-spy'} at {found}", path=found)


def _cap_eff(proc_root: Path) -> int | None:
    try:
        for line in (proc_root / "self" / "status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_ptrace(proc_root: Path) -> CheckResult:
    """Whether py-spy may attach to the server (Yama ptrace_scope and CAP_SYS_PTRACE)."""
    caps = _cap_eff(proc_root)
    has_cap = caps is not None and bool(caps >> CAP_SYS_PTRACE & 1)
    try:
        scope = int((proc_root / "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None
    cap_txt = "with CAP_SYS_PTRACE" if has_cap else "without CAP_SYS_PTRACE"
    if scope == 3:
        return warned("ptrace", "kernel.yama.ptrace_scope=3: nobody may attach", _PTRACE_FIXES[1:])
    if scope in (1, 2) and not has_cap:
        return warned(
            "ptrace",
            f"kernel.yama.ptrace_scope={scope} and {cap_txt}: py-spy cannot attach",
            _PTRACE_FIXES,
        )
    if scope is None and not has_cap:
        return passed("ptrace", f"no Yama; {cap_txt}: attach works for processes of the same user")
    return passed("ptrace", f"ptrace_scope={scope if scope is not None else 'n/a'}, {cap_txt}")


def _free(path: Path) -> tuple[Path, int] | None:
    """Free bytes on the filesystem of `path`, or of its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return probe, shutil.disk_usage(probe).free
    except OSError:
        return None


def check_incident_space(incident_dir: Path | None) -> CheckResult:
    """Room for incident bundles (stack dumps, timeline, log tail)."""
    if incident_dir is None:
        return skipped("incident_space", "no --incident-dir given")
    got = _free(incident_dir)
    if got is None:
        return warned("incident_space", f"cannot stat {incident_dir}", ["create it"])
    where, free = got
    text = f"{free / GIB:.1f} GiB free at {where}"
    if free < INCIDENT_MIN_FREE:
        return warned("incident_space", text, [f"free space or move --incident-dir off {where}"])
    return passed("incident_space", text)


def flashinfer_cache_dir(environ: Mapping[str, str]) -> Path:
    """$FLASHINFER_WORKSPACE_BASE (or $HOME)/.cache/flashinfer (flashinfer jit/env.py)."""
    base = environ.get("FLASHINFER_WORKSPACE_BASE") or environ.get("HOME") or "/root"
    return Path(base) / ".cache" / "flashinfer"


def check_cache_space(environ: Mapping[str, str], downloads: bool | None) -> CheckResult:
    """Room in FlashInfer's cache for downloaded cubins and JIT builds."""
    cache = flashinfer_cache_dir(environ)
    got = _free(cache)
    if got is None:
        return warned("cache_space", f"cannot stat {cache}", ["set FLASHINFER_WORKSPACE_BASE"])
    where, free = got
    text = f"{free / GIB:.1f} GiB free for {cache} (at {where})"
    fixes = [f"free space at {where} or set FLASHINFER_WORKSPACE_BASE to a larger disk"]
    if downloads and free < CACHE_FAIL_FREE:
        return failed("cache_space", text + "; cubin downloads will not fit", fixes)
    if free < CACHE_WARN_FREE:
        return warned("cache_space", text, fixes)
    return passed("cache_space", text)


def check_shm(inv: GpuInventory, shm: Path) -> CheckResult:
    """/dev/shm big enough for multi-GPU NCCL and vLLM's shared-memory broadcast."""
    if inv.gpus is None or len(inv.gpus) < 2:
        return skipped("shm", "single GPU or GPUs unknown")
    try:
        total = shutil.disk_usage(shm).total
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
