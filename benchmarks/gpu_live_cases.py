"""What benchmarks/gpu_live.py expects of each workload, and the table it prints (pure).

Kept apart from the processes so tests/test_gpu_live.py checks the same expectations against
recorded NVML answers on a machine without a GPU.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.core.model import GpuSample

# torch.cuda.synchronize, or the native frame under it (py-spy --native).
SYNC_FRAME = re.compile(r" in (\S+\.)?(synchronize|cudaDeviceSynchronize|cudaStreamSynchronize|"
                        r"cuCtxSynchronize|cuStreamSynchronize) \(")  # fmt: skip

Verdict = dict[str, Any]  # `hang-watchdog diagnose --json` output


def _evidence(v: Verdict, kind: str) -> list[str]:
    return [str(e.get("detail", "")) for e in v.get("evidence", ()) if e.get("kind") == kind]


def _is_hang(v: Verdict) -> bool:
    return v.get("signature") is not None and v.get("state") in ("hung", "dead")


def _spin(v: Verdict) -> tuple[bool, str]:
    if (v.get("state"), v.get("signature")) != ("hung", "gpu_kernel_spin"):
        return False, f"wanted hung/gpu_kernel_spin, got {v.get('state')}/{v.get('signature')}"
    if not any(SYNC_FRAME.search(d) for d in _evidence(v, "stack")):
        return False, "gpu_kernel_spin without the synchronize frame in its stack evidence"
    return True, "gpu_kernel_spin with the synchronize frame"


def _spin_named(v: Verdict) -> tuple[bool, str]:
    # At the shipped thresholds the verdict can come before the second stack dump
    # (suspect_after_s 8 + stack_second_after_s 5): the frame is reported, not required.
    if (v.get("state"), v.get("signature")) != ("hung", "gpu_kernel_spin"):
        return False, f"wanted hung/gpu_kernel_spin, got {v.get('state')}/{v.get('signature')}"
    frame = any(SYNC_FRAME.search(d) for d in _evidence(v, "stack"))
    return True, f"gpu_kernel_spin ({'with' if frame else 'before'} the synchronize frame)"


def _not_spin(v: Verdict, why: str = "DRAM was busy") -> tuple[bool, str]:
    if _evidence(v, "gpu_spin") or v.get("signature") == "gpu_kernel_spin":
        return False, f"judged a spin while {why}"
    if _is_hang(v):
        return False, f"a hang verdict: {v.get('signature')}"
    return True, f"not a spin ({v.get('state')})"


def _compute_bound(v: Verdict) -> tuple[bool, str]:
    # Zero-throughput stats lines with work running: a stall is allowed (nothing says progress),
    # a spin is not (the power near the limit and the tensor pipes say the GPU computes).
    return _not_spin(v, "the GPU computed near its power limit")


def _idle(v: Verdict) -> tuple[bool, str]:
    if v.get("state") != "idle" or _is_hang(v):
        return False, f"wanted idle, got {v.get('state')}/{v.get('signature')}"
    return True, "idle, not a hang"


def _collective(v: Verdict) -> tuple[bool, str]:
    if v.get("signature") != "collective_hang":
        return False, f"wanted collective_hang, got {v.get('state')}/{v.get('signature')}"
    return True, "collective_hang"


@dataclass(frozen=True)
class Case:
    """One workload and what the watchdog must conclude about it."""

    name: str
    expect: str
    check: Callable[[Verdict], tuple[bool, str]]
    optional: bool = False  # may be skipped with a reason (NCCL needs what the host allows)


CASES: tuple[Case, ...] = (
    Case("spin", "hung: gpu_kernel_spin + synchronize frame", _spin),
    Case("memcopy", "not a spin (DRAM busy)", _not_spin),
    Case("idle", "idle (not a hang)", _idle),
    Case("nccl", "collective_hang", _collective, optional=True),
    Case("l2matmul", "not a spin (compute-bound, L2-resident)", _compute_bound),
    Case("spinfull", "hung: gpu_kernel_spin + synchronize frame", _spin),
    Case("latency", "hung: gpu_kernel_spin after serving (shipped thresholds)", _spin_named),
)
# Cases judged at the shipped thresholds (the others at the kit's short TIMING): the time from
# the spin's onset to the verdict is the figure they exist for.
SHIPPED_THRESHOLDS = frozenset({"latency"})
BY_NAME = {c.name: c for c in CASES}


def judge(case: str, verdict: Verdict | None) -> tuple[bool, str]:
    """Whether the watchdog's verdict for `case` is the expected one, and why."""
    if verdict is None:
        return False, "no verdict"
    return BY_NAME[case].check(verdict)


