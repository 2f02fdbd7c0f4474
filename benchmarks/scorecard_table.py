"""The scorecard's table, built from recorded runs (pure: no engine, no clock).

One run is one JSON object per line (benchmarks/scorecard.py writes them):
  class        the injected class, e.g. "cubin_trickle" (CLASSES says what each is)
  expected     the cause a right verdict names ("" for a healthy class: nothing may be raised)
  named        what the watchdog said: a signature id, "stopped" (a SIGSTOPped process),
               another state, or "" when it raised nothing
  seconds      onset to that verdict (null for a healthy class or when nothing came)
  healthy_s    seconds of healthy serving watched in the run (healthy classes)
  alarms       stalled, hung or dead states raised in a healthy class
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# class -> what it injects (the table's first column says it in words).
CLASSES: Mapping[str, str] = {
    "cubin_trickle": "cubin stall, CDN trickling (real vLLM)",
    "cubin_silent": "cubin stall, CDN silent (real vLLM)",
    "tp2_collective": "TP=2, rank 1 held outside its step (real vLLM)",
    "sigstop": "engine core SIGSTOP under load (real vLLM)",
    "worker_exception": "exception in the worker's step (real vLLM)",
    "illegal_instruction": "worker killed by SIGILL at its first batch (real vLLM)",
    "gpu_spin_sim": "first batch spins in a kernel, GPU figures (simulated vLLM)",
    "healthy_drain": "load, drain, idle (real vLLM)",
    "idle": "idle after startup (real vLLM)",
    "stats_150s": "VLLM_LOG_STATS_INTERVAL=150, drained (real vLLM)",
    "cold_compile": "compile-mode cold start, then load (real vLLM)",
    "slow_load": "60 s silent weight load, then load (real vLLM)",
}


@dataclass(frozen=True)
class Run:
    """One recorded run of one class."""

    cls: str
    expected: str
    named: str
    seconds: float | None
    healthy_s: float = 0.0
    alarms: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        seconds = data.get("seconds")
        return cls(
            cls=str(data["class"]),
            expected=str(data.get("expected") or ""),
            named=str(data.get("named") or ""),
            seconds=float(seconds) if seconds is not None else None,
            healthy_s=float(data.get("healthy_s") or 0.0),
            alarms=int(data.get("alarms") or 0),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "expected": self.expected,
            "named": self.named,
            "seconds": None if self.seconds is None else round(self.seconds, 2),
            "healthy_s": round(self.healthy_s, 1),
            "alarms": self.alarms,
        }


def read_runs(path: Path) -> list[Run]:
    """Every run recorded in a JSON-lines file; ValueError naming the line for a bad one."""
    runs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            runs.append(Run.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a scorecard run ({e})") from e
    return runs


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def table(runs: Iterable[Run]) -> str:
    """The Markdown table: per class, runs, p50 and p90 onset to verdict, right cause, and
    false alarms per hour of healthy serving."""
    by_class: dict[str, list[Run]] = {}
    for run in runs:
        by_class.setdefault(run.cls, []).append(run)
    order = [c for c in CLASSES if c in by_class] + sorted(set(by_class) - set(CLASSES))
    lines = [
        "| class | runs | p50 onset to verdict | p90 | right cause | false alarms per hour |",
        "|---|---|---|---|---|---|",
    ]
    for cls in order:
        lines.append(_row(cls, by_class[cls]))
    return "\n".join(lines)


def _row(cls: str, runs: Sequence[Run]) -> str:
    what = CLASSES.get(cls, cls)
    if not runs[0].expected:  # a healthy class: only false alarms count
        hours = sum(r.healthy_s for r in runs) / 3600
        alarms = sum(r.alarms for r in runs)
        rate = f"{alarms / hours:.1f} ({alarms} in {hours * 60:.0f} min)" if hours else "-"
        return f"| {what} | {len(runs)} | - | - | - | {rate} |"
    times = [r.seconds for r in runs if r.seconds is not None]
    p50 = f"{percentile(times, 50):.1f} s" if times else "none"
    p90 = f"{percentile(times, 90):.1f} s" if times else "none"
    right = sum(r.named == r.expected for r in runs)
    wrong = sorted({r.named or "nothing" for r in runs if r.named != r.expected})
    said = f" (else: {', '.join(wrong)})" if wrong else ""
    cause = f"{right}/{len(runs)} `{runs[0].expected}`{said}"
    return f"| {what} | {len(runs)} | {p50} | {p90} | {cause} | - |"
