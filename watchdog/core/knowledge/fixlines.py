"""Checks a fix line against the published record: every command it runs exists, every flag is
one that command reads (in the engine version at hand), every `pip install` names a release that
was published.

A line is a command (`vllm serve MODEL ... --enforce-eager   # why`), or prose whose commands
are in backticks, or prose that names a recorded command ("or serve with CUDA graphs off: vllm
serve ... --enforce-eager"); prose that names none runs nothing and is not checked. Placeholders
a person fills in (MODEL, PID, `...`) are left alone; a placeholder version is not: pip cannot
install it as written.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from watchdog.core.knowledge.published import Program, Published, public, version_key

_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?(?:(==|>=|<=|~=|!=|<|>)(.*))?$")
_VERSION = re.compile(r"^\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\+[A-Za-z0-9.]+)?$")
_PIP_VALUE_OPTIONS = frozenset({"--extra-index-url", "--index-url", "-i", "-c", "-r", "--target"})
_INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i")


def _words(text: str) -> list[str]:
    """The words of a command less its leading VAR=value assignments and `sudo`."""
    words = text.split()
    while words and (_ENV.match(words[0]) or words[0] == "sudo"):
        words = words[1:]
    return words


def _segments(command: str) -> list[list[str]]:
    """The command's words, one list per part of a pipe or a `;`/`&&` list."""
    try:
        words = shlex.split(command, posix=True)
    except ValueError:  # an apostrophe in prose ("the server's environment")
        words = [w.strip("'\"") for w in command.split()]
    out: list[list[str]] = [[]]
    for w in words:
        if w in ("|", ";", "&&", "||"):
            out.append([])
        elif w.endswith(";") and len(w) > 1:
            out[-1].append(w[:-1])
            out.append([])
        else:
            out[-1].append(w)
    return [s for s in out if s]


