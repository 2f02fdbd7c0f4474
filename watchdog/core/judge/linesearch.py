"""Which of many log lines a regex matches, found without a regex call per line (pure).

A replayed log carries tens of thousands of events, and each signature's log rule was searched in
every event's line. Every match holds one of the rule's required literals
(core/knowledge/literals.py), so the lines are joined once and `str.find` finds the lines holding
one; only those are searched, each alone, with the rule itself. A rule without a literal
(case-insensitive, `\\d+`) is searched on the joined text from line to line: a search from the start
of a line finds the first line at or after it that can match, and each found line is checked alone.
That holds for a regex whose assertions cannot fail at a newline where they pass at the end of a
lone line (`^` and `$` compiled MULTILINE); one with a negative lookaround, an atomic group, a
possessive quantifier or \\A / \\Z is searched line by line.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence

from watchdog.core.knowledge.literals import required_literals

# Constructs that can fail at a newline where they would succeed at the end of a lone line
# (spelled conservatively: an escaped `*+` also sends a pattern down the line-by-line path).
_UNSAFE = ("(?!", "(?<!", "(?>", "*+", "++", "?+", "}+", "\\A", "\\Z")


class LineIndex:
    """A fixed list of lines, searched joined."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        self._joined = "\n".join(self.lines)
        self._starts: list[int] = []
        at = 0
        for line in self.lines:
            self._starts.append(at)
            at += len(line) + 1
        self._plain = not any("\n" in line for line in self.lines)

    def matching(self, pattern: re.Pattern[str]) -> list[str]:
        """The lines `pattern.search` matches, in order (with repeats), as a loop would."""
        if not self._plain:
            return [line for line in self.lines if pattern.search(line)]
        lits = required_literals(pattern)
        at: Iterable[int]
        if lits:
            at = self._holding(lits)
        elif any(u in pattern.pattern for u in _UNSAFE):
            at = range(len(self.lines))
        else:
            at = self._reached(re.compile(pattern.pattern, pattern.flags | re.MULTILINE))
        return [self.lines[k] for k in at if pattern.search(self.lines[k])]

    def _line_of(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset) - 1

    def _holding(self, lits: tuple[str, ...]) -> list[int]:
        """The lines holding one of `lits` (none holds a newline), in order."""
        found: set[int] = set()
        for lit in lits:
            i = self._joined.find(lit)
            while i >= 0:
                k = self._line_of(i)
                found.add(k)
                if k + 1 >= len(self.lines):
                    break
                i = self._joined.find(lit, self._starts[k + 1])
        return sorted(found)

    def _reached(self, joined: re.Pattern[str]) -> Iterable[int]:
        """The lines where a search of the joined text, restarted at each next line, lands."""
        pos, n = 0, len(self.lines)
        while n:
            m = joined.search(self._joined, pos)
            if m is None:
                return
            k = self._line_of(m.start())
            yield k
            if k + 1 >= n:
                return
            pos = self._starts[k + 1]
