"""systemd notify protocol (sd_notify) on the standard library: Type=notify without libsystemd.

Protocol (systemd sd_notify(3)): the service manager passes a datagram socket path in
NOTIFY_SOCKET (a leading "@" means the Linux abstract namespace); the service sends newline
separated KEY=VALUE assignments in one datagram. WATCHDOG_USEC (and optionally WATCHDOG_PID)
say how often WATCHDOG=1 must arrive; sd_watchdog_enabled(3) recommends pinging at half of it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping

log = logging.getLogger("hang_watchdog.sdnotify")

# Variables that belong to this process only; a supervised child must not inherit them, or it
# could ping (or mis-ping) on our behalf (sd_notify(3), "unset_environment").
NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

# A datagram to a full queue would block; bound it so a stuck manager never freezes the loop.
SEND_TIMEOUT_S = 1.0


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING to systemd; a no-op when not started by systemd."""

    def __init__(
        self,
        address: str | None,
        watchdog_usec: int | None = None,
        *,
        logger: logging.Logger = log,
    ) -> None:
        self._address = _socket_address(address) if address else None
        self._watchdog_usec = watchdog_usec
        self._log = logger
        self._failures: set[str] = set()
        self.enabled = self._address is not None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        getpid: Callable[[], int] = os.getpid,
    ) -> Notifier:
        """Build from NOTIFY_SOCKET/WATCHDOG_USEC/WATCHDOG_PID; a disabled notifier when unset."""
        address = environ.get("NOTIFY_SOCKET", "").strip() or None
        return cls(address, _watchdog_usec(environ, getpid()))

    def ready(self, status: str = "") -> None:
        """Tell systemd start-up finished (READY=1), optionally with a status line."""
        self._send({"READY": "1", "STATUS": status} if status else {"READY": "1"})

    def status(self, text: str) -> None:
        """Publish a one-line status shown by `systemctl status`."""
        self._send({"STATUS": text})

    def watchdog(self) -> None:
        """Ping systemd's watchdog; call only after a full loop iteration completed."""
        self._send({"WATCHDOG": "1"})

    def stopping(self) -> None:
        """Tell systemd a clean shutdown has begun (STOPPING=1)."""
        self._send({"STOPPING": "1"})

    def watchdog_interval_s(self) -> float | None:
        """Seconds between pings (half of WATCHDOG_USEC), or None when no watchdog is armed."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def _send(self, fields: Mapping[str, str]) -> None:
        """Send one datagram; log each distinct failure once and never raise."""
        if self._address is None:
            return
        payload = "\n".join(f"{k}={_one_line(v)}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)
                sock.sendto(payload, self._address)
        except OSError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if reason not in self._failures:
                self._failures.add(reason)
                self._log.warning("sd_notify to %r failed: %s", self._address, reason)


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """Copy of `environ` without the notify variables, for a child this process supervises."""
    return {k: v for k, v in environ.items() if k not in NOTIFY_VARIABLES}


def _socket_address(address: str) -> str | bytes:
    """Map NOTIFY_SOCKET to a sendto() address; "@name" is the abstract namespace ("\\0name")."""
    if address.startswith("@"):
        return b"\0" + address[1:].encode()
    return address


def _watchdog_usec(environ: Mapping[str, str], pid: int) -> int | None:
    """WATCHDOG_USEC when it is armed for this process (sd_watchdog_enabled(3) semantics)."""
    raw_usec = environ.get("WATCHDOG_USEC", "").strip()
    if not raw_usec:
        return None
    raw_pid = environ.get("WATCHDOG_PID", "").strip()
    try:
        usec = int(raw_usec)
        if raw_pid and int(raw_pid) != pid:
            return None
    except ValueError:
        log.warning(
            "ignoring systemd watchdog: WATCHDOG_USEC=%r WATCHDOG_PID=%r are not integers",
            raw_usec,
            raw_pid,
        )
        return None
    return usec if usec > 0 else None


def _one_line(value: str) -> str:
    """Keep one assignment per line: a newline inside a value would start a new assignment."""
    return value.replace("\r", " ").replace("\n", " ")
