"""Load and validate the signature knowledge base (shipped TOML plus operator files).

Errors name the file, the entry and the key, so an operator can fix a rule file without
reading code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from watchdog.core.knowledge.genericparse import merge_generic, parse_generic
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.rankrules import load_rank_rules
from watchdog.core.knowledge.sigmodel import (
    EVIDENCE_KINDS,
    SEVERITIES,
    VERDICT_STATES,
    WHEN,
    Benign,
    EngineText,
    Fallback,
    KnownBad,
    Rule,
    Signature,
    SignatureSet,
)
from watchdog.core.knowledge.tomlcheck import (
    SignatureError,
    array,
    check_keys,
    entry_id,
    finite,
    get,
    read_toml,
    read_toml_text,
    regex,
    str_map,
    strs,
    table,
)

# The signature model's names are imported from here (sigmodel is where they are defined).
__all__ = [
    "BENIGN_STATES",
    "BUILTIN_FALLBACKS",
    "EVIDENCE_KINDS",
    "SEVERITIES",
    "VERDICT_STATES",
    "WHEN",
    "Benign",
    "EngineText",
    "Fallback",
    "KnownBad",
    "Rule",
    "Signature",
    "SignatureError",
    "SignatureSet",
    "check_fallbacks",
    "load_file",
    "load_signatures",
]


def load_signatures(extra: Sequence[Path | str] = ()) -> SignatureSet:
    """The shipped knowledge base, then each operator file in order (same id replaces); read
    now on every call (the daemon, `replay` and `preflight` call it once and pass it down)."""
    # Beside this module, not importlib.resources: its file reader imports zipfile and
    # tempfile, 0.4 MiB of RSS a daemon would keep; the package is installed as files.
    text = Path(__file__).parent.joinpath("signatures.toml").read_text(encoding="utf-8")
    merged = dataclasses.replace(
        _parse(text, "signatures.toml (built-in)"), ops=load_ops(), ranks=load_rank_rules()
    )
    for path in extra:
        merged = _merge(merged, load_file(Path(path)))
    check_fallbacks(merged)
    return merged


# A signature may name these even where no file defines a table for them.
BUILTIN_FALLBACKS = ("none", "restart")


def check_fallbacks(sigs: SignatureSet) -> None:
    """SignatureError naming the entry whose `fallback` no [fallback.NAME] table defines."""
    known = sorted(set(BUILTIN_FALLBACKS) | set(sigs.fallbacks))
    for sig in sigs.signatures:
        if sig.fallback is not None and sig.fallback not in known:
            raise SignatureError(
                f"{sig.origin}: signature '{sig.id}': key 'fallback': {sig.fallback!r} is not "
                f"defined; use one of {', '.join(known)}, or add a [fallback.{sig.fallback}] "
                "table to a signature file"
            )


def load_file(path: Path) -> SignatureSet:
    """One operator signature file, validated."""
    return _parse(read_toml_text(path, "signature file"), str(path))


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
        merge_generic(base.generic, more.generic),
        base.ops,
        base.ranks,
    )


def _parse(text: str, origin: str) -> SignatureSet:
    doc = read_toml(text, origin)
    check_keys(doc, {"schema", "signature", "known_bad", "fallback", "benign", "generic"}, origin)
    if doc.get("schema", 1) != 1:
        raise SignatureError(
            f"{origin}: key 'schema': unsupported version {doc['schema']!r} (expected 1)"
        )
    fallbacks = {
        name: _fallback(name, body, f"{origin}: fallback.{name}")
        for name, body in table(doc, "fallback", origin).items()
    }
    sigs = [
        _signature(e, f"{origin}: signature[{i}]", origin)
        for i, e in enumerate(array(doc, "signature", origin))
    ]
    ids = [s.id for s in sigs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SignatureError(f"{origin}: duplicate signature id(s): {', '.join(dupes)}")
    bad = [
        _known_bad(e, f"{origin}: known_bad[{i}]", origin)
        for i, e in enumerate(array(doc, "known_bad", origin))
    ]
    benign = tuple(
        _benign(e, f"{origin}: benign[{i}]") for i, e in enumerate(array(doc, "benign", origin))
    )
    return SignatureSet(tuple(sigs), tuple(bad), fallbacks, benign, parse_generic(doc, origin))


BENIGN_STATES = frozenset({"loading", "compiling", "serving"})


def _benign(e: Any, where: str) -> Benign:
    if not isinstance(e, dict):
        raise SignatureError(f"{where}: must be a table")
    body = dict(e)
    state = body.pop("state", None)
    if not isinstance(state, str) or state not in BENIGN_STATES:
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
    "engine",
    "consequence",
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
    "same_frame",
    "values",
    "name",
    "equals",
    "not_equals",
    "status",
    "after_progress",
}


def _engine_texts(tables: dict[str, Any], where: str) -> dict[str, EngineText]:
    """`[signature.engine.NAME]`: per-engine title, fix and commands."""
    out = {}
    for name, body in tables.items():
        w = f"{where}: engine.{name}"
        if not isinstance(body, dict):
            raise SignatureError(f"{w}: must be a table")
        check_keys(body, {"title", "fix", "commands"}, w)
        out[name] = EngineText(
            title=get(body, "title", str, w, ""),
            fix=get(body, "fix", str, w, ""),
            commands=tuple(strs(body, "commands", w)),
        )
    return out


def _signature(e: Any, where: str, origin: str) -> Signature:
    sig_id = entry_id(e, where)
    where = f"{origin}: signature '{sig_id}'"
    check_keys(e, _SIG_KEYS, where)
    when = get(e, "when", str, where, "stalled")
    if not isinstance(when, str) or when not in WHEN:
        raise SignatureError(f"{where}: key 'when': must be one of {sorted(WHEN)}, got {when!r}")
    state = get(e, "state", str, where, "hung")
    if not isinstance(state, str) or state not in VERDICT_STATES:
        raise SignatureError(
            f"{where}: key 'state': must be one of {sorted(VERDICT_STATES)}, got {state!r}"
        )
    evidence = tuple(
        _rule(r, f"{where}: evidence[{i}]") for i, r in enumerate(array(e, "evidence", where))
    )
    if not evidence:
        raise SignatureError(f"{where}: key 'evidence': at least one evidence item is needed")
    return Signature(
        id=sig_id,
        title=get(e, "title", str, where, sig_id),
        when=when,
        state=state,
        priority=get(e, "priority", int, where, 0),
        min_confidence=float(get(e, "min_confidence", (int, float), where, 0.5)),
        fallback=get(e, "fallback", str, where, None),
        fix=get(e, "fix", str, where, ""),
        commands=tuple(strs(e, "commands", where)),
        references=tuple(strs(e, "references", where)),
        evidence=evidence,
        engines=_engine_texts(table(e, "engine", where), where),
        unless=tuple(
            _rule(r, f"{where}: unless[{i}]") for i, r in enumerate(array(e, "unless", where))
        ),
        origin=origin,
        consequence=get(e, "consequence", bool, where, False),
    )


def _rule(r: Any, where: str) -> Rule:
    if not isinstance(r, dict):
        raise SignatureError(f"{where}: must be a table")
    check_keys(r, _RULE_KEYS, where)
    kind = r.get("kind")
    if not isinstance(kind, str) or kind not in EVIDENCE_KINDS:
        raise SignatureError(
            f"{where}: key 'kind': must be one of {sorted(EVIDENCE_KINDS)}, got {kind!r}"
        )
    pattern = regex(r["pattern"], f"{where}: key 'pattern'") if "pattern" in r else None
    if kind == "log" and pattern is None:
        raise SignatureError(f"{where}: key 'pattern': a log rule needs a regex")
    frames = tuple(regex(p, f"{where}: key 'frames'") for p in strs(r, "frames", where))
    files = tuple(regex(p, f"{where}: key 'files'") for p in strs(r, "files", where))
    if kind == "stack" and not (frames or files):
        raise SignatureError(f"{where}: key 'frames': a stack rule needs frames or files")
    same_frame = get(r, "same_frame", bool, where, False)
    if same_frame and not (frames and files):
        raise SignatureError(f"{where}: key 'same_frame': needs both 'frames' and 'files'")
    if kind in ("package", "setting") and not isinstance(r.get("name"), str):
        raise SignatureError(
            f"{where}: key 'name': a {kind} rule needs the name of a package or setting"
        )
    if kind in ("gpu_cc", "package") and not r.get("values"):
        raise SignatureError(f"{where}: key 'values': a {kind} rule needs a list of values")
    weight = float(get(r, "weight", (int, float), where, 0.0))
    if not 0.0 <= weight <= 1.0:
        raise SignatureError(f"{where}: key 'weight': must be between 0 and 1, got {weight}")
    return Rule(
        kind=kind,
        weight=weight,
        required=get(r, "required", bool, where, False),
        label=get(r, "label", str, where, kind),
        pattern=pattern,
        within_s=float(get(r, "within_s", (int, float), where, 300.0)),
        decisive=get(r, "decisive", bool, where, False),
        frames=frames,
        files=files,
        unchanged=get(r, "unchanged", bool, where, False),
        same_frame=same_frame,
        values=tuple(strs(r, "values", where)),
        name=get(r, "name", str, where, ""),
        equals=finite(r.get("equals"), "equals", where),
        not_equals=finite(r.get("not_equals"), "not_equals", where),
        has_equals="equals" in r,
        has_not_equals="not_equals" in r,
        status=get(r, "status", int, where, None),
        after_progress=get(r, "after_progress", bool, where, False),
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
    check_keys(e, keys, where)
    severity = get(e, "severity", str, where, "fail")
    if not isinstance(severity, str) or severity not in SEVERITIES:
        raise SignatureError(f"{where}: key 'severity': must be 'fail' or 'warn', got {severity!r}")
    package = get(e, "package", str, where, None)
    if not package:
        raise SignatureError(f"{where}: key 'package': the distribution name is required")
    return KnownBad(
        id=e["id"],
        severity=severity,
        cc=tuple(strs(e, "cc", where)),
        package=package,
        versions=tuple(strs(e, "versions", where)),
        unless_disabled=get(e, "unless_disabled", str, where, None),
        title=get(e, "title", str, where, e["id"]),
        fixes=tuple(strs(e, "fixes", where)),
        references=tuple(strs(e, "references", where)),
        signature=get(e, "signature", str, where, None),
    )


def _fallback(name: str, body: Any, where: str) -> Fallback:
    if not isinstance(body, dict):
        raise SignatureError(f"{where}: must be a table")
    check_keys(
        body, {"description", "args", "env", "args_since_vllm", "legacy_env", "restart"}, where
    )
    return Fallback(
        name=name,
        description=get(body, "description", str, where, ""),
        args=tuple(strs(body, "args", where)),
        env=str_map(body, "env", where),
        args_since_vllm=get(body, "args_since_vllm", str, where, None),
        legacy_env=str_map(body, "legacy_env", where),
        restart=get(body, "restart", bool, where, True),
    )
