"""Configuration: defaults, then a TOML file, then flags; every value checked on the way.

The key table is watchdog/configkeys.py and the checks across keys watchdog/configcheck.py;
both are re-exported here, so `from watchdog.config import Config` keeps working. An unknown
key or a bad value is a `ConfigError` naming the key (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from watchdog.configcheck import cross_check
from watchdog.configkeys import ALIASES, KEYS, Config, ConfigError
from watchdog.core.knowledge.tomlcheck import SignatureError, read_toml, read_toml_text

__all__ = ["ALIASES", "KEYS", "Config", "ConfigError", "build_config", "load_config"]

MAX_NUMBER = 1e9  # seconds: about 31 years; larger values overflow time_t and deque sizes
COMMAND_LINE = "command line"


def load_config(
    path: str | Path | None,
    overrides: Mapping[str, Any] | None = None,
    *,
    notes: list[str] | None = None,
) -> Config:
    """Defaults, then the TOML file, then flag overrides (None means 'not given').

    An old key name in either is read as its new name and one deprecation line per old name
    is appended to `notes`, for the caller to log once its logging is set up."""
    values: dict[str, Any] = _read_toml(Path(path)) if path is not None else {}
    base = build_config(values, origin=str(path) if path else "config", notes=notes)
    given = {
        k: v
        for k, v in (overrides or {}).items()
        if v is not None and v != [] and (k in KEYS or k in ALIASES)
    }
    flags = resolve_aliases(given, COMMAND_LINE, notes)
    if not flags:
        return base
    merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(Config)}
    try:
        for key, value in flags.items():  # a bad flag value is blamed on the command line
            merged[key] = _coerce(key, value, COMMAND_LINE)
        return build_config(merged, origin=COMMAND_LINE)
    except ConfigError as exc:
        raise _blame_old_names(exc, given, COMMAND_LINE) from exc


def build_config(
    values: Mapping[str, Any], origin: str = "config", *, notes: list[str] | None = None
) -> Config:
    """Validate a mapping of keys (old names included) into a Config."""
    given, values = values, resolve_aliases(values, origin, notes)
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key {unknown[0]!r}; run `hang-watchdog run --help` for the keys"
        )
    cfg = Config()
    try:
        for key, value in values.items():
            setattr(cfg, key, _coerce(key, value, origin))
        cross_check(cfg, origin)
    except ConfigError as exc:
        raise _blame_old_names(exc, given, origin) from exc
    return cfg


def resolve_aliases(
    values: Mapping[str, Any], origin: str, notes: list[str] | None = None
) -> dict[str, Any]:
    """Old key names read as their new ones; both given with different values is an error."""
    out = dict(values)
    for old, new in ALIASES.items():
        if old not in out:
            continue
        value = out.pop(old)
        old_s, new_s = _spell(old, origin), _spell(new, origin)
        if new in out and out[new] != value:
            raise ConfigError(
                f"{origin}: {old_s} (the old name of {new_s}) is {value!r} but {new_s} is "
                f"{out[new]!r}; give only {new_s}"
            )
        out[new] = value
        if notes is not None:
            notes.append(
                f"{origin}: {old_s} is deprecated and kept for one release; use {new_s} instead"
            )
    return out


def _blame_old_names(exc: ConfigError, given: Mapping[str, Any], origin: str) -> ConfigError:
    """An error about a key the operator gave by its old name says which name they wrote."""
    for old, new in ALIASES.items():
        if old in given and new not in given and f"key {new!r}" in str(exc):
            return ConfigError(f"{exc} (given as {_spell(old, origin)}, its old name)")
    return exc


def _spell(key: str, origin: str) -> str:
    """A key as the operator wrote it: `--server-url` on the command line, 'server_url' in files."""
    return "--" + key.replace("_", "-") if origin == COMMAND_LINE else repr(key)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return read_toml(read_toml_text(path, "config file"), str(path), "a config file")
    except SignatureError as exc:  # the file's size, encoding, key depth or syntax
        raise ConfigError(str(exc)) from exc


def _coerce(key: str, value: Any, origin: str) -> Any:
    f = KEYS[key]
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    kind = f.type if isinstance(f.type, str) else str(f.type)
    if value is None and "None" in kind:
        return None
    bad = ConfigError(
        f"{origin}: key {key!r}: expected {kind.replace(' | None', '')}, got {value!r}"
    )
    value = _typed(kind, value, default, bad, f"{origin}: key {key!r}")
    lo, choices = f.metadata.get("lo"), f.metadata.get("choices")
    if lo is not None and value < lo:
        raise ConfigError(f"{origin}: key {key!r}: must be >= {lo}, got {value!r}")
    if choices and value not in choices:
        raise ConfigError(
            f"{origin}: key {key!r}: must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


def _typed(kind: str, value: Any, default: Any, bad: ConfigError, where: str) -> Any:
    """`value` as the key's type (`kind`, the field's annotation), or `bad` raised."""
    if "bool" in kind:
        ok = isinstance(value, bool)
    elif "int" in kind and "float" not in kind:
        return _int(value, bad, where)
    elif "float" in kind:
        return _float(value, bad, where)
    elif "list" in kind:
        if isinstance(value, str) and isinstance(default, list):
            value = [value]
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif "dict" in kind:
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    else:
        ok = isinstance(value, str)
    if not ok:
        raise bad
    return value


def _int(value: Any, bad: ConfigError, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad
    if abs(value) > MAX_NUMBER:  # OverflowError later, in a sleep or a C call
        raise ConfigError(f"{where}: must be a number up to {MAX_NUMBER:g}, got {value!r}")
    return value


def _float(value: Any, bad: ConfigError, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    # NaN compares false with every bound and passes them; a huge value overflows sleeps
    # and buffer sizes later, so both are refused here.
    if not math.isfinite(number) or abs(number) > MAX_NUMBER:
        raise ConfigError(f"{where}: must be a finite number up to {MAX_NUMBER:g}, got {number!r}")
    return number
