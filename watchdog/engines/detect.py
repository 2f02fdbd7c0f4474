"""Which engine a server is, from its command line and its process tree's titles.

The launcher's command line is the reliable part: SGLang's children overwrite their own
`/proc/PID/cmdline` with setproctitle (sglang python/sglang/srt/managers/scheduler.py
`configure_scheduler_process`), so their titles are read as titles, not as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable

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


class EngineRef:
    """The engine in force for this run: forced by --engine, else detected per target."""

    def __init__(self, engines: EngineSet, forced: str | None = None) -> None:
        self.engines = engines
        self.forced = forced
        self.profile: EngineProfile = GENERIC
        self.why = "not detected yet"
        if forced:
            found = engines.get(forced)
            if found is None:
                raise ValueError(
                    f"--engine {forced!r} is not a known engine; known: {', '.join(engines.names)}"
                    " (add one with --engines FILE)"
                )
            self.profile, self.why = found, "forced by --engine"

    def observe(self, cmdline: str, titles: Iterable[str]) -> bool:
        """Detect from a (new) target; True when the engine changed."""
        if self.forced:
            return False
        profile, why = detect_engine(self.engines, cmdline, titles)
        changed = profile.name != self.profile.name
        if changed or self.profile is GENERIC:
            self.profile, self.why = profile, why
        return changed
