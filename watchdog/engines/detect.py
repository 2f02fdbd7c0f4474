"""Which engine a server is, from its command line and its process tree's titles.

The launcher's command line is the reliable part: SGLang's children overwrite their own
`/proc/PID/cmdline` with setproctitle (sglang python/sglang/srt/managers/scheduler.py
`configure_scheduler_process`), so their titles are read as titles, not as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from watchdog.engines.loader import EngineSet
from watchdog.engines.profile import GENERIC, EngineProfile


def detect_engine(
    engines: EngineSet, cmdline: str, titles: Iterable[str] = ()
) -> tuple[EngineProfile, str]:
    """(profile, why): the first profile whose command-line or title pattern matches."""
    for profile in engines.profiles:
        for pattern in profile.cmdline:
            if pattern.search(cmdline):
                return profile, f"command line matches {profile.name} ({pattern.pattern!r})"
    titles = tuple(titles)
    for profile in engines.profiles:
        for pattern in profile.titles:
            hit = next((t for t in titles if pattern.search(t)), None)
            if hit is not None:
                return profile, f"process title {hit!r} is {profile.name}'s"
    return GENERIC, "no engine profile matches the command line or the process titles"


@dataclass(frozen=True)
class EngineInForce:
    """The engine in force for this run, as a value: forced by --engine, else detected by the
    process source from each new target. It travels in the loop's tick (sources/base.py
    SourceTick); nothing shares a mutable one."""

    profile: EngineProfile = GENERIC
    why: str = "not detected yet"
    forced: bool = False

    @classmethod
    def at_start(cls, engines: EngineSet, forced: str | None = None) -> EngineInForce:
        """The engine before any target is seen; ValueError for an unknown --engine name."""
        if not forced:
            return cls()
        found = engines.get(forced)
        if found is None:
            raise ValueError(
                f"--engine {forced!r} is not a known engine; known: {', '.join(engines.names)}"
                " (add one with --engines FILE)"
            )
        return cls(found, "forced by --engine", forced=True)

    def observed(self, engines: EngineSet, cmdline: str, titles: Iterable[str]) -> EngineInForce:
        """The engine after seeing a (new) target: this one when forced or unchanged."""
        if self.forced:
            return self
        profile, why = detect_engine(engines, cmdline, titles)
        if profile.name != self.profile.name or self.profile is GENERIC:
            return EngineInForce(profile, why)
        return self
