"""Typed access to parsed TOML tables, with errors that name the file, the entry and the key."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:  # re._parser is the stdlib's own regex parser (sre_parse before 3.11)
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - 3.10
    import sre_parse as _sre

# The one TOML parser import: pyproject allows Python 3.10, whose stdlib has no tomllib.
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# Bounds on an operator's TOML, checked before tomllib sees it: tomllib's time grows with the
# square of the dotted key parts (100 000 dotted headers took 18 s), and nothing an operator
# writes by hand comes near these. The shipped signatures.toml is about 50 KB, 4 levels deep.
MAX_FILE_BYTES = 1 << 20
MAX_KEY_DEPTH = 32  # parts of one dotted key or table header
MAX_KEY_PARTS = 20_000  # dotted key parts in the whole file
MAX_REGEX_CHARS = 4096


class SignatureError(ValueError):
    """A signature file is invalid; the message names file, entry and key."""


def check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SignatureError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def entry_id(e: Any, where: str) -> str:
    """The snake_case `id` of an array-of-tables entry; SignatureError naming `where` else."""
    if not isinstance(e, dict):
        raise SignatureError(f"{where}: must be a table")
    eid = e.get("id")
    if not isinstance(eid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", eid):
        raise SignatureError(f"{where}: key 'id': must be a snake_case string, got {eid!r}")
    return eid


def get(table: Mapping[str, Any], key: str, tp: Any, where: str, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    accepts_bool = tp is bool or (isinstance(tp, tuple) and bool in tp)
    if (isinstance(value, bool) and not accepts_bool) or not isinstance(value, tp):
        name = tp.__name__ if isinstance(tp, type) else "number"
        raise SignatureError(f"{where}: key '{key}': expected {name}, got {value!r}")
    return finite(value, key, where)


def finite(value: Any, key: str, where: str) -> Any:
    """`value`, unless it is a NaN or infinite float (TOML allows both; NaN passes every bound)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SignatureError(f"{where}: key '{key}': must be a finite number, got {value!r}")
    return value


