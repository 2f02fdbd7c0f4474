"""Is a busy GPU spinning or working? Judged from DRAM traffic, or without it from power (pure).

A kernel that never returns keeps "utilisation" near 100 % (the counter means "a kernel is
resident", not "work is progressing"). Where DRAM bandwidth is measured (GPM, DCGM profiling,
utilisation rates' memory figure), no traffic tells the spin apart. Where it is not (GB10 /
DGX Spark, GeForce before Blackwell: dcgm-exporter #294, NVIDIA/DCGM #234), power does: a
deadlocked GB10 sat at 13-27 W while reading ~96 % busy against ~45 W when healthy (vllm
#46097, eugr/spark-vllm-docker #260). The SM clock guards that reading: a GPU clocked down
draws little because of its clock, which says nothing about a spin.

Power also vetoes a spin whatever DRAM says: a compute-bound kernel whose operands stay in L2
reads SM ~0.85-0.96 and DRAM ~0.03 (a spin's shape) while drawing 0.9-0.99 of its limit; the
spins measured on an H200 drew 0.19-0.23 of it (136-164 W of 700 W). A kernel issuing
tensor-core instructions (0.72-0.93 in those matmuls) is computing too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.core.model import GpuSample, Observation
from watchdog.core.thresholds import Thresholds


def ratio(value: float | None, of: float | None) -> float | None:
    """value / of, or None when either is unknown or `of` is not positive."""
    if value is None or of is None or of <= 0:
        return None
    return value / of


def spin_by(s: GpuSample, th: Thresholds) -> str | None:
    """'dram' or 'power' when this one sample looks like a spin, None when not or unjudgeable."""
    if s.sm is None or s.sm < th.gpu_spin_sm or s.procs == 0:
        return None  # idle, or the "100 % with no processes" latch
    if computing(s, th):
        return None
    if s.dram is not None:
        return "dram" if s.dram <= th.gpu_spin_dram else None
    power = ratio(s.power_w, s.power_limit_w)
    if power is None or power > th.gpu_spin_power_ratio:
        return None
    clock = ratio(s.sm_clock_mhz, s.sm_clock_max_mhz)
    if clock is not None and clock < th.gpu_spin_clock_ratio:
        return None
    return "power"


def computing(s: GpuSample, th: Thresholds) -> bool:
    """Power near the limit, or tensor cores busy: work, never a spin (when those are known)."""
    power = ratio(s.power_w, s.power_limit_w)
    if power is not None and power > th.gpu_spin_power_max_ratio:
        return True
    return s.tensor is not None and s.tensor > th.gpu_spin_tensor


@dataclass(frozen=True)
class HostCpu:
    """CPU the server used over an interval: the busiest process and the whole tree (cores)."""

    pid: int
    busiest: float
    tree: float
    seconds: float


def host_cpu(first: Observation, last: Observation) -> HostCpu | None:
    """The server's CPU rate between two observations, from each process's CPU time."""
    if first.procs is None or last.procs is None or last.t <= first.t:
        return None
    before = {p.pid: p.cpu_s for p in first.procs.procs if p.cpu_s is not None}
    rates = {
        p.pid: max(0.0, p.cpu_s - before[p.pid]) / (last.t - first.t)
        for p in last.procs.procs
        if p.cpu_s is not None and p.pid in before
    }
    if not rates:
        return None
    pid = max(rates, key=lambda k: rates[k])
    return HostCpu(pid, rates[pid], sum(rates.values()), last.t - first.t)


def describe(g: GpuSample, seconds: float, by: str, th: Thresholds, cpu: HostCpu | None) -> str:
    """The evidence line: the figures, and which signals judged the spin."""
    procs = "" if g.procs is None else f", {g.procs} compute process(es)"
    if by == "dram" and g.dram is not None:
        return (
            f"GPU {g.index} ({g.name or 'unknown'}) SM {g.sm:.2f}, DRAM {g.dram:.2f}, "
            f"{_power_bound(g, th)}{_tensor(g, th)} for {seconds:.0f} s{procs} "
            f"(source: {g.method or 'unknown'})"
        )
    return (
        f"GPU {g.index} ({g.name or 'unknown'}) SM {g.sm:.2f} for {seconds:.0f} s with no DRAM "
        f"figures; judged by {', '.join(_power_signals(g, th, cpu))}{procs} "
        f"(source: {g.method or 'unknown'})"
    )


def _power_bound(g: GpuSample, th: Thresholds) -> str:
    """The power the DRAM-judged spin was checked against, or that it was not known."""
    power = ratio(g.power_w, g.power_limit_w)
    if power is None:
        return "power unknown (no compute-bound check)"
    return (
        f"power {g.power_w:.0f} W of its {g.power_limit_w:.0f} W limit "
        f"({power:.2f} <= {th.gpu_spin_power_max_ratio:.2f}: not compute-bound)"
    )


def _tensor(g: GpuSample, th: Thresholds) -> str:
    return "" if g.tensor is None else f", tensor {g.tensor:.2f} <= {th.gpu_spin_tensor:.2f}"


def _power_signals(g: GpuSample, th: Thresholds, cpu: HostCpu | None) -> Sequence[str]:
    power = ratio(g.power_w, g.power_limit_w) or 0.0
    out = [
        f"power {g.power_w:.0f} W of its {g.power_limit_w:.0f} W limit "
        f"({power:.2f} <= {th.gpu_spin_power_ratio:.2f}){_tensor(g, th)}"
    ]
    clock = ratio(g.sm_clock_mhz, g.sm_clock_max_mhz)
    if clock is None:
        out.append("no SM clock figures")
    else:
        out.append(
            f"SM clock {g.sm_clock_mhz:.0f} of {g.sm_clock_max_mhz:.0f} MHz "
            f"({clock:.2f} >= {th.gpu_spin_clock_ratio:.2f}: not clocked down)"
        )
    if cpu is None:
        out.append("no server CPU figures")
    else:
        out.append(
            f"server CPU {cpu.busiest:.2f} core(s) in pid {cpu.pid}, {cpu.tree:.2f} in its "
            f"tree over {cpu.seconds:.0f} s"
        )
    return out
