"""The literals every match of a regex contains, read from the regex itself (pure).

A prefilter that looks for these literals with `str.find` or Hyperscan stands in for the
regex on the lines that hold none of them (the log source's block prefilter,
watchdog/sources/logs/prefilter.py; replay's rule search, watchdog/core/judge/linesearch.py).
"""

from __future__ import annotations

import re
from typing import Any

try:  # re._parser is the stdlib's own regex parser (sre_parse before 3.11)
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse as _sre

_Lits = tuple[str, ...]


def required_literals(pattern: re.Pattern[str] | None) -> _Lits | None:
    """Literals one of which every match of `pattern` contains; None when there are none.

    None means the pattern can match without any literal (`\\d+`, a case-insensitive rule),
    so no prefilter can stand in for it and every line must be looked at.
    """
    if pattern is None:
        return ()
    if pattern.flags & re.IGNORECASE:
        return None
    try:
        parsed = _sre.parse(pattern.pattern, pattern.flags)
    except (re.error, TypeError, ValueError):  # pragma: no cover - it compiled once already
        return None
    return _seq_literals(list(parsed))


def _better(a: _Lits | None, b: _Lits | None) -> _Lits | None:
    """The more selective of two literal sets: longest shortest key, then fewest keys."""
    if a is None or b is None:
        return a if b is None else b
    return a if (min(map(len, a)), -len(a)) >= (min(map(len, b)), -len(b)) else b


def _seq_literals(items: list[tuple[object, object]]) -> _Lits | None:
    best: _Lits | None = None
    run: list[str] = []

    def close_run() -> None:
        nonlocal best
        if run:
            best = _better(best, ("".join(run),))
            run.clear()

    for op, av in items:
        if op is _sre.LITERAL and isinstance(av, int) and 0 < av < 128 and av not in (10, 13):
            run.append(chr(av))
            continue
        close_run()
        sub = _item_literals(op, av)
        if sub is not None:
            best = _better(best, sub)
    close_run()
    return best


def _item_literals(op: object, av: Any) -> _Lits | None:
    """Required literals of one regex item that is not a plain ASCII literal."""
    if op is _sre.SUBPATTERN:
        group = av[-1]
        flags_on = av[1]
        return None if flags_on & _sre.SRE_FLAG_IGNORECASE else _seq_literals(list(group))
    if op is _sre.ATOMIC_GROUP:
        return _seq_literals(list(av))
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)):
        low, _high, body = av
        return _seq_literals(list(body)) if low >= 1 else None
    if op is _sre.BRANCH:
        out: list[str] = []
        for alt in av[1]:
            lits = _seq_literals(list(alt))
            if not lits:
                return None
            out += lits
        return tuple(dict.fromkeys(out))
    return None
