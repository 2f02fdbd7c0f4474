"""NCCL's own view of a hang, read-only, from its RAS service (NCCL >= 2.24).

Every NCCL process runs a RAS thread; one of them listens for clients on NCCL_RAS_ADDR
(default localhost:28028). The client protocol and the JSON report are those of NCCL v2.29.7-1
(`src/ras/client.cc`, `src/ras/client_support.cc`, commit b91894bd): the client writes
`CLIENT PROTOCOL 2`, reads `SERVER PROTOCOL N`, then `TIMEOUT S` -> `OK`, `SET FORMAT json`
-> `OK`, `STATUS`, and reads the report until NCCL closes the socket. STATUS only reads: it
gathers what every process already knows over the RAS network and changes nothing in NCCL's
communicators. The whole query has one hard deadline; a server that trickles bytes is cut off.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from watchdog.sources.base import Deadline, SourceHealth, SourceTick
from watchdog.sources.netaddr import connect
from watchdog.sources.rasreport import (
    RasComm,
    RasError,
    RasMissing,
    RasRank,
    RasReport,
    analyse,
    findings,
    parse_report,
)

log = logging.getLogger("hang_watchdog.sources.nccl_ras")

PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, src/ras/ras_internal.h @ v2.29.7-1
DEFAULT_ADDR = "localhost:28028"  # NCCL_RAS_CLIENT_PORT, same file
MAX_REPLY = 8 * 1024 * 1024  # a report for thousands of ranks is a few MiB
ABSENT_FIX = (
    "NCCL >= 2.24 serves RAS on NCCL_RAS_ADDR (default localhost:28028) unless NCCL_RAS_ENABLE=0; "
    "JSON reports need NCCL >= 2.28.9. Set nccl_ras_addr to the job's NCCL_RAS_ADDR, or "
    "nccl_ras = 'off' to stop trying"
)
Connect = Callable[[tuple[str, int], float], socket.socket]


def parse_address(addr: str) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) as NCCL_RAS_ADDR spells it; ValueError names what is wrong."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. {DEFAULT_ADDR})")
    return host.strip("[]"), int(port)


def _connect(addr: tuple[str, int], timeout: float) -> socket.socket:
    return connect(addr[0], addr[1], timeout)


__all__ = ["RasComm", "RasMissing", "RasRank", "RasReport", "parse_report"]


class RasClient:
    """One read-only STATUS query under a hard deadline."""

    def __init__(
        self,
        addr: str = DEFAULT_ADDR,
        *,
        deadline_s: float = 10.0,
        collective_timeout_s: int = 5,
        connect: Connect = _connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.addr = parse_address(addr)
        self._deadline_s = deadline_s
        self._timeout = collective_timeout_s
        self._connect = connect
        self._clock = clock

    def query(self) -> RasReport:
        """The report, or RasError naming what failed; never blocks past the deadline."""
        end = self._clock() + self._deadline_s
        try:
            sock = self._connect(self.addr, max(0.05, end - self._clock()))
        except OSError as e:
            raise RasError(f"NCCL RAS at {self._where()} does not answer ({e})") from e
        with sock:
            try:
                reply = self._exchange(sock, f"CLIENT PROTOCOL {PROTOCOL}\n", end)
                if not reply.upper().startswith("SERVER PROTOCOL "):
                    raise RasError(f"not an NCCL RAS service at {self._where()}: {reply[:80]!r}")
                for cmd in (f"TIMEOUT {self._timeout}\n", "SET FORMAT json\n"):
                    reply = self._exchange(sock, cmd, end)
                    if reply.strip().upper() != "OK":
                        raise RasError(f"NCCL RAS refused {cmd.strip()!r}: {reply.strip()[:120]}")
                sock.sendall(b"STATUS\n")
                return parse_report(self._read(sock, end, until_eof=True))
            except OSError as e:
                raise RasError(f"NCCL RAS at {self._where()}: {e}") from e

    def _where(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def _exchange(self, sock: socket.socket, line: str, end: float) -> str:
        sock.sendall(line.encode())
        return self._read(sock, end, until_eof=False)

    def _read(self, sock: socket.socket, end: float, *, until_eof: bool) -> str:
        buf = bytearray()
        while True:
            left = end - self._clock()
            if left <= 0:
                raise RasError(
                    f"NCCL RAS at {self._where()} did not finish within {self._deadline_s:g} s "
                    f"({len(buf)} bytes read)"
                )
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue  # the loop head reports the deadline
            if not chunk:
                if until_eof:
                    return buf.decode("utf-8", "replace")
                raise RasError(f"NCCL RAS at {self._where()} closed the connection")
            buf += chunk
            if len(buf) > MAX_REPLY:
                raise RasError(f"NCCL RAS reply over {MAX_REPLY} bytes; refused")
            if not until_eof and buf.endswith(b"\n"):
                return buf.decode("utf-8", "replace")


class RasSource:
    """Queries RAS in the background at most every interval_s; the loop reads the latest result.

    mode "auto": a service that never answered is said once and then retried quietly every
    10 intervals; "on": retried every interval (each distinct error still logged once).
    `configured` (an address was set, or mode "on"): a service that does not answer is a source
    that is down (`source_up{source="nccl_ras"} 0`); not configured, it is not a source at all
    until it first answers (`health.reported`). Its result is the Observation's `nccl_ras`.
    """

    name = "nccl_ras"
    part = "nccl_ras"

    def __init__(
        self,
        client: RasClient,
        *,
        mode: str = "auto",
        interval_s: float = 30.0,
        configured: bool = False,
        local_hosts: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.mode, self.interval_s = client, mode, interval_s
        self.configured = configured
        self._local = frozenset(local_hosts) if local_hosts is not None else None
        self.health = SourceHealth(self.name, log)
        self.health.reported = configured
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0.0
        self._ever_up = False
        self._latest: dict[str, Any] = {"up": False, "evidence": [], "error": None}

    def deadline(self, tick_s: float) -> Deadline:
        """Inline: a poll only reads the latest result; the query thread has its own deadline."""
        return Deadline(0.0, inline=True)

    def poll(self, tick: SourceTick | None = None) -> dict[str, Any]:
        """The latest result (never blocks); starts a query when one is due."""
        now = self._clock()
        with self._lock:
            due = now >= self._next and (self._thread is None or not self._thread.is_alive())
            if due:
                quiet = self.mode == "auto" and not self._ever_up and self._next > 0
                self._next = now + self.interval_s * (10 if quiet else 1)
                self._thread = threading.Thread(target=self._run, name="nccl-ras", daemon=True)
                self._thread.start()
            return dict(self._latest)

    def wait(self, timeout: float) -> None:
        """Block until the running query ends (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        try:
            report = self.client.query()
            if self._local is None:
                self._local = local_addresses(self.client.addr[0])
            result = {"up": True, "evidence": analyse(report), "error": None,
                      "version": report.nccl_version, "communicators": len(report.comms),
                      **findings(report, self._local)}  # fmt: skip
        except RasError as e:
            self._fail(str(e))
            return
        except Exception as e:  # noqa: BLE001 - a peer's bytes must never end this thread
            self._fail(f"unexpected RAS report from {self.client.addr[0]}: {type(e).__name__}")
            return
        with self._lock:
            self._ever_up = True
            self._latest = result
        self.health.reported = True
        self.health.ok()

    def _fail(self, error: str) -> None:
        with self._lock:
            first_absence = not self._ever_up and self._latest.get("error") is None
            self._latest = {"up": False, "evidence": [], "error": error}
        if self.mode == "auto" and not self._ever_up and not self.configured:
            if first_absence:
                log.info("%s; NCCL's own view is not available. %s", error, ABSENT_FIX)
            self.health.up = False
            return
        self.health.down(error)

    @property
    def reported(self) -> bool:
        """Whether this source has a `source_up` series: configured, or it answered once."""
        return self.health.reported

    def close(self) -> None:
        """Nothing to release: the query thread is a daemon and ends at its deadline."""


def local_addresses(ras_host: str, fib_trie: str = "/proc/net/fib_trie") -> frozenset[str]:
    """This host's addresses as a RAS report spells a rank's host (an IP address): loopback,
    the RAS service's own address, and the kernel's LOCAL IPv4 routes (no DNS lookup)."""
    out = {"127.0.0.1", "::1", "localhost", ras_host, socket.gethostname()}
    try:
        with open(fib_trie, encoding="ascii", errors="replace") as fh:
            lines = fh.read(1 << 20).splitlines()
    except OSError:
        return frozenset(out)
    last = ""
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] in ("|--", "+--"):
            last = words[1]
        elif line.strip().startswith("/32 host LOCAL") and last:
            out.add(last)
    return frozenset(out)
