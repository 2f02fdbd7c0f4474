"""NVLink fabric and NVLS: each GPU's NVML fabric state, and the Fabric Manager service.

NCCL's NVLS multicast bind fails with CUDA error 401 when the fabric is not ready ("This is
usually caused by a system or configuration error in the Fabric Manager or NVSwitches";
pytorch/pytorch PR #177472), which kills the server after the weights are loaded.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned

# NVML_GPU_FABRIC_STATE_* and NVML_GPU_FABRIC_HEALTH_SUMMARY_* (nvidia-ml-py 13.615.71, pynvml.py).
_STATE = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
_HEALTH = {0: "NOT_SUPPORTED", 1: "HEALTHY", 2: "UNHEALTHY", 3: "LIMITED_CAPACITY"}
_DEGRADED_BW_MASK = 0x3  # NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW, shift 0, width 2
_FABRIC_FIXES = (
    "start NCCL without NVLS for now: NCCL_NVLS_ENABLE=0 (and VLLM_ALLREDUCE_USE_SYMM_MEM=0)",
    "when the GPUs are idle: systemctl restart nvidia-fabricmanager, reset the GPUs "
    "(nvidia-smi -r) or reboot, then check `nvidia-smi -q | grep -A3 Fabric`",
)
SERVICE = "nvidia-fabricmanager"


def check_fabric(inv: GpuInventory) -> CheckResult:
    """Fabric state COMPLETED, status success and health not degraded on every fabric GPU."""
    if inv.gpus is None:
        return skipped("fabric", "GPUs unknown")
    problems, warnings, fabric_gpus = [], [], 0
    for gpu in inv.gpus:
        info = gpu.fabric
        if gpu.fabric_error:
            warnings.append(f"GPU {gpu.index}: fabric info unreadable ({gpu.fabric_error})")
        if info is None or info.state == 0:
            continue
        fabric_gpus += 1
        if info.state != 3:
            problems.append(f"GPU {gpu.index}: fabric state {_STATE.get(info.state, info.state)}")
        elif info.status not in (None, 0):
            problems.append(f"GPU {gpu.index}: fabric registration failed (status {info.status})")
        elif info.health_summary == 2:
            problems.append(f"GPU {gpu.index}: fabric health UNHEALTHY")
        elif info.health_summary == 3 or (info.health_mask or 0) & _DEGRADED_BW_MASK:
            warnings.append(f"GPU {gpu.index}: fabric health degraded (limited capacity/bandwidth)")
    if problems:
        return failed("fabric", "; ".join(problems + warnings), _FABRIC_FIXES)
    if warnings:
        return warned("fabric", "; ".join(warnings), _FABRIC_FIXES)
    if not fabric_gpus:
        return skipped("fabric", "no GPU reports an NVLink fabric (NVSwitch/NVLS not present)")
    return passed("fabric", f"fabric COMPLETED and healthy on {fabric_gpus} GPU(s)")


def has_fabric(inv: GpuInventory) -> bool:
    """True when any GPU reports a supported fabric state."""
    return any(g.fabric is not None and g.fabric.state != 0 for g in inv.gpus or ())


def check_fabric_manager(
    inv: GpuInventory,
    environ: Mapping[str, str],
    systemd_root: Path,
    timeout_s: float,
) -> CheckResult:
    """`nvidia-fabricmanager` active, on fabric systems where systemd runs."""
    if not has_fabric(inv):
        return skipped("fabric_manager", "no NVLink fabric reported")
    systemctl = shutil.which("systemctl", path=environ.get("PATH", ""))
    if not systemd_root.is_dir() or systemctl is None:
        return skipped("fabric_manager", "systemd is not running here (container?)")
    try:
        proc = subprocess.run(
            [systemctl, "show", "--property=LoadState,ActiveState", SERVICE],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return warned("fabric_manager", f"systemctl failed: {e}", ["systemctl status " + SERVICE])
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    load, active = props.get("LoadState", "?"), props.get("ActiveState", "?")
    if load == "not-found":
        # UNVERIFIED: on NVL72-class racks Fabric Manager may run on the switch trays instead.
        return warned(
            "fabric_manager",
            f"{SERVICE}.service is not installed on this host",
            [f"install and enable {SERVICE} matching the driver, or confirm it runs elsewhere"],
        )
    if active != "active":
        return failed(
            "fabric_manager",
            f"{SERVICE}.service is {active} (LoadState {load})",
            [f"systemctl enable --now {SERVICE}; journalctl -u {SERVICE}", *_FABRIC_FIXES],
        )
    return passed("fabric_manager", f"{SERVICE}.service is active")
