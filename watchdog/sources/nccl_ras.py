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

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchdog.sources.base import SourceHealth

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


class RasError(Exception):
    """The RAS service could not be queried; the message says why."""


@dataclass(frozen=True)
class RasRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    counts: dict[str, int]  # collectives completed, by operation (AllReduce, AllGather, ...)
    async_error: int = 0
    abort: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class RasMissing:
    rank: int
    host: str
    unresponsive: bool
    dead: bool


@dataclass(frozen=True)
class RasComm:
    hash: str
    size: int
    ranks: tuple[RasRank, ...] = ()
    missing: tuple[RasMissing, ...] = ()


@dataclass(frozen=True)
class RasReport:
    nccl_version: str
    comms: tuple[RasComm, ...] = field(default_factory=tuple)


def parse_address(addr: str) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) as NCCL_RAS_ADDR spells it; ValueError names what is wrong."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. {DEFAULT_ADDR})")
    return host.strip("[]"), int(port)


# NCCL 2.28.x writes a missing rank's `"nvml_dev": N` without the comma before `"status"`
# (client_support.cc jsonWriteMissingRank @ v2.28.9-1; fixed by v2.29.2-1): repaired here.
_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d+)\n(\s*"status": \{)')


def parse_report(text: str) -> RasReport:
    """The JSON report of `SET FORMAT json` + `STATUS` (client_support.cc jsonWrite*)."""
    try:
        doc = json.loads(_MISSING_COMMA.sub(r"\1,\n\2", text))
        comms = tuple(_comm(c) for c in doc.get("communicators", []))
        return RasReport(str(doc.get("nccl_version", "")), comms)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise RasError(f"unexpected RAS report ({e}); JSON reports need NCCL >= 2.28.9") from e


def _comm(c: dict[str, Any]) -> RasComm:
    ranks = tuple(
        RasRank(
            int(r["rank"]),
            str(r.get("host", "")),
            int(r.get("pid", -1)),
            int(r.get("cuda_dev", -1)),
            {str(k): int(v) for k, v in r.get("collective_counts", {}).items()},
            int(r.get("status", {}).get("async_error", 0)),
            bool(r.get("status", {}).get("abort_flag", False)),
        )
        for r in c.get("ranks", [])
    )
    missing = tuple(
        RasMissing(
            int(m["rank"]),
            str(m.get("host", "")),
            bool(m.get("status", {}).get("unresponsive", False)),
            bool(m.get("status", {}).get("considered_dead", False)),
        )
        for m in c.get("missing_ranks", [])
    )
    return RasComm(str(c["hash"]), int(c["size"]), ranks, missing)


def analyse(report: RasReport) -> list[str]:
    """Evidence lines: dead and unresponsive ranks, and ranks behind their peers' collectives."""
    out: list[str] = []
    for comm in report.comms:
        where = f"NCCL communicator {comm.hash} ({comm.size} ranks)"
        for m in comm.missing:
            state = "considered dead" if m.dead else "unresponsive" if m.unresponsive else "missing"
            out.append(f"{where}: rank {m.rank} on {m.host or 'unknown host'} is {state}")
        if len(comm.ranks) < 2:
            continue
        peak = max(r.total for r in comm.ranks)
        behind = sorted((r for r in comm.ranks if r.total < peak), key=lambda r: r.rank)
        if behind and len(behind) < len(comm.ranks):
            for r in behind[:8]:
                out.append(
                    f"{where}: rank {r.rank} on {r.host} stopped at collective #{r.total}; "
                    f"its peers are at #{peak}"
                )
        for r in comm.ranks:
            if r.async_error or r.abort:
                out.append(f"{where}: rank {r.rank} reports async error {r.async_error}"
                           f"{' and was aborted' if r.abort else ''}")  # fmt: skip
    return out


def _connect(addr: tuple[str, int], timeout: float) -> socket.socket:
    return socket.create_connection(addr, timeout=timeout)


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
    """

    name = "nccl_ras"

    def __init__(
        self,
        client: RasClient,
        *,
        mode: str = "auto",
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.mode, self.interval_s = client, mode, interval_s
        self.health = SourceHealth(self.name, log)
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0.0
        self._ever_up = False
        self._latest: dict[str, Any] = {"up": False, "evidence": [], "error": None}

    def poll(self) -> dict[str, Any]:
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
        except RasError as e:
            self._fail(str(e))
            return
        result = {"up": True, "evidence": analyse(report), "error": None,
                  "version": report.nccl_version, "communicators": len(report.comms)}  # fmt: skip
        with self._lock:
            self._ever_up = True
            self._latest = result
        self.health.ok()

    def _fail(self, error: str) -> None:
        with self._lock:
            first_absence = not self._ever_up and self._latest.get("error") is None
            self._latest = {"up": False, "evidence": [], "error": error}
        if self.mode == "auto" and not self._ever_up:
            if first_absence:
                log.info("%s; NCCL's own view is not available. %s", error, ABSENT_FIX)
            self.health.up = False
            return
        self.health.down(error)

    def close(self) -> None:
        """Nothing to release: the query thread is a daemon and ends at its deadline."""


class WithRas:
    """The facts source plus the latest RAS result as fact `nccl_ras` (never blocks the tick)."""

    def __init__(self, facts: Any, ras: RasSource) -> None:
        self.facts, self.ras = facts, ras
        self.name, self.health = facts.name, facts.health

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        out = self.facts.poll(*args, **kwargs)
        if isinstance(out, dict):
            return {**out, "nccl_ras": self.ras.poll()}
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.facts, name)

    def close(self) -> None:
        self.ras.close()
        close = getattr(self.facts, "close", None)
        if close is not None:
            close()
