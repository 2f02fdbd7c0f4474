"""The remediation state as the hook keeps it while running: loaded at start, reloaded when an
operator rewrites the file (`hang-watchdog fallback clear`), saved after every change."""

from __future__ import annotations

import logging
from collections.abc import Callable

from watchdog.remediation.limits import clamp_future
from watchdog.remediation.state import RemediationState, StateError, StateStore

log = logging.getLogger("hang_watchdog.remediation")


class KeptState:
    """One RemediationState and the file it lives in; `state` is replaced on a reload."""

    def __init__(self, store: StateStore, wall: Callable[[], float]) -> None:
        self.store, self.wall = store, wall
        self.state: RemediationState = store.load()
        clamp_future(self.state, wall())
        self._mtime = store.stamp()
        self._save_error = ""

    def reload_if_changed(self) -> bool:
        """Read the file again when someone else wrote it; True when the state was replaced."""
        mtime = self.store.stamp()
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            state = self.store.load()
        except StateError as exc:
            log.error("remediation state: %s", exc)
            return False
        clamp_future(state, self.wall())
        self.state = state
        return True

    def save(self) -> str:
        """Persist the state; why it failed ("" when saved)."""
        failed = ""
        try:
            self.store.save(self.state)
        except OSError as exc:
            failed = f"cannot save the remediation state to {self.store.path}: {exc}"
            if failed != self._save_error:  # retried every tick: say each failure once
                log.error("%s", failed)
        self._save_error = failed
        self._mtime = self.store.stamp()
        return failed
