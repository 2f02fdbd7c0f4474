"""Load and validate the signature knowledge base (shipped TOML plus operator files).

Errors name the file, the entry and the key, so an operator can fix a rule file without
reading code.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

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


class SignatureError(ValueError):
    """A signature file is invalid; the message names file, entry and key."""


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
    values: tuple[str, ...] = ()
    name: str = ""
    equals: Any = None
    not_equals: Any = None
    has_equals: bool = False
    has_not_equals: bool = False
    status: int | None = None


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
        return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None


def load_signatures(extra: Sequence[Path | str] = ()) -> SignatureSet:
    """The shipped knowledge base, then each operator file in order (same id replaces)."""
    text = resources.files("watchdog").joinpath("signatures.toml").read_text(encoding="utf-8")
    merged = _parse(text, "signatures.toml (built-in)")
    for path in extra:
        merged = _merge(merged, load_file(Path(path)))
    return merged


def load_file(path: Path) -> SignatureSet:
    """One operator signature file, validated."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read signature file: {exc.strerror or exc}") from exc
    return _parse(text, str(path))


def _merge(base: SignatureSet, more: SignatureSet) -> SignatureSet:
    sigs = {s.id: s for s in base.signatures}
    sigs.update({s.id: s for s in more.signatures})
    bad = {k.id: k for k in base.known_bad}
    bad.update({k.id: k for k in more.known_bad})
    return SignatureSet(
        tuple(sigs.values()),
        tuple(bad.values()),
        {**base.fallbacks, **more.fallbacks},
        base.benign + more.benign,
    )


