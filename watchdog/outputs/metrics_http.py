"""The exporter's HTTP side: `/metrics` and `/healthz` on their own thread.

Separate from the sink so a stuck loop still answers `/healthz` (with 503) and the address
parsing is testable alone. Binds 127.0.0.1 unless the operator configures otherwise.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1:9433"


class Scrapeable(Protocol):
    """What the server reads: the registry to encode and the loop's freshness."""

    registry: CollectorRegistry

    def healthy(self) -> bool: ...

    def seconds_since_loop(self) -> float: ...


def parse_addr(addr: str) -> tuple[str, int] | None:
    """Parse --metrics-addr: "host:port", "[v6]:port", port 0 picks one; "off" disables (None)."""
    text = addr.strip()
    if text.lower() == "off":
        return None
    hint = 'use "HOST:PORT" such as 127.0.0.1:9433, "[::1]:9433" for IPv6, or "off"'
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ValueError(f"metrics address {addr!r}: IPv6 needs [ADDR]:PORT; {hint}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"metrics address {addr!r}: {host!r} is not IPv6; {hint}") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"metrics address {addr!r} needs a host and a port; {hint}")
        if ":" in host:
            raise ValueError(f"metrics address {addr!r}: put an IPv6 host in brackets; {hint}")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {addr!r}: port {port!r} is not 0-65535; {hint}")
    return host, int(port)


CONNECTION_TIMEOUT_S = 10.0  # a handler waiting on a client (a reply it never reads) gives up
HEADER_DEADLINE_S = 5.0  # a request must have arrived in full by then (slowloris)
MAX_PENDING = 1024  # connections still sending their request; the oldest beyond are dropped
MAX_HANDLERS = 32  # requests answered at once (each takes a thread)
RECHECK_S = 0.05  # how often connections holding part of a request are looked at again
LISTEN_BACKLOG = 128  # socketserver's default of 5 makes a burst of scrapers wait seconds


class _Handler(BaseHTTPRequestHandler):
    """Serves /metrics and /healthz from the sink attached to the server."""

    server: _Server
    timeout = CONNECTION_TIMEOUT_S  # socketserver applies it to the connection (settimeout)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        """Route one GET request."""
        path = self.path.split("?", 1)[0]
        sink = self.server.sink
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(sink.registry), content_type)
        elif path == "/healthz":
            if sink.healthy():
                self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            else:
                age = sink.seconds_since_loop()
                body = f"stale: last loop {age:.0f} s ago\n".encode()
                self._reply(503, body, "text/plain; charset=utf-8")
        else:
            self._reply(404, b"not found: try /metrics or /healthz\n", "text/plain")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Scrapes every few seconds would flood the log: keep them at debug."""
        log.debug("metrics %s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that carries the sink and speaks IPv4 or IPv6.

    A connection gets a thread only once its request has fully arrived: until then it waits
    in one selector (`_Gate`), so slow or idle clients cost a file descriptor, not a thread,
    and cannot starve /healthz. Clients that hang up early are routine, not tracebacks.
    """

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, host: str, port: int, sink: Scrapeable) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sink = sink
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self.dropped = 0
        self._gate: _Gate | None = None
        super().__init__((host, port), _Handler)
        self._gate = _Gate(self._dispatch, self._drop)

    def process_request(self, request: Any, client_address: Any) -> None:
        assert self._gate is not None
        self._gate.add(request, client_address)

    def _dispatch(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=CONNECTION_TIMEOUT_S):
            self._drop(request, "too many requests at once")
            return
        super().process_request(request, client_address)

    def _drop(self, request: Any, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("metrics: %d connection(s) dropped so far (latest: %s)", self.dropped, why)
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that disconnects or times out mid-request: one debug line, never a
        traceback on stderr (it would break --log-format json)."""
        log.debug("metrics: connection from %s ended early", client_address, exc_info=True)

    def server_close(self) -> None:
        if self._gate is not None:
            self._gate.close()
        super().server_close()


class _Gate:
    """Holds new connections in one selector until their request headers are complete."""

    def __init__(
        self,
        ready: Callable[[Any, Any], None],
        drop: Callable[[Any, str], None],
    ) -> None:
        self._ready, self._drop = ready, drop
        self._sel = selectors.DefaultSelector()
        self._pending: dict[Any, tuple[Any, float]] = {}  # socket -> (address, deadline)
        self._lock = threading.Lock()
        self._partial: set[Any] = set()  # hold part of a request; polled, not selected
        self._last_recheck = 0.0
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-gate", daemon=True)
        self._thread.start()

    def add(self, sock: Any, address: Any) -> None:
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                oldest = min(self._pending, key=lambda s: self._pending[s][1])
                self._forget(oldest)
                self._drop(oldest, f"more than {MAX_PENDING} connections still sending")
            self._pending[sock] = (address, time.monotonic() + HEADER_DEADLINE_S)
            self._sel.register(sock, selectors.EVENT_READ)
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _forget(self, sock: Any) -> None:
        self._pending.pop(sock, None)
        if sock in self._partial:
            self._partial.discard(sock)
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(sock)

    def _run(self) -> None:
        while not self._closed:
            with self._lock:
                empty = not self._pending
            if empty:  # idle: sleep until a connection arrives, no polling
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            for key, _ in self._sel.select(timeout=RECHECK_S):
                self._check(key.fileobj)
            self._recheck_partial()
            now = time.monotonic()
            with self._lock:
                late = [s for s, (_, end) in self._pending.items() if end < now]
                for sock in late:
                    self._forget(sock)
            for sock in late:
                self._drop(sock, f"request not complete within {HEADER_DEADLINE_S:.0f} s")

    def _recheck_partial(self) -> None:
        """Sockets holding part of a request are out of the selector (they stay readable, which
        would spin it): peek at them again every RECHECK_S instead."""
        now = time.monotonic()
        if now - self._last_recheck < RECHECK_S:
            return
        self._last_recheck = now
        for sock in list(self._partial):
            self._check(sock)

    def _check(self, sock: Any) -> None:
        try:
            head = sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            head = b""
        complete = b"\r\n\r\n" in head or b"\n\n" in head or len(head) >= 65536
        if head and not complete:
            with self._lock:
                if sock in self._pending and sock not in self._partial:
                    self._partial.add(sock)
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        self._sel.unregister(sock)
            return
        with self._lock:
            address = self._pending.get(sock, (None, 0.0))[0]
            self._forget(sock)
        if not head:
            self._drop(sock, "closed before sending a request")
            return
        self._ready(sock, address)


class MetricsServer:
    """Serves the sink over HTTP on its own thread, so a stuck loop still answers /healthz."""

    def __init__(self, sink: Scrapeable, addr: str = DEFAULT_ADDR) -> None:
        parsed = parse_addr(addr)
        if parsed is None:
            raise ValueError('metrics address "off" means no server: do not build a MetricsServer')
        self._sink = sink
        self._host, self._port = parsed
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound host and port. OSError says why binding failed."""
        if self._server is not None:
            raise RuntimeError("MetricsServer already started")
        try:
            server = _Server(self._host, self._port, self._sink)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot listen on {self._host}:{self._port} for metrics ({exc.strerror}); "
                "pick another --metrics-addr or 'off'",
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()
        host, port = server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)
