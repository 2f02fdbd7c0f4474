"""Typed access to parsed TOML tables, with errors that name the file, the entry and the key."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any


class SignatureError(ValueError):
    """A signature file is invalid; the message names file, entry and key."""


def check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SignatureError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


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
    if not isinstance(p, str):
        raise SignatureError(f"{where}: expected a regex string, got {p!r}")
    try:
        return re.compile(p)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}: OverflowError
        raise SignatureError(f"{where}: invalid regex {p[:200]!r}: {exc}") from exc
