"""The keep pattern (every signature's log rule, one alternation) run alternative by
alternative, each behind its required literals.

Python's `re` tries every alternative at every position of the line: for a 64 KB line that is
millions of steps (40 ms and more for the 45 shipped alternatives), even when no alternative's
literal is in the line. Each alternative runs here only when one of its literals (the same
ones the block prefilter uses) is in the line, which `str.__contains__` checks in
microseconds. The answer is the same as `keep.search(text)`'s truth; tests/test_keepguard.py
compares them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from watchdog.sources.logs.prefilter import required_literals

Guard = Callable[[str], bool]


def keeps(keep: re.Pattern[str], text: str) -> bool:
    """Does `keep` match somewhere in `text`?"""
    return _build(keep)(text)


def top_level_alternatives(pattern: str) -> list[str] | None:
    """`pattern` split at its top-level `|` (outside groups and classes); None when the split
    is unsure (an unbalanced group), so the caller runs the pattern whole."""
    out: list[str] = []
    depth, start, i, n = 0, 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    if depth != 0:
        return None
    out.append(pattern[start:])
    return out


# A memo of a pure function, like re's own compile cache: patterns compare equal by pattern and
# flags, and a process builds one keep pattern per signature set.
@functools.lru_cache(maxsize=32)
def _build(keep: re.Pattern[str]) -> Guard:
    alts = top_level_alternatives(keep.pattern)
    if alts is None or len(alts) < 2 or keep.flags & re.IGNORECASE:
        return lambda text: keep.search(text) is not None
    guarded: list[tuple[re.Pattern[str], tuple[str, ...] | None]] = []
    try:
        for alt in alts:
            compiled = re.compile(alt, keep.flags)
            guarded.append((compiled, required_literals(compiled)))
    except (re.error, OverflowError, RecursionError):  # an alternative that needs the others
        return lambda text: keep.search(text) is not None

    def guard(text: str) -> bool:
        for pattern, lits in guarded:
            if lits:  # a plain loop: a generator per alternative cost more than the checks
                for lit in lits:
                    if lit in text:
                        break
                else:
                    continue
            if pattern.search(text) is not None:
                return True
        return False

    return guard
