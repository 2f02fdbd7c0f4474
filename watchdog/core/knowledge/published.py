"""What the package registry publishes (a dated record, `published.toml`) and the commands and
flags our fix lines may name: data that lets a fix be checked before anyone runs it.

A fix that says `pip install "flashinfer-cubin==0.7.2.post1"` fails on the operator's host when
no such release exists (PyPI's newest flashinfer-cubin was 0.6.13 when flashinfer-python was at
0.7.2.post1), so the lists are kept as data and read by preflight and by the fix-line checker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.core.knowledge.tomlcheck import (
    SignatureError,
    array,
    check_keys,
    get,
    read_toml,
    str_map,
    strs,
)

SHIPPED = "published.toml"


def version_key(text: str) -> tuple[tuple[int, ...], int, int]:
    """A sortable key for a PEP 440 release as PyPI lists them: (release, pre, post).

    "0.7.2.post1" > "0.7.2" > "0.7.2rc1"; a local part ("+cu130") is ignored. An unparsable
    version sorts first."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.?post(\d+))?", text.strip())
    if not m:
        return ((), -1, -1)
    release = tuple(int(p) for p in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = -1 if m.group(2) else 0  # a pre-release sorts before its release
    post = int(m.group(4)) if m.group(4) else -1
    return (release, pre, post)


def public(version: str) -> str:
    """ "0.6.16+cu130" -> "0.6.16": wheels from FlashInfer's index carry a CUDA local part."""
    return version.split("+", 1)[0].strip()


@dataclass(frozen=True)
class Package:
    """One distribution and the versions the registry had on the recorded day."""

    name: str
    versions: tuple[str, ...]  # newest first, as `pip index versions` lists them
    index: str = ""  # not on PyPI: the index that serves it (a pip line must name it)

    @property
    def newest(self) -> str | None:
        return max(self.versions, key=version_key) if self.versions else None

    def has(self, version: str) -> bool:
        want = version_key(public(version))
        return any(version_key(v) == want for v in self.versions)


@dataclass(frozen=True)
class Program:
    """A command a fix line may run, and the options our lines pass to it."""

    name: (
        str  # its words as a line spells them: "vllm serve", "python -m flashinfer download-cubin"
    )
    package: str = ""  # whose version decides what it reads; "" for our own or pip
    since: str = ""  # the package's first release with the command
    flags: tuple[str, ...] = ()
    flag_since: dict[str, str] = field(default_factory=dict)
    legacy: dict[str, str] = field(default_factory=dict)  # flag -> how older releases spell it
    checked: str = ""

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.name.split())


@dataclass(frozen=True)
class Published:
    """The dated record; empty (nothing known, nothing checked) when not loaded."""

    recorded: str = ""
    source: str = ""
    packages: dict[str, Package] = field(default_factory=dict)
    programs: tuple[Program, ...] = ()
    host_tools: tuple[str, ...] = ()

    def package(self, name: str) -> Package | None:
        return self.packages.get(name.lower().replace("_", "-"))

    def has(self, name: str, version: str) -> bool | None:
        """Was `name` `version` published? None when the package is not recorded (or not on
        the recorded registry at all, like flashinfer-jit-cache)."""
        pkg = self.package(name)
        if pkg is None or not pkg.versions:
            return None
        return pkg.has(version)


def load_published(text: str | None = None, origin: str = SHIPPED) -> Published:
    """The shipped record (or `text`); SignatureError naming the file and key when invalid."""
    if text is None:
        text = Path(__file__).parent.joinpath(SHIPPED).read_text("utf-8")
    doc = read_toml(text, origin, "a published-versions file")
    check_keys(doc, {"schema", "recorded", "source", "host_tools", "package", "program"}, origin)
    packages: dict[str, Package] = {}
    for i, e in enumerate(array(doc, "package", origin)):
        where = f"{origin}: package[{i}]"
        if not isinstance(e, dict):
            raise SignatureError(f"{where}: must be a table")
        check_keys(e, {"name", "versions", "index"}, where)
        name = get(e, "name", str, where, "")
        if not name:
            raise SignatureError(f"{where}: key 'name': required")
        packages[name.lower()] = Package(
            name, tuple(strs(e, "versions", where)), get(e, "index", str, where, "")
        )
    return Published(
        recorded=get(doc, "recorded", str, origin, ""),
        source=get(doc, "source", str, origin, ""),
        packages=packages,
        programs=tuple(_program(e, f"{origin}: program[{i}]") for i, e in _items(doc, origin)),
        host_tools=tuple(strs(doc, "host_tools", origin)),
    )


def _items(doc: dict[str, Any], origin: str) -> list[tuple[int, Any]]:
    return list(enumerate(array(doc, "program", origin)))


def _program(e: Any, where: str) -> Program:
    if not isinstance(e, dict):
        raise SignatureError(f"{where}: must be a table")
    keys = {"name", "package", "since", "flags", "flag_since", "legacy", "checked"}
    check_keys(e, keys, where)
    name = get(e, "name", str, where, "")
    if not name:
        raise SignatureError(f"{where}: key 'name': required")
    flags = tuple(strs(e, "flags", where))
    since = str_map(e, "flag_since", where)
    unknown = sorted(set(since) - set(flags))
    if unknown:
        raise SignatureError(f"{where}: key 'flag_since': {unknown} not in 'flags'")
    return Program(
        name=name,
        package=get(e, "package", str, where, ""),
        since=get(e, "since", str, where, ""),
        flags=flags,
        flag_since=since,
        legacy=str_map(e, "legacy", where),
        checked=get(e, "checked", str, where, ""),
    )