class FixChecker:
    """Checks lines against one `Published` record; `versions` are the server's, when known."""

    def __init__(self, published: Published, versions: Mapping[str, str | None] | None = None):
        self.pub = published
        self.versions = dict(versions or {})
        # Longest first, so "python -m flashinfer download-cubin" wins over "python -c".
        self._programs = sorted(published.programs, key=lambda p: -len(p.words))
        # The first words a command can start with ("vllm", "pip", "flashinfer", "nvidia-smi").
        self._heads = {p.words[0] for p in published.programs} | {
            t.split()[0] for t in published.host_tools
        }

    def commands_in(self, line: str) -> list[str]:
        """The commands a fix line runs: its backticked spans; else the line itself when it
        starts like a command; else, in prose, from the first recorded command it names to
        the end ("or serve with CUDA graphs off: vllm serve ... --enforce-eager")."""
        spans = re.findall(r"`([^`]+)`", line)
        if spans:  # in prose, backticks also quote frames and flags: a command starts with one
            return [c for c in spans if (w := _words(c)) and w[0] in self._heads]
        text = line.split("   ", 1)[0].split(" # ", 1)[0].strip()  # a comment follows 3 spaces
        words = _words(text)
        if not words:
            return []
        if words[0] in self._heads:
            return [text]
        starts = [
            m.start()
            for p in self._programs
            if (m := re.search(rf"(?<![\w-]){re.escape(p.name)}(?![\w-])", text))
        ]
        return [text[min(starts) :]] if starts else []

    def check(self, line: str, context: Sequence[str] = ()) -> list[str]:
        """Problems of one line; `context` is the list it is printed in (where an older
        release's spelling of a flag may be given on another line)."""
        problems: list[str] = []
        for command in self.commands_in(line):
            for words in _segments(command):
                problems += self._segment(words, line, context)
        return problems

    def check_all(self, lines: Iterable[str]) -> dict[str, list[str]]:
        group = list(lines)
        return {ln: p for ln in group if (p := self.check(ln, group))}

    def _segment(self, words: list[str], line: str, context: Sequence[str]) -> list[str]:
        while words and (_ENV.match(words[0]) or words[0] == "sudo"):
            words = words[1:]
        if not words or not re.match(r"^[a-z]", words[0]):
            return []  # prose, a flag alone, or a placeholder: nothing that runs
        prog = self._program(words)
        if prog is None:
            tool = self._host_tool(words)
            return [] if tool else [f"`{' '.join(words[:3])}`: not a recorded command"]
        problems = self._since(prog)
        if prog.name == "pip install":
            return problems + self._pip(words[2:], line)
        rest = words[len(prog.words) :]
        for w in rest:
            if w == "--":  # the end of its options (`hang-watchdog run ... -- SERVER_COMMAND`)
                break
            if not w.startswith("--"):
                continue
            flag = w.split("=", 1)[0]
            if flag not in prog.flags:
                problems.append(
                    f"`{prog.name}` does not read {flag} (flags recorded: {prog.checked})"
                )
                continue
            problems += self._flag_since(prog, flag, line, context)
        return problems

    def _program(self, words: list[str]) -> Program | None:
        for p in self._programs:
            if tuple(words[: len(p.words)]) == p.words:
                return p
        return None

    def _host_tool(self, words: list[str]) -> bool:
        for tool in self.pub.host_tools:
            parts = tuple(tool.split())
            if tuple(words[: len(parts)]) == parts:
                return True
        return False

    def _since(self, prog: Program) -> list[str]:
        have = self.versions.get(prog.package) if prog.package else None
        if prog.since and have and version_key(have) < version_key(prog.since):
            return [f"`{prog.name}` needs {prog.package} >= {prog.since}; the server has {have}"]
        return []

    def _flag_since(self, prog: Program, flag: str, line: str, context: Sequence[str]) -> list[str]:
        since = prog.flag_since.get(flag)
        if not since:
            return []
        have = self.versions.get(prog.package)
        if have:
            if version_key(have) < version_key(since):
                return [f"{flag} is read from {prog.package} {since} on; the server has {have}"]
            return []
        legacy = prog.legacy.get(flag)
        if f">= {since}" in line or (legacy and any(legacy in c for c in (line, *context))):
            return []
        spelled = f" or give the older spelling {legacy}" if legacy else ""
        return [f"{flag} is read from {prog.package} {since} on: say so ('>= {since}'){spelled}"]

    def _pip(self, words: list[str], line: str) -> list[str]:
        problems: list[str] = []
        index = any(w.split("=", 1)[0] in _INDEX_OPTIONS for w in words)
        skip = False
        for w in words:
            if skip:
                skip = False
                continue
            if w.startswith("-"):
                skip = w in _PIP_VALUE_OPTIONS
                continue
            m = _REQ.match(w)
            if m is None:
                problems.append(f"pip install {w!r}: not a requirement pip reads")
                continue
            name, op, version = m.group(1), m.group(2), (m.group(3) or "").strip()
            pkg = self.pub.package(name)
            if pkg is None:
                if op:
                    problems.append(f"{name}: not in the published record ({self.pub.recorded})")
                    continue
                break  # a bare word that is no recorded package: the prose goes on from here
            if pkg.index and not index:
                problems.append(f"{name} is not on PyPI: the line must name its index {pkg.index}")
            if not op or not pkg.versions:
                continue
            if not _VERSION.match(version):
                problems.append(
                    f"{name}{op}{version}: a placeholder, not a version pip can install"
                )
            elif not _satisfied(op, version, pkg.versions):
                newest = pkg.newest
                problems.append(
                    f"{name}{op}{version}: no such release was published (newest {newest}, "
                    f"recorded {self.pub.recorded})"
                )
        return problems


def _satisfied(op: str, version: str, published: Iterable[str]) -> bool:
    want = version_key(public(version))
    keys = [version_key(v) for v in published]
    if op == "==":
        return want in keys
    if op in (">=", "~="):
        return any(k >= want for k in keys)
    if op == ">":
        return any(k > want for k in keys)
    if op == "<=":
        return any(k <= want for k in keys)
    if op == "<":
        return any(k < want for k in keys)
    return any(k != want for k in keys)
