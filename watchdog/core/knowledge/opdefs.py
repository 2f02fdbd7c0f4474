"""The operation table's schema and loader: how the log shows each kind of long operation
starting, finishing and progressing, and the lease it holds (data: openops.toml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.core.knowledge.tomlcheck import read_toml


@dataclass(frozen=True)
class OpDef:
    """How the log shows one kind of operation starting and finishing."""

    id: str
    what: str
    start: re.Pattern[str]
    end: re.Pattern[str]
    fail: re.Pattern[str] | None
    signature: str
    note: str
    behind_signature: str = ""
    # The lease (core/state/leases.py): how long the operation normally takes at most (`bound_s`),
    # the longest it may go without progress of its own (`quiet_s`), its own progress lines,
    # the other signs of progress it shows ("compilers", "socket_bytes") and the benign state
    # it holds while it progresses. No `quiet_s`: it holds no lease.
    bound_s: float | None = None
    quiet_s: float | None = None
    progress: re.Pattern[str] | None = None
    signals: tuple[str, ...] = ()
    state: str = "compiling"
    min_bytes_per_s: float = 0.0  # socket bytes slower than this are no progress
    startup: bool = False  # a step of the startup: the ready milestone ends it
    # It logs nothing between its start and its end (a weight transfer): its start line holds
    # the lease for its quiet bound.
    start_holds: bool = False


def load_ops(text: str | None = None) -> tuple[OpDef, ...]:
    """The shipped operation table (or `text` in the same format), read now on every call (the
    knowledge bundle calls it once); ValueError if malformed."""
    if text is None:
        text = Path(__file__).parent.joinpath("openops.toml").read_text(encoding="utf-8")
    doc = read_toml(text, "openops.toml", "an operation table")  # SignatureError: a ValueError
    out = []
    for i, e in enumerate(doc.get("op", [])):
        try:
            out.append(
                OpDef(
                    id=str(e["id"]),
                    what=str(e.get("what") or e["id"]),
                    start=re.compile(e["start"]),
                    end=re.compile(e["end"]),
                    fail=re.compile(e["fail"]) if e.get("fail") else None,
                    signature=str(e.get("signature") or ""),
                    note=str(e.get("note") or ""),
                    behind_signature=str(e.get("behind_signature") or ""),
                    **_lease_fields(e),
                )
            )
        except (KeyError, TypeError, re.error) as exc:
            raise ValueError(f"openops.toml: op[{i}]: {exc}") from exc
    return tuple(out)


SIGNALS = frozenset({"compilers", "socket_bytes"})
LEASE_STATES = frozenset({"loading", "compiling"})


def _lease_fields(e: dict[str, Any]) -> dict[str, Any]:
    """The lease keys of one op entry, checked; TypeError names the bad one."""
    out: dict[str, Any] = {}
    for key in ("bound_s", "quiet_s", "min_bytes_per_s"):
        v = e.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise TypeError(f"key {key!r}: must be a positive number of seconds, got {v!r}")
            out[key] = float(v)
    if e.get("progress"):
        out["progress"] = re.compile(str(e["progress"]))
    signals = e.get("signals") or []
    if not isinstance(signals, list) or not set(map(str, signals)) <= SIGNALS:
        raise TypeError(f"key 'signals': must be a list of {sorted(SIGNALS)}, got {signals!r}")
    out["signals"] = tuple(str(x) for x in signals)
    for key in ("startup", "start_holds"):
        flag = e.get(key, False)
        if not isinstance(flag, bool):
            raise TypeError(f"key {key!r}: must be true or false, got {flag!r}")
        out[key] = flag
    state = str(e.get("state") or "compiling")
    if state not in LEASE_STATES:
        raise TypeError(f"key 'state': must be one of {sorted(LEASE_STATES)}, got {state!r}")
    out["state"] = state
    return out
