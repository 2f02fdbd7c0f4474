"""TCP sockets from the server's tree to a kernel CDN: the evidence of a cubin download stall.

FlashInfer fetches cubins from `FLASHINFER_CUBINS_REPOSITORY` (default host
`edge.urm.nvidia.com`, flashinfer/jit/cubin_loader.py); a socket that stays open to it while
nothing progresses is what `cubin_download_stall` looks for. Names are resolved in a
background thread so that a slow DNS server never stalls the watchdog's loop.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import psutil

from watchdog.core.model import Connection
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, proc_deadline
from watchdog.sources.netaddr import host_arg
from watchdog.sources.procenv import read_environ
from watchdog.sources.tcpdiag import DiagUnavailable, PortDiag, bytes_received

log = logging.getLogger("hang_watchdog.sources.conns")

DEFAULT_CDN = ("edge.urm.nvidia.com", 443)
Endpoint = tuple[str, int | None]  # (host, port); port None matches any port
_SCHEME_PORTS = {"http": 80, "https": 443}


def parse_cdn_host(text: str) -> tuple[str, int | None]:
    """Parse `--cdn-host HOST[:PORT]` (IPv6 as `[::1]:8080`); ValueError says what is wrong."""
    raw = text.strip()
    hint = "give --cdn-host HOST[:PORT], e.g. edge.urm.nvidia.com:443 or [::1]:8080"
    if not raw or "/" in raw or any(c.isspace() for c in raw):
        raise ValueError(f"--cdn-host {text!r} is not a host name; {hint}")
    port_text: str | None = None
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"--cdn-host {text!r} has an unclosed '[' around an IPv6 address")
        port_text = rest[1:] if rest else None
        _check_ip(host, text)
    elif raw.count(":") > 1:
        host = raw  # a bare IPv6 address, no port
        _check_ip(host, text)
    else:
        host, sep, port_text = raw.partition(":")
        port_text = port_text if sep else None
    if not host:
        raise ValueError(f"--cdn-host {text!r} has no host; {hint}")
    return host.lower(), _parse_port(port_text, text)


def _check_ip(host: str, text: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError as e:
        raise ValueError(f"--cdn-host {text!r}: {host!r} is not an IPv6 address ({e})") from e


def _parse_port(port_text: str | None, text: str) -> int | None:
    if port_text is None:
        return None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--cdn-host {text!r}: port {port_text!r} is not a number in 1-65535")
    return int(port_text)


def _url_endpoint(url: str) -> Endpoint | None:
    """The host of a cubin repository URL; None for a local path (FlashInfer copies those)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in _SCHEME_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port or _SCHEME_PORTS[parts.scheme]
    except ValueError:
        port = _SCHEME_PORTS[parts.scheme]
    return parts.hostname.lower(), port


class CdnHosts:
    """Hosts a download stall would talk to: the default CDN, the target's repository, extras."""

    def __init__(
        self, extra: Iterable[str] = (), *, default: Endpoint | None = DEFAULT_CDN
    ) -> None:
        self.extra = tuple(parse_cdn_host(h) for h in extra)
        self.default = default

    def endpoints(self, environ: Mapping[str, str] | None = None) -> tuple[Endpoint, ...]:
        """All endpoints, deduplicated, for a target with this environment."""
        found: list[Endpoint] = [self.default] if self.default else []
        repo = (environ or {}).get("FLASHINFER_CUBINS_REPOSITORY")
        if repo:
            ep = _url_endpoint(repo)
            if ep is not None:
                found.append(ep)
        found.extend(self.extra)
        return tuple(dict.fromkeys(found))


def resolve_host(host: str) -> frozenset[str]:
    """All addresses a name resolves to (blocking; run it off the loop)."""
    infos = socket.getaddrinfo(host_arg(host), None, type=socket.SOCK_STREAM)
    return frozenset(_normal_ip(str(info[4][0])) for info in infos)


def _proc_net_keys(ip: str) -> tuple[str, ...]:
    """How an address is spelled in /proc/net/tcp{,6}: each 32-bit word in host (little-endian
    on x86 and arm64) byte order, in hex, then `:PORT`; IPv4 also as v4-mapped IPv6."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ()
    raw = addr.packed
    order = sys.byteorder
    words = "".join(f"{int.from_bytes(raw[i : i + 4], order):08X}" for i in range(0, len(raw), 4))
    if isinstance(addr, ipaddress.IPv6Address):
        return (words + ":",)
    mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + raw).packed
    v6 = "".join(f"{int.from_bytes(mapped[i : i + 4], order):08X}" for i in range(0, 16, 4))
    return (words + ":", v6 + ":")


def _normal_ip(ip: str) -> str:
    """Canonical text for an address; an IPv4-mapped IPv6 address becomes plain IPv4."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


