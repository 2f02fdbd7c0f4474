"""The remediation's own settings: exactly the config keys it reads, frozen, built once by the
wiring, so remediation never holds the whole (mutable) Config."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from watchdog.config import Config


@dataclass(frozen=True)
class RemediationConfig:
    """The remediation keys of a Config, same names and meaning (docs/configuration.md); no
    defaults of its own: `of(Config())` gives the config's."""

    remediate: bool
    dry_run: bool
    restarter: str
    restart_command: tuple[str, ...]
    fallback_file: str | None
    systemd_unit: str | None  # the systemd restarter's unit
    stop_grace_s: float
    state_dir: str
    incident_dir: str | None
    server_url: str | None  # the smoke test after a restart
    smoke_test: bool
    recover_within_s: float
    remediate_min_confidence: float
    cooldown_s: float
    max_restarts: int
    restart_window_s: float
    fallback_overrides: Mapping[str, str]
    deployment: str
    fleet_remediation: str
    fleet_leader: bool
    fleet_prometheus_url: str
    fleet_settle_s: float

    @classmethod
    def of(cls, cfg: Config) -> RemediationConfig:
        """The remediation keys of `cfg`, copied (lists as tuples, the overrides read-only)."""
        values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)}
        values["restart_command"] = tuple(cfg.restart_command)
        values["fallback_overrides"] = MappingProxyType(dict(cfg.fallback_overrides))
        return cls(**values)

    @property
    def acts(self) -> bool:
        """Whether remediation restarts anything (a dry run only reports)."""
        return self.remediate and not self.dry_run

    @property
    def on(self) -> bool:
        """Whether there is a remediation hook at all (acting or a dry run)."""
        return self.remediate or self.dry_run
