"""Remediation state that must survive a watchdog restart: restart times, exhaustion, and the
active fallback. Written atomically (tmp + fsync + rename) so a crash never leaves half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "remediation.json"
SCHEMA = 1
HISTORY_KEPT = 20


class StateError(ValueError):
    """The state file exists but cannot be used; the message says what to do."""


@dataclass
class RemediationState:
    """Counters and the active fallback; `restarts` holds Unix times (they outlive the process)."""

    restarts: list[float] = field(default_factory=list)
    exhausted: bool = False
    exhausted_reason: str = ""
    active: dict[str, Any] | None = None  # {"fallbacks": [...], "args": [...], "env": {...}}
    history: list[dict[str, Any]] = field(default_factory=list)
    fallback_file: str | None = None  # the file the server reads; kept across `fallback clear`

    def recent(self, now: float, window_s: float) -> list[float]:
        """Restart times within the last `window_s` seconds."""
        return [t for t in self.restarts if now - t < window_s]

    def record(self, entry: dict[str, Any]) -> None:
        self.history = (self.history + [entry])[-HISTORY_KEPT:]


class StateStore:
    """Loads and saves one RemediationState under a directory."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def stamp(self) -> int | None:
        """The file's modification time in ns (None when absent): `fallback clear` may
        rewrite it while the watchdog runs."""
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def load(self) -> RemediationState:
        """The saved state, or a fresh one when there is no file yet."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return RemediationState()
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise StateError(
                f"{self.path} is not valid JSON ({exc}); fix or delete it "
                "(`hang-watchdog fallback clear` writes a fresh one)"
            ) from exc
        if not isinstance(doc, dict):
            raise StateError(f"{self.path}: expected a JSON object; delete it to start afresh")
        try:
            return self._state(doc)
        except (TypeError, ValueError) as exc:
            raise StateError(
                f"{self.path}: a field has the wrong type ({exc}); fix or delete it "
                "(`hang-watchdog fallback clear` writes a fresh one)"
            ) from exc

    @staticmethod
    def _state(doc: dict[str, Any]) -> RemediationState:
        return RemediationState(
            restarts=[float(t) for t in doc.get("restarts") or []],
            exhausted=bool(doc.get("exhausted", False)),
            exhausted_reason=str(doc.get("exhausted_reason") or ""),
            active=doc.get("active") or None,
            history=list(doc.get("history") or []),
            fallback_file=str(doc["fallback_file"]) if doc.get("fallback_file") else None,
        )

    def check_writable(self) -> None:
        """Create the directory and write a probe file; OSError when that fails."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=self.dir)
        os.close(fd)
        os.unlink(probe)

    def save(self, state: RemediationState) -> None:
        """Write atomically: a temporary file in the same directory, fsync, rename, fsync dir."""
        self.dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"schema": SCHEMA, **asdict(state)}, indent=2, sort_keys=True)
        atomic_write(self.path, data + "\n")


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` so readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not allow opening a directory; the rename is done
    try:
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
