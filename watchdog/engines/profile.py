"""The typed engine profile: what the sources read for one engine, compiled once at load time.

Nothing here names an engine; the shipped profiles (profiles/*.toml) and operator files do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from watchdog.core.state.events import LogKind

# Process roles a profile may name (ProcInfo.role). The core speaks of these, never of engines.
ROLES = frozenset(
    {
        "launcher",  # the command the operator ran, when it is not the API server itself
        "api_server",  # HTTP front end (and tokenizer manager where they share a process)
        "engine_core",  # the step loop that owns the batch (vLLM EngineCore)
        "scheduler",  # the step loop per rank (SGLang scheduler)
        "detokenizer",
        "tokenizer",
        "dp_controller",  # data-parallel controller
        "worker",  # a GPU worker of one TP/PP/EP rank
        "executor",  # an engine's executor process (TensorRT-LLM MPI worker)
    }
)
# ServerSample fields a /metrics sample may feed, and the Prometheus type each must have.
COUNTER_FIELDS = frozenset({"iterations", "prompt_tokens", "generation_tokens"})
GAUGE_FIELDS = frozenset({"running", "waiting"})
# What a /health status can mean (ServerSample.health_meaning).
HEALTH_MEANINGS = frozenset({"ok", "dead", "starting", "not_generating"})
# LogEvent kinds an engine log rule may produce (the window reads these): the one enum of
# kinds, less those the watchdog itself makes (tqdm bars, FlashInfer lines, dumps, canary).
LOG_KINDS = frozenset(k.value for k in LogKind) - {
    k.value for k in (LogKind.STACK, LogKind.CANARY, LogKind.PROGRESS, LogKind.JIT)
}


@dataclass(frozen=True)
class RoleRule:
    """Titles (or command lines) that mark a process as `role`; group `rank` is its rank."""

    role: str
    title: re.Pattern[str]


@dataclass(frozen=True)
class MetricSample:
    """One /metrics sample name that feeds a ServerSample field."""

    name: str
    field: str
    type: str  # "counter" | "gauge"


@dataclass(frozen=True)
class LogExtra:
    """A second part of the same line, found after the main match (e.g. `#queue-req: N`)."""

    needle: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class LogRule:
    """One engine log format: matched where `needle` first occurs (linear time, see logparse)."""

    engine: str
    kind: str
    needle: str
    pattern: re.Pattern[str]
    before: re.Pattern[str] | None = None  # searched in the few characters before the needle
    extras: tuple[LogExtra, ...] = ()
    set: Mapping[str, Any] = field(default_factory=dict)  # constant fields added to the event
    types: Mapping[str, str] = field(default_factory=dict)  # group -> "int" | "float" | "ratio%"


@dataclass(frozen=True)
class Spelling:
    """How one fallback is spelled for an engine: flags appended and/or environment set."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class EngineProfile:
    """Everything the watchdog knows about one engine."""

    name: str
    title: str
    origin: str  # file it came from, for messages
    version: str = ""  # upstream version the formats were read from
    cmdline: tuple[re.Pattern[str], ...] = ()
    titles: tuple[re.Pattern[str], ...] = ()
    roles: tuple[RoleRule, ...] = ()
    metrics_path: str = "/metrics"
    samples: tuple[MetricSample, ...] = ()
    health_path: str = "/health"
    health: Mapping[int, str] = field(default_factory=dict)  # status -> meaning
    health_no_answer: str | None = None  # meaning of a /health that timed out (None: no data)
    log_prefixes: tuple[re.Pattern[str], ...] = ()
    logs: tuple[LogRule, ...] = ()
    fallbacks: Mapping[str, Spelling] = field(default_factory=dict)
    version_package: str = ""  # distribution whose version decides flag-vs-env spellings
    packages: tuple[str, ...] = ()  # more of the engine's distributions to record versions of
    # Preflight: the flags that choose the attention backend, the values that are TRTLLM-gen
    # (FlashInfer cubins fetched at first use), and the compute capabilities where the engine
    # picks TRTLLM-gen by itself when no flag says otherwise.
    attention_flags: tuple[str, ...] = ()
    trtllm_values: frozenset[str] = frozenset()
    trtllm_default_cc: frozenset[str] = frozenset()

    def trtllm_attention(self, args: Sequence[str]) -> bool | None:
        """True/False when the server arguments pick a TRTLLM-gen backend or another one; None
        when none of the attention flags is given (the engine decides by the GPU)."""
        chosen: bool | None = None
        for i, arg in enumerate(args):
            name, _, inline = arg.partition("=")
            if name not in self.attention_flags:
                continue
            value = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
            hit = value in self.trtllm_values
            chosen = hit if chosen is None else (chosen or hit)
        return chosen

    def role_of(self, title: str) -> tuple[str, int | None]:
        """(role, rank) of a process title; ("", None) when no role rule matches."""
        for rule in self.roles:
            m = rule.title.search(title)
            if m is not None:
                rank = m.groupdict().get("rank")
                return rule.role, int(rank) if rank and len(rank) < 8 else None
        return "", None

    def health_meaning(self, status: int | None) -> str | None:
        """What a /health status means for this engine; None when unanswered or undeclared."""
        if status is None:
            return None
        if status in self.health:
            return self.health[status]
        return "ok" if 200 <= status < 300 else None

    @property
    def distributions(self) -> tuple[str, ...]:
        """The engine's own distributions whose versions facts and bundles record."""
        names = (self.version_package, *self.packages)
        return tuple(dict.fromkeys(n for n in names if n))

    @property
    def sample_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.samples)

    def missing(self) -> tuple[str, ...]:
        """Engine-specific evidence this profile cannot give (said in verdicts of unknowns)."""
        out = []
        if not any(s.type == "counter" for s in self.samples):
            out.append("progress counters in /metrics")
        if not any(r.kind == "stats" for r in self.logs):
            out.append("periodic stats lines in the log")
        if not self.roles:
            out.append("process roles")
        return tuple(out)


# The engine watched when none is recognised: generic signals only (GPU, process tree, stacks,
# sockets). Its `missing()` lists what an engine profile would have added.
GENERIC = EngineProfile(name="unknown", title="unknown engine", origin="built-in")