def strs(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SignatureError(f"{where}: key '{key}': expected a list of strings, got {value!r}")
    return value


def str_map(table: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SignatureError(f"{where}: key '{key}': expected a table of strings, got {value!r}")
    return dict(value)


def array(table: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise SignatureError(f"{where}: key '{key}': expected an array of tables")
    return value


def table(table: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise SignatureError(f"{where}: key '{key}': expected a table")
    return value


def regex(p: Any, where: str) -> re.Pattern[str]:
    """`p` compiled; SignatureError for a regex that is invalid, too long, or whose shape can
    backtrack exponentially (a nested quantifier: one 41-character line froze `(a+)+$`)."""
    if not isinstance(p, str):
        raise SignatureError(f"{where}: expected a regex string, got {p!r}")
    if len(p) > MAX_REGEX_CHARS:
        raise SignatureError(
            f"{where}: regex of {len(p)} characters, over the limit of {MAX_REGEX_CHARS}"
        )
    try:
        compiled = re.compile(p)
        parsed = list(_sre.parse(p))
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}: OverflowError
        raise SignatureError(f"{where}: invalid regex {p[:200]!r}: {exc}") from exc
    if _nested_quantifier(parsed):
        raise SignatureError(
            f"{where}: regex {p[:200]!r} repeats a group that itself holds a repeat (like "
            "'(a+)+'): on a line that almost matches it backtracks for minutes and stops the "
            "watchdog. Make the inner repeat possessive ('a++', '\\d*+') or atomic "
            "('(?>a+)'), or write the pattern without the outer repeat"
        )
    return compiled


_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)  # a possessive repeat never backtracks


def _children(op: object, av: Any) -> Iterable[list[Any]]:
    """The sub-sequences of one parsed item that can backtrack (atomic groups cannot)."""
    if op in _REPEATS:
        yield list(av[2])
    elif op is _sre.SUBPATTERN:
        yield list(av[-1])
    elif op is _sre.BRANCH:
        yield from (list(alt) for alt in av[1])
    elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
        yield list(av[1])
    elif op is _sre.GROUPREF_EXISTS:
        yield from (list(x) for x in av[1:] if x is not None)


def _has_repeat(items: list[Any]) -> bool:
    for op, av in items:
        if op in _REPEATS and av[1] > 1:
            return True
        if any(_has_repeat(sub) for sub in _children(op, av)):
            return True
    return False


def _nested_quantifier(items: list[Any]) -> bool:
    """Is there a repeat (more than once) of something that holds another such repeat?"""
    for op, av in items:
        if op in _REPEATS and av[1] > 1 and _has_repeat(list(av[2])):
            return True
        if op is getattr(_sre, "ATOMIC_GROUP", None):
            if _nested_quantifier(list(av)):
                return True
        elif any(_nested_quantifier(sub) for sub in _children(op, av)):
            return True
    return False


def read_toml_text(path: Path, what: str) -> str:
    """An operator's TOML file as text, within MAX_FILE_BYTES and valid UTF-8; SignatureError
    names the file, the line and the key otherwise (`what`: "signature file", ...)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
            size = len(data) if len(data) <= MAX_FILE_BYTES else max(len(data), _size(fh))
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    if size > MAX_FILE_BYTES:
        cut = data.rfind(b"\n", 0, MAX_FILE_BYTES)
        line = data.count(b"\n", 0, cut + 1) + 1
        raise SignatureError(
            f"{path}: {size} bytes, over the limit of {MAX_FILE_BYTES >> 20} MiB for a {what} "
            f"(line {line}{_key_of(data, cut + 1)} is where it passes the limit)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        raise SignatureError(
            f"{path}: line {line}{_key_of(data, start)}: not UTF-8 text (byte "
            f"{data[exc.start]:#04x} at offset {exc.start}); save the {what} as UTF-8"
        ) from exc


def _size(fh: Any) -> int:
    return os.fstat(fh.fileno()).st_size


def _key_of(data: bytes, start: int) -> str:
    """`, key 'NAME'` for the `NAME = ...` line starting at `start`, or `` when it is none."""
    head = data[start : start + 200].split(b"\n", 1)[0]
    key, eq, _ = head.partition(b"=")
    name = key.strip().decode("utf-8", "replace")
    return f", key {name!r}" if eq and name and len(name) <= 100 else ""


def check_bounds(text: str, origin: str) -> None:
    """SignatureError, at once, for TOML whose dotted keys would take tomllib minutes: a key
    or header deeper than MAX_KEY_DEPTH, or more than MAX_KEY_PARTS dotted parts in all."""
    if len(text) > MAX_FILE_BYTES:
        raise SignatureError(f"{origin}: {len(text)} characters, over the limit of 1 MiB")
    total = 0
    in_string = False  # inside a multi-line string (its lines are not keys)
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip()
        quotes = line.count('"""') + line.count("'''")
        was_in, in_string = in_string, in_string != (quotes % 2 == 1)
        if was_in or not line or line[0] == "#":
            continue
        if line[0] == "[":
            key = line.lstrip("[").split("]", 1)[0]
        elif "=" in line:
            key = line.split("=", 1)[0]
        else:
            continue
        parts = key.count(".") + 1
        if parts > MAX_KEY_DEPTH:
            raise SignatureError(
                f"{origin}: line {n}: key {key.strip()[:60]!r}... has {parts} dotted parts, "
                f"over the limit of {MAX_KEY_DEPTH}"
            )
        total += parts
        if total > MAX_KEY_PARTS:
            raise SignatureError(
                f"{origin}: line {n}: more than {MAX_KEY_PARTS} dotted key parts in the file; "
                "no signature, engine or config file needs that many"
            )


def read_toml(text: str, origin: str, what: str = "a signature file") -> dict[str, Any]:
    """`text` parsed as TOML within the bounds above; SignatureError naming `origin` else.

    Every TOML the watchdog reads, shipped or the operator's, goes through here."""
    check_bounds(text, origin)
    try:
        doc: dict[str, Any] = tomllib.loads(text)
        return doc
    except tomllib.TOMLDecodeError as exc:
        raise SignatureError(f"{origin}: not valid TOML: {exc}") from exc
    except RecursionError as exc:  # `x = [[[[...` past the parser's depth limit
        raise SignatureError(f"{origin}: TOML nested too deeply to be {what}") from exc
