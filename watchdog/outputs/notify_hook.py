"""The systemd notify hook: READY=1 after the first complete loop, STATUS= on state changes,
WATCHDOG=1 once per loop (so systemd's watchdog sees the loop itself, not a timer thread)."""

from __future__ import annotations

from typing import Protocol

from watchdog.core.state.tick import Tick


class Notifications(Protocol):
    """What the hook sends through (outputs/sdnotify.py Notifier)."""

    def ready(self, status: str = "") -> None: ...

    def status(self, text: str) -> None: ...

    def watchdog(self) -> None: ...


class NotifyHook:
    """Tells systemd how the loop is doing, one datagram or two per tick."""

    def __init__(self, notifier: Notifications) -> None:
        self.notifier = notifier
        self.ready = False
        self.state: str | None = None

    def on_tick(self, tick: Tick) -> None:
        verdict = tick.verdict
        status = f"{verdict.state}" + (f": {verdict.signature}" if verdict.signature else "")
        if not self.ready:
            self.notifier.ready(status)
            self.ready = True
        elif verdict.state != self.state:
            self.notifier.status(status)
        self.state = verdict.state
        self.notifier.watchdog()