class Resolver:
    """Resolves host names in one background thread; `addresses()` never blocks."""

    def __init__(
        self,
        resolve: Callable[[str], Iterable[str]] = resolve_host,
        *,
        refresh_s: float = 300.0,
        retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        quiet: frozenset[str] = frozenset(),
    ) -> None:
        self._resolve = resolve
        self._quiet = quiet  # hosts whose failure is expected offline: one info line, not down
        self._said: set[str] = set()
        self._refresh_s = refresh_s
        self._retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._known: dict[str, frozenset[str]] = {}
        self._due: dict[str, float] = {}  # host -> clock time of its next resolution
        self._thread: threading.Thread | None = None
        self.health = SourceHealth("resolver")

    def addresses(self, host: str) -> frozenset[str]:
        """What `host` resolved to so far; empty until the first resolution finishes."""
        try:
            return frozenset({_normal_ip(str(ipaddress.ip_address(host)))})
        except ValueError:
            pass
        with self._lock:
            if host not in self._due:
                self._due[host] = self._clock()
                self._wake.set()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="hang-watchdog-resolver", daemon=True
                )
                self._thread.start()
            return self._known.get(host, frozenset())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            now = self._clock()
            with self._lock:
                due = [h for h, t in self._due.items() if t <= now]
            for host in due:
                self._resolve_one(host)
            self._wake.wait(timeout=1.0)

    def _resolve_one(self, host: str) -> None:
        try:
            addrs = frozenset(_normal_ip(a) for a in self._resolve(host))
            delay = self._refresh_s
            self.health.ok()
        except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError
            addrs, delay = frozenset(), self._retry_s
            if host not in self._quiet:
                self.health.down(f"cannot resolve {host}: {e}")
            elif host not in self._said:  # air-gapped hosts are a main audience: no warning
                self._said.add(host)
                log.info(
                    "%s does not resolve (%s): an offline host, so FlashInfer cannot download "
                    "from it either; sockets to it go unrecognised until it resolves",
                    host,
                    e,
                )
        with self._lock:
            if addrs or host not in self._known:
                self._known[host] = addrs  # keep stale addresses rather than none on an error
            self._due[host] = self._clock() + delay

    def close(self) -> None:
        """Stop the background thread (it is a daemon, so this is a courtesy)."""
        self._stop.set()
        self._wake.set()


def received_by_ports(peer_ports: Iterable[int]) -> dict[tuple[int, int], int]:
    """(local port, peer port) -> tcpi_bytes_received of the established TCP sockets to
    `peer_ports`: the NETLINK_SOCK_DIAG dump sources/tcpdiag.py reads, filtered by the kernel
    (struct tcp_info, bytes_received since Linux 4.1); DiagUnavailable when it fails."""
    out: dict[tuple[int, int], int] = {}
    for port in set(peer_ports):
        for s in PortDiag(port).sockets():
            got = bytes_received(s)
            if got is not None:
                out[(s.sport, s.dport)] = got
    return out