def _parse(text: str, origin: str) -> SignatureSet:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SignatureError(f"{origin}: not valid TOML: {exc}") from exc
    _check_keys(doc, {"schema", "signature", "known_bad", "fallback", "benign"}, origin)
    if doc.get("schema", 1) != 1:
        raise SignatureError(
            f"{origin}: key 'schema': unsupported version {doc['schema']!r} (expected 1)"
        )
    fallbacks = {
        name: _fallback(name, body, f"{origin}: fallback.{name}")
        for name, body in _table(doc, "fallback", origin).items()
    }
    sigs = [
        _signature(e, f"{origin}: signature[{i}]", origin)
        for i, e in enumerate(_list(doc, "signature", origin))
    ]
    ids = [s.id for s in sigs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SignatureError(f"{origin}: duplicate signature id(s): {', '.join(dupes)}")
    bad = [
        _known_bad(e, f"{origin}: known_bad[{i}]", origin)
        for i, e in enumerate(_list(doc, "known_bad", origin))
    ]
    benign = tuple(
        _benign(e, f"{origin}: benign[{i}]") for i, e in enumerate(_list(doc, "benign", origin))
    )
    return SignatureSet(tuple(sigs), tuple(bad), fallbacks, benign)


BENIGN_STATES = frozenset({"loading", "compiling", "serving"})


def _benign(e: Any, where: str) -> Benign:
    if not isinstance(e, dict):
        raise SignatureError(f"{where}: must be a table")
    body = dict(e)
    state = body.pop("state", None)
    if state not in BENIGN_STATES:
        raise SignatureError(
            f"{where}: key 'state': must be one of {sorted(BENIGN_STATES)}, got {state!r}"
        )
    return Benign(state=state, rule=_rule(body, where))


_SIG_KEYS = {
    "id",
    "title",
    "when",
    "state",
    "priority",
    "min_confidence",
    "fallback",
    "fix",
    "commands",
    "references",
    "evidence",
    "unless",
}
_RULE_KEYS = {
    "kind",
    "weight",
    "required",
    "label",
    "pattern",
    "within_s",
    "decisive",
    "frames",
    "files",
    "unchanged",
    "values",
    "name",
    "equals",
    "not_equals",
    "status",
}


def _signature(e: Any, where: str, origin: str) -> Signature:
    if not isinstance(e, dict):
        raise SignatureError(f"{where}: must be a table")
    sig_id = e.get("id")
    if not isinstance(sig_id, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", sig_id):
        raise SignatureError(f"{where}: key 'id': must be a snake_case string, got {sig_id!r}")
    where = f"{origin}: signature '{sig_id}'"
    _check_keys(e, _SIG_KEYS, where)
    when = _get(e, "when", str, where, "stalled")
    if when not in WHEN:
        raise SignatureError(f"{where}: key 'when': must be one of {sorted(WHEN)}, got {when!r}")
    state = _get(e, "state", str, where, "hung")
    if state not in VERDICT_STATES:
        raise SignatureError(
            f"{where}: key 'state': must be one of {sorted(VERDICT_STATES)}, got {state!r}"
        )
    evidence = tuple(
        _rule(r, f"{where}: evidence[{i}]") for i, r in enumerate(_list(e, "evidence", where))
    )
    if not evidence:
        raise SignatureError(f"{where}: key 'evidence': at least one evidence item is needed")
    return Signature(
        id=sig_id,
        title=_get(e, "title", str, where, sig_id),
        when=when,
        state=state,
        priority=_get(e, "priority", int, where, 0),
        min_confidence=float(_get(e, "min_confidence", (int, float), where, 0.5)),
        fallback=_get(e, "fallback", str, where, None),
        fix=_get(e, "fix", str, where, ""),
        commands=tuple(_strs(e, "commands", where)),
        references=tuple(_strs(e, "references", where)),
        evidence=evidence,
        unless=tuple(
            _rule(r, f"{where}: unless[{i}]") for i, r in enumerate(_list(e, "unless", where))
        ),
        origin=origin,
    )


def _rule(r: Any, where: str) -> Rule:
    if not isinstance(r, dict):
        raise SignatureError(f"{where}: must be a table")
    _check_keys(r, _RULE_KEYS, where)
    kind = r.get("kind")
    if kind not in EVIDENCE_KINDS:
        raise SignatureError(
            f"{where}: key 'kind': must be one of {sorted(EVIDENCE_KINDS)}, got {kind!r}"
        )
    pattern = _regex(r["pattern"], f"{where}: key 'pattern'") if "pattern" in r else None
    if kind == "log" and pattern is None:
        raise SignatureError(f"{where}: key 'pattern': a log rule needs a regex")
    frames = tuple(_regex(p, f"{where}: key 'frames'") for p in _strs(r, "frames", where))
    files = tuple(_regex(p, f"{where}: key 'files'") for p in _strs(r, "files", where))
    if kind == "stack" and not (frames or files):
        raise SignatureError(f"{where}: key 'frames': a stack rule needs frames or files")
    if kind in ("package", "setting") and not isinstance(r.get("name"), str):
        raise SignatureError(
            f"{where}: key 'name': a {kind} rule needs the name of a package or setting"
        )
    if kind in ("gpu_cc", "package") and not r.get("values"):
        raise SignatureError(f"{where}: key 'values': a {kind} rule needs a list of values")
    weight = float(_get(r, "weight", (int, float), where, 0.0))
    if not 0.0 <= weight <= 1.0:
        raise SignatureError(f"{where}: key 'weight': must be between 0 and 1, got {weight}")
    return Rule(
        kind=kind,
        weight=weight,
        required=_get(r, "required", bool, where, False),
        label=_get(r, "label", str, where, kind),
        pattern=pattern,
        within_s=float(_get(r, "within_s", (int, float), where, 300.0)),
        decisive=_get(r, "decisive", bool, where, False),
        frames=frames,
        files=files,
        unchanged=_get(r, "unchanged", bool, where, False),
        values=tuple(_strs(r, "values", where)),
        name=_get(r, "name", str, where, ""),
        equals=r.get("equals"),
        not_equals=r.get("not_equals"),
        has_equals="equals" in r,
        has_not_equals="not_equals" in r,
        status=_get(r, "status", int, where, None),
    )


def _known_bad(e: Any, where: str, origin: str) -> KnownBad:
    if not isinstance(e, dict) or not isinstance(e.get("id"), str):
        raise SignatureError(f"{where}: key 'id': each known_bad entry needs a string id")
    where = f"{origin}: known_bad '{e['id']}'"
    keys = {
        "id",
        "severity",
        "cc",
        "package",
        "versions",
        "unless_disabled",
        "title",
        "fixes",
        "references",
        "signature",
    }
    _check_keys(e, keys, where)
    severity = _get(e, "severity", str, where, "fail")
    if severity not in SEVERITIES:
        raise SignatureError(f"{where}: key 'severity': must be 'fail' or 'warn', got {severity!r}")
    package = _get(e, "package", str, where, None)
    if not package:
        raise SignatureError(f"{where}: key 'package': the distribution name is required")
    return KnownBad(
        id=e["id"],
        severity=severity,
        cc=tuple(_strs(e, "cc", where)),
        package=package,
        versions=tuple(_strs(e, "versions", where)),
        unless_disabled=_get(e, "unless_disabled", str, where, None),
        title=_get(e, "title", str, where, e["id"]),
        fixes=tuple(_strs(e, "fixes", where)),
        references=tuple(_strs(e, "references", where)),
        signature=_get(e, "signature", str, where, None),
    )


def _fallback(name: str, body: Any, where: str) -> Fallback:
    if not isinstance(body, dict):
        raise SignatureError(f"{where}: must be a table")
    _check_keys(
        body, {"description", "args", "env", "args_since_vllm", "legacy_env", "restart"}, where
    )
    return Fallback(
        name=name,
        description=_get(body, "description", str, where, ""),
        args=tuple(_strs(body, "args", where)),
        env=_str_map(body, "env", where),
        args_since_vllm=_get(body, "args_since_vllm", str, where, None),
        legacy_env=_str_map(body, "legacy_env", where),
        restart=_get(body, "restart", bool, where, True),
    )


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SignatureError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _get(table: Mapping[str, Any], key: str, tp: Any, where: str, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    accepts_bool = tp is bool or (isinstance(tp, tuple) and bool in tp)
    if (isinstance(value, bool) and not accepts_bool) or not isinstance(value, tp):
        name = tp.__name__ if isinstance(tp, type) else "number"
        raise SignatureError(f"{where}: key '{key}': expected {name}, got {value!r}")
    return value


def _strs(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SignatureError(f"{where}: key '{key}': expected a list of strings, got {value!r}")
    return value


def _str_map(table: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SignatureError(f"{where}: key '{key}': expected a table of strings, got {value!r}")
    return dict(value)


def _list(table: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise SignatureError(f"{where}: key '{key}': expected an array of tables")
    return value


def _table(table: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise SignatureError(f"{where}: key '{key}': expected a table")
    return value


def _regex(p: Any, where: str) -> re.Pattern[str]:
    if not isinstance(p, str):
        raise SignatureError(f"{where}: expected a regex string, got {p!r}")
    try:
        return re.compile(p)
    except re.error as exc:
        raise SignatureError(f"{where}: invalid regex {p!r}: {exc}") from exc
