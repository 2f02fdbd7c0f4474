"""The knowledge base's types: signatures and their evidence rules, known-bad combinations,
fallbacks, benign explanations (parsed by watchdog/core/knowledge/signatures.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from watchdog.core.knowledge.context import CONTEXT_PATTERNS
from watchdog.core.knowledge.genericmodel import GenericClass
from watchdog.core.knowledge.literals import required_literals
from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.knowledge.rankrules import RankRules

EVIDENCE_KINDS = frozenset(
    {
        "log",
        "stack",
        "cdn_socket",
        "gpu_spin",
        "no_progress",
        "gpu_cc",
        "package",
        "setting",
        "health",
        "process_gone",
    }
)
WHEN = frozenset({"stalled", "any"})
VERDICT_STATES = frozenset(
    {"hung", "dead", "crash"}
)  # crash: dead if the target is gone, else hung
SEVERITIES = frozenset({"fail", "warn"})
# Lines a log rule remembers its answer for; past this it forgets them all and starts again.
# A window's lookback holds a few hundred kept lines (the log source keeps only lines a rule
# can match), so this bounds memory (about 80 KiB a rule) without forgetting in normal use.
LINE_MEMO = 1024


@dataclass(frozen=True)
class Rule:
    """One evidence item of a signature."""

    kind: str
    weight: float = 0.0
    required: bool = False
    label: str = ""
    pattern: re.Pattern[str] | None = None
    within_s: float = 300.0
    decisive: bool = False
    frames: tuple[re.Pattern[str], ...] = ()
    files: tuple[re.Pattern[str], ...] = ()
    unchanged: bool = False
    same_frame: bool = False  # one frame must match both `frames` and `files`
    values: tuple[str, ...] = ()
    name: str = ""
    equals: Any = None
    not_equals: Any = None
    has_equals: bool = False
    has_not_equals: bool = False
    status: int | None = None
    # log rules: only a line after the server's last progress counts (a death the server
    # moved past, e.g. a helper process it survives, is no verdict).
    after_progress: bool = False

    @cached_property
    def literals(self) -> tuple[str, ...]:
        """Literals one of which every match of `pattern` holds (core/knowledge/literals.py): a line
        holding none cannot match, and `in` costs a fraction of a regex search. Empty when
        there are none to look for (a case-insensitive rule, `\\d+`): every line is searched."""
        return required_literals(self.pattern) or () if self.pattern is not None else ()

    @cached_property
    def line_answers(self) -> dict[str, bool]:
        """What `matches_line` answered, by line (read it first: a lookup costs less than the
        call)."""
        return {}

    def matches_line(self, line: str) -> bool:
        """Does `pattern` match `line`? Remembered: the live classifier asks about the same
        lines of its window on every tick, for as long as they stay in the rule's lookback.
        (A cache of a pure answer: the result is the search's, whatever the order of calls.)"""
        seen = self.line_answers
        hit = seen.get(line)
        if hit is None:
            if len(seen) >= LINE_MEMO:
                seen.clear()
            keys, pattern = self.literals, self.pattern
            found = pattern is not None and (not keys or any(k in line for k in keys))
            hit = seen[line] = found and pattern is not None and bool(pattern.search(line))
        return hit


@dataclass(frozen=True)
class EngineText:
    """How one engine's operators are told about a signature."""

    title: str = ""
    fix: str = ""
    commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Signature:
    """A known hang: what it looks like (rules) and what to do (fix, fallback)."""

    id: str
    title: str
    when: str
    state: str
    priority: int
    min_confidence: float
    fallback: str | None
    fix: str
    commands: tuple[str, ...]
    references: tuple[str, ...]
    evidence: tuple[Rule, ...]
    unless: tuple[Rule, ...] = ()
    origin: str = ""
    # The signature names a death (engine gone, worker failed): when another signature's line
    # comes first in a log, that one is the cause and this its consequence
    # (core/judge/logverdict.py).
    consequence: bool = False
    # Per-engine wording (`[signature.engine.NAME]`): title, fix and commands as that engine
    # spells them; the cause and its evidence stay engine-neutral.
    engines: Mapping[str, EngineText] = field(default_factory=dict)

    def text_for(self, engine: str) -> EngineText:
        """The title/fix/commands for `engine`, falling back to the signature's own."""
        own = self.engines.get(engine)
        return EngineText(
            title=own.title if own and own.title else self.title,
            fix=own.fix if own and own.fix else self.fix,
            commands=own.commands if own and own.commands else self.commands,
        )

    @property
    def decisive_log_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.evidence if r.kind == "log" and r.decisive)


@dataclass(frozen=True)
class KnownBad:
    """A version combination known to fail, checked by preflight."""

    id: str
    severity: str
    cc: tuple[str, ...]
    package: str
    versions: tuple[str, ...]
    unless_disabled: str | None
    title: str
    fixes: tuple[str, ...]
    references: tuple[str, ...]
    signature: str | None


@dataclass(frozen=True)
class Fallback:
    """How a restart avoids a cause: arguments and environment for the server."""

    name: str
    description: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    args_since_vllm: str | None = None
    legacy_env: Mapping[str, str] = field(default_factory=dict)
    restart: bool = True


@dataclass(frozen=True)
class Benign:
    """Evidence that a stalled-looking server is doing legitimate work (e.g. reading weights)."""

    state: str
    rule: Rule


@dataclass(frozen=True)
class SignatureSet:
    """Everything the knowledge base says, merged from the shipped file and operator files."""

    signatures: tuple[Signature, ...]
    known_bad: tuple[KnownBad, ...]
    fallbacks: Mapping[str, Fallback]
    benign: tuple[Benign, ...] = ()
    # The generic layer (crashed, timed_out, stalled, livelock: core/judge/generic.py), consulted
    # when no signature names the cause.
    generic: tuple[GenericClass, ...] = ()
    # What the classifier reads beside the signatures, loaded with them (load_signatures):
    # the operations a log starts and never finishes (openops.toml) and which rank is the
    # cause (ranks.toml). Operator files add signatures only; these stay the shipped ones.
    ops: tuple[OpDef, ...] = ()
    ranks: RankRules = field(default_factory=RankRules)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.signatures)

    def get(self, sig_id: str) -> Signature | None:
        return next((s for s in self.signatures if s.id == sig_id), None)

    def log_keep_pattern(self) -> re.Pattern[str] | None:
        """One regex matching every log rule, so the log source keeps exactly those lines."""
        pats = [
            r.pattern.pattern for s in self.signatures for r in s.evidence + s.unless if r.pattern
        ]
        pats += [r.pattern.pattern for c in self.generic for r in c.rules if r.pattern]
        pats += [r.reset.pattern for c in self.generic for r in c.rules if r.reset]
        pats += CONTEXT_PATTERNS  # read beside an error by the root-cause readers
        return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None