class ConnSource:
    """Reports the target tree's TCP sockets to CDN hosts, with how long each has been open."""

    name = "conns"
    part = "conns"

    def __init__(
        self,
        hosts: CdnHosts,
        resolver: Resolver,
        *,
        psutil_module: ModuleType = psutil,
        clock: Callable[[], float] = time.monotonic,
        net_root: str = "/proc/net",
        proc_root: str = "/proc",
        received: Callable[[Iterable[int]], Mapping[tuple[int, int], int]] = received_by_ports,
    ) -> None:
        self._received = received
        self.hosts = hosts
        self._proc_root = proc_root
        self.resolver = resolver
        self.health = SourceHealth(self.name)
        self._ps = psutil_module
        self._net_root = net_root
        self._clock = clock
        self._first_seen: dict[tuple[int, Any, Any], float] = {}

    def _targets(self, environ: Mapping[str, str] | None) -> dict[str, list[Endpoint]]:
        by_ip: dict[str, list[Endpoint]] = {}
        for host, port in self.hosts.endpoints(environ):
            for ip in self.resolver.addresses(host):
                by_ip.setdefault(ip, []).append((host, port))
        return by_ip

    def deadline(self, tick_s: float) -> Deadline:
        return proc_deadline(tick_s)

    def poll(self, tick: SourceTick | None = None) -> tuple[Connection, ...]:
        """The CDN sockets of the target's tree this tick (`tick` from the procs source).

        The target's environment names extra CDN hosts; the facts source has read it already
        this tick when it runs, else it is read here and handed on (the GPU choice uses it).
        """
        if tick is None:
            return ()
        if tick.environ is None and tick.target_pid is not None:
            tick.environ = read_environ(tick.target_pid, self._proc_root)
        return self.connections(tick.tree_pids, tick.environ)

    def connections(
        self, pids: Sequence[int], environ: Mapping[str, str] | None = None
    ) -> tuple[Connection, ...]:
        """The CDN sockets of these processes this tick; never raises."""
        by_ip = self._targets(environ)
        now = self._clock()
        seen: dict[tuple[int, Any, Any], float] = {}
        found: list[Connection] = []
        lports: list[int] = []
        denied: list[int] = []
        if not by_ip or not self._any_socket_to(by_ip):
            pids = ()  # no socket anywhere goes to a CDN address: no per-process walk at all
        for pid in pids:
            try:
                conns = self._sockets(pid)
            except self._ps.NoSuchProcess:
                continue
            except self._ps.AccessDenied:
                denied.append(pid)
                continue
            for c in conns:
                conn = self._match(pid, c, by_ip, now, seen)
                if conn is not None:
                    found.append(conn)
                    lports.append(int(c.laddr[1]) if c.laddr else 0)
        self._first_seen = seen
        if found:
            found = self._with_bytes(found, lports)
        if denied:
            self.health.down(
                f"permission denied reading sockets of pid {denied[0]}; run the watchdog as the "
                "server's user or with CAP_SYS_PTRACE"
            )
        else:
            self.health.ok()
        return tuple(found)

    def _with_bytes(self, found: list[Connection], lports: list[int]) -> list[Connection]:
        """Each socket's bytes received so far (tcp_info, core/state/leases.py reads the rate: a
        download that trickles is a crawl, one that receives nothing a wedge)."""
        try:
            by_ports = self._received({c.port for c in found})
        except DiagUnavailable:
            return found
        return [
            replace(c, bytes_received=by_ports.get((lp, c.port)))
            for c, lp in zip(found, lports, strict=True)
        ]

    def _any_socket_to(self, by_ip: Mapping[str, list[Endpoint]]) -> bool:
        """Whether the socket tables psutil reads (`/proc/net/tcp` and `tcp6`, the watchdog's
        network namespace) mention any CDN address at all: one read of each per tick instead of
        every process's fd table and a parse of both tables per process (psutil's
        net_connections), which was most of the healthy loop's CPU. True when unreadable."""
        texts: list[str] = []
        for table in ("tcp", "tcp6"):
            try:
                with open(f"{self._net_root}/{table}", encoding="ascii", errors="replace") as fh:
                    texts.append(fh.read())
            except FileNotFoundError:
                continue  # no IPv6 in this kernel
            except OSError:
                return True
        if not texts:
            return True
        text = "\n".join(texts)
        return any(key in text for ip in by_ip for key in _proc_net_keys(ip))

    def _sockets(self, pid: int) -> list[Any]:
        proc = self._ps.Process(pid)
        # net_connections() is psutil >= 6.0; connections() is the older name.
        getter = getattr(proc, "net_connections", None) or proc.connections
        return list(getter(kind="tcp"))

    def _match(
        self,
        pid: int,
        c: Any,
        by_ip: Mapping[str, list[Endpoint]],
        now: float,
        seen: dict[tuple[int, Any, Any], float],
    ) -> Connection | None:
        if not c.raddr:
            return None
        ip, port = _normal_ip(c.raddr[0]), int(c.raddr[1])
        host = next((h for h, p in by_ip.get(ip, ()) if p is None or p == port), None)
        if host is None:
            return None
        key = (pid, tuple(c.laddr), tuple(c.raddr))
        first = self._first_seen.get(key, now)
        seen[key] = first
        return Connection(
            pid=pid, host=host, ip=ip, port=port, state=str(c.status), age_s=now - first
        )

    def close(self) -> None:
        """Stop the resolver thread."""
        self.resolver.close()