def onset_to_verdict(onset_file: Path, judged_at: float) -> str:
    """How long after the spin's onset (the workload's own record) the verdict came."""
    try:
        onset = float(onset_file.read_text())
    except (OSError, ValueError):
        return "onset not recorded"
    return f"onset to verdict {judged_at - onset:.1f} s"


def exporter_ok(metrics_text: str, signature: str = "gpu_kernel_spin") -> tuple[bool, str]:
    """The `run` exporter shows the hang gauge for `signature` at 1, and the GPU figures."""
    hang = re.search(
        rf'^hang_watchdog_hang\{{[^}}]*signature="{signature}"[^}}]*\}} (\S+)$',
        metrics_text,
        re.MULTILINE,
    )
    has_sm = re.search(r"^hang_watchdog_gpu_sm_utilization_ratio\{", metrics_text, re.MULTILINE)
    if hang is None or float(hang.group(1)) != 1.0:
        return False, f"hang_watchdog_hang{{signature={signature!r}}} is not 1"
    if has_sm is None:
        return False, "no hang_watchdog_gpu_sm_utilization_ratio series"
    return True, f"hang_watchdog_hang{{signature={signature!r}}} 1"


# -- what NVML returned ------------------------------------------------------------------------


@dataclass
class Figures:
    """The probe's readings of the workload's GPU while a case ran."""

    samples: list[GpuSample] = field(default_factory=list)
    poll_ms: list[float] = field(default_factory=list)

    def summary(self, child_pid: int | None) -> dict[str, Any]:
        s = self.samples
        if not s:
            return {"method": "-", "child_in_process_list": None}
        last = s[-1]

        def med(attr: str) -> float | None:
            vals = [getattr(x, attr) for x in s if getattr(x, attr) is not None]
            return statistics.median(vals) if vals else None

        methods = [x.method for x in s]
        return {
            "gpu": last.index,
            "name": last.name,
            "method": max(set(methods), key=methods.count),
            "sm": med("sm"),
            "dram": med("dram"),
            "power_w": med("power_w"),
            "power_limit_w": last.power_limit_w,
            "sm_clock_mhz": med("sm_clock_mhz"),
            "sm_clock_max_mhz": last.sm_clock_max_mhz,
            "pids": list(last.pids),
            "child_in_process_list": child_pid in last.pids if child_pid else None,
            "poll_ms_median": statistics.median(self.poll_ms) if self.poll_ms else None,
            "poll_ms_max": max(self.poll_ms) if self.poll_ms else None,
            "polls": len(s),
        }


def pick_gpu(samples: Sequence[GpuSample], child_pid: int | None) -> int:
    """The GPU the workload runs on: the one listing its PID, else GPU 0."""
    for g in reversed(samples):
        if child_pid and child_pid in g.pids:
            return g.index
    return 0


# -- the table ---------------------------------------------------------------------------------

COLUMNS = (
    "case", "NVML method", "SM", "DRAM", "power W (limit)", "SM MHz (max)", "GPU pids",
    "poll ms (med/max)", "state", "signature", "expected", "ok",
)  # fmt: skip


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pair(fig: dict[str, Any], now: str, top: str) -> str:
    return f"{_num(fig.get(now), '{:.0f}')} ({_num(fig.get(top), '{:.0f}')})"


def row(case: str, fig: dict[str, Any], verdict: Verdict | None, ok: bool, why: str) -> list[str]:
    """One table row: what NVML returned, what the watchdog said, and whether it was expected."""
    v = verdict or {}
    pids = fig.get("pids")
    child = fig.get("child_in_process_list")
    pid_text = ",".join(map(str, pids)) if pids else "none"
    if child is not None:
        pid_text += " (child listed)" if child else " (child NOT listed)"
    return [
        case,
        str(fig.get("method", "-")),
        _num(fig.get("sm")),
        _num(fig.get("dram")),
        _pair(fig, "power_w", "power_limit_w"),
        _pair(fig, "sm_clock_mhz", "sm_clock_max_mhz"),
        pid_text,
        f"{_num(fig.get('poll_ms_median'), '{:.1f}')}/{_num(fig.get('poll_ms_max'), '{:.1f}')}",
        str(v.get("state", "-")),
        str(v.get("signature") or "-"),
        BY_NAME[case].expect if case in BY_NAME else case,
        ("yes" if ok else "NO") + f": {why}",
    ]


def table(rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: readable in a terminal and pasted as-is into docs/gpu-live.md."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(lines)
