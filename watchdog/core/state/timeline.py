"""Observation timelines as JSON Lines, so a recorded window can be replayed through classify().

One `Observation` per line, encoded with `watchdog.core.model.to_dict`. Strings are redacted
on the way out by default (log lines and command lines can carry tokens); classification does
not depend on secret values, so a redacted timeline replays to the same verdict.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from watchdog.core.model import Observation, from_dict, to_dict
from watchdog.core.redact import redact_tree


def write_timeline(
    path: Path,
    observations: Iterable[Observation],
    *,
    redact: Callable[[Any], Any] | None = redact_tree,
) -> None:
    """Write `observations` to `path`, one JSON object per line (redacted unless redact=None)."""
    with open(path, "w", encoding="utf-8") as f:
        for obs in observations:
            data = to_dict(obs)
            if redact is not None:
                data = redact(data)
            f.write(json.dumps(data, separators=(",", ":"), default=str))
            f.write("\n")


def read_timeline(path: Path) -> list[Observation]:
    """Read a timeline written by write_timeline; ValueError naming the bad line otherwise."""
    return parse_timeline(path.read_bytes(), str(path))


def parse_timeline(data: bytes, name: str) -> list[Observation]:
    """Decode a timeline already read (a file's bytes, or stdin's); errors start with `name`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not a text file ({e}); expected a JSON Lines timeline") from e
    lines = text.split("\n")
    return [_decode_line(name, n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _decode_line(path: str, n: int, line: str) -> Observation:
    hint = "expected one Observation object per line, as written by write_timeline"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}); {hint}") from e
    except RecursionError as e:
        raise ValueError(f"{path}:{n}: JSON nested too deeply; {hint}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}:{n}: a JSON {type(data).__name__}, not an object; {hint}")
    missing = [k for k in ("t", "wall") if k not in data]
    if missing:
        raise ValueError(f"{path}:{n}: missing {', '.join(missing)}; {hint}")
    for key in ("t", "wall"):
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise ValueError(f"{path}:{n}: {key!r} must be a number of seconds, got {value!r}")
    try:
        return from_dict(Observation, data)
    except (TypeError, KeyError, ValueError, AttributeError, OverflowError, RecursionError) as e:
        raise ValueError(f"{path}:{n}: not an Observation ({e}); {hint}") from e


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value) and abs(value) < 1e12
    except OverflowError:  # an integer too large for a float
        return False
