"""Suite-wide guards: tests talk only to 127.0.0.1 / ::1, never to any other address; a test
that runs the CLI in-process leaves the watchdog's logger as it found it."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to reach a non-loopback address (e.g. the real CDN)."""
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]  # type: ignore[index]
            if not ipaddress.ip_address(host).is_loopback:
                raise AssertionError(f"test tried to contact {host}")
        return real_connect(self, address)  # type: ignore[arg-type]

    def getaddrinfo(host: object, *args: object, **kw: object) -> object:
        # bytes as well: watchdog.sources.netaddr passes ASCII names as bytes
        name = host.decode("ascii", "replace") if isinstance(host, bytes) else host
        if name not in ("127.0.0.1", "localhost", "::1", None):
            raise AssertionError(f"test tried to resolve {host}")
        return real_getaddrinfo(host, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(autouse=True)
def watchdog_logger_restored() -> Iterator[None]:
    """`main()` in-process sets up the CLI's stderr handler with propagation off; undo it, or
    later tests in the same worker log into a closed capture stream and caplog sees nothing."""
    log = logging.getLogger("hang_watchdog")
    saved = (list(log.handlers), log.propagate, log.level)
    yield
    log.handlers[:] = saved[0]
    log.propagate, log.level = saved[1], saved[2]
