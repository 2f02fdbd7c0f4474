"""What the remediation hook needs from the rest of the watchdog, as small protocols: the
episode's evidence (daemon/episodes.py EpisodeHook) and the metrics (outputs/export.py
MetricsSink). The wiring passes them in; remediation imports neither package.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any, Protocol


class Evidence(Protocol):
    """The current episode's evidence on disk."""

    def evidence_key(self) -> Hashable | None:
        """The current episode once its evidence is on disk; None while still waiting."""
        ...

    def incident(self) -> Path | None:
        """The current episode's incident bundle (None when none was written)."""
        ...

    def record_remediation(self, bundle: Path, record: dict[str, Any]) -> None:
        """Write what remediation did into `bundle` (best effort)."""
        ...


class RemediationMetrics(Protocol):
    """The remediation series of the exporter."""

    def remediation(self, action: str, outcome: str) -> None: ...

    def set_plan(self, plan: dict[str, Any], *, dry_run: bool) -> None: ...

    def set_remediation_exhausted(self, exhausted: bool) -> None: ...

    def set_restarts(self, last_wall: float | None, started: int = 0) -> None: ...

    def set_fallback_active(self, fallback: str, active: bool) -> None: ...


class NoMetrics:
    """No exporter: every update is dropped."""

    def remediation(self, action: str, outcome: str) -> None:
        return None

    def set_plan(self, plan: dict[str, Any], *, dry_run: bool) -> None:
        return None

    def set_remediation_exhausted(self, exhausted: bool) -> None:
        return None

    def set_restarts(self, last_wall: float | None, started: int = 0) -> None:
        return None

    def set_fallback_active(self, fallback: str, active: bool) -> None:
        return None
