"""Signals, handled in one place: SIGTERM, SIGINT and SIGHUP stop the watchdog; a second one
hurries the stop (the supervised server is killed at once instead of after its grace).

SIGHUP's default action kills the process without a word and, in supervise mode, leaves the
server running under PID 1 (a closed terminal or an ssh session that drops sends it), so it is
handled like SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("hang_watchdog")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """Turns stop signals into `stop` (first) and `hurry` (second); `describe()` says what a
    stop will do, so the line printed when the signal arrives names it."""

    def __init__(
        self,
        stop: threading.Event,
        *,
        describe: Callable[[], str] = lambda: "stopping",
        hurry_exit: bool = False,
    ) -> None:
        self.stop = stop
        self.hurry = threading.Event()
        self.describe = describe
        self.hurry_exit = hurry_exit  # nothing to hurry (no server): a second signal exits
        self.received: list[int] = []

    def install(self) -> bool:
        """Install the handlers; False (nothing installed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return True

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        name = signal.Signals(signum).name
        if not self.stop.is_set():
            self.stop.set()
            log.warning("%s received: %s (a second signal hurries it)", name, self.describe())
            return
        self.hurry.set()
        if self.hurry_exit:
            log.warning("%s received again: exiting now", name)
            os._exit(128 + signum)
        log.warning("%s received again: killing the server now, without its grace", name)
