"""Parse and validate the `[[generic]]` classes of a signature file (core/judge/generic.py).

Errors name the file, the class and the key, as the signatures' own do.
"""

from __future__ import annotations

from typing import Any

from watchdog.core.knowledge.genericmodel import (
    GENERIC_KINDS,
    GENERIC_STATES,
    GenericClass,
    GenericRule,
)
from watchdog.core.knowledge.tomlcheck import (
    SignatureError,
    array,
    check_keys,
    entry_id,
    get,
    regex,
    strs,
)

_CLASS_KEYS = {"id", "state", "title", "needs", "commands", "rule", "unless", "survived"}
_RULE_KEYS = {"kind", "label", "pattern", "count", "min_s", "reset"}


def parse_generic(doc: dict[str, Any], origin: str) -> tuple[GenericClass, ...]:
    """Every `[[generic]]` entry of one parsed signature file."""
    out = [
        _class(e, f"{origin}: generic[{i}]", origin)
        for i, e in enumerate(array(doc, "generic", origin))
    ]
    ids = [c.id for c in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SignatureError(f"{origin}: duplicate generic class id(s): {', '.join(dupes)}")
    return tuple(out)


def merge_generic(
    base: tuple[GenericClass, ...], more: tuple[GenericClass, ...]
) -> tuple[GenericClass, ...]:
    """An operator's class with a shipped id replaces it in place; new ones come last."""
    by_id = {c.id: c for c in more}
    merged = tuple(by_id.pop(c.id, c) for c in base)
    return merged + tuple(c for c in more if c.id in by_id)


def _class(e: Any, where: str, origin: str) -> GenericClass:
    cid = entry_id(e, where)
    where = f"{origin}: generic '{cid}'"
    check_keys(e, _CLASS_KEYS, where)
    state = get(e, "state", str, where, "stalled")
    if state not in GENERIC_STATES:
        raise SignatureError(
            f"{where}: key 'state': must be one of {sorted(GENERIC_STATES)}, got {state!r}"
        )
    rules = tuple(_rule(r, f"{where}: rule[{i}]") for i, r in enumerate(array(e, "rule", where)))
    if not rules:
        raise SignatureError(f"{where}: key 'rule': at least one rule is needed")
    return GenericClass(
        id=cid,
        state=state,
        title=get(e, "title", str, where, cid),
        needs=get(e, "needs", str, where, ""),
        commands=tuple(strs(e, "commands", where)),
        rules=rules,
        unless=tuple(regex(p, f"{where}: key 'unless'") for p in strs(e, "unless", where)),
        survived=tuple(regex(p, f"{where}: key 'survived'") for p in strs(e, "survived", where)),
        origin=origin,
    )


def _rule(r: Any, where: str) -> GenericRule:
    if not isinstance(r, dict):
        raise SignatureError(f"{where}: must be a table")
    check_keys(r, _RULE_KEYS, where)
    kind = r.get("kind")
    if kind not in GENERIC_KINDS:
        raise SignatureError(
            f"{where}: key 'kind': must be one of {sorted(GENERIC_KINDS)}, got {kind!r}"
        )
    pattern = regex(r["pattern"], f"{where}: key 'pattern'") if "pattern" in r else None
    reset = regex(r["reset"], f"{where}: key 'reset'") if "reset" in r else None
    if reset is not None and kind != "repeat":
        raise SignatureError(f"{where}: key 'reset': only a repeat rule takes one")
    if kind in ("line", "repeat") and pattern is None:
        raise SignatureError(f"{where}: key 'pattern': a {kind} rule needs a regex")
    count = get(r, "count", int, where, 1)
    if count < 1:
        raise SignatureError(f"{where}: key 'count': must be at least 1, got {count}")
    min_s = float(get(r, "min_s", (int, float), where, 0.0))
    if not 0.0 <= min_s < 1e9:
        raise SignatureError(f"{where}: key 'min_s': must be a non-negative number, got {min_s}")
    return GenericRule(
        kind=kind,
        label=get(r, "label", str, where, kind),
        pattern=pattern,
        count=count,
        min_s=min_s,
        reset=reset,
    )
