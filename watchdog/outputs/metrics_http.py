"""The exporter's HTTP side: `/metrics` and `/healthz` on their own thread.

Separate from the sink so a stuck loop still answers `/healthz` (with 503) and the address
parsing is testable alone. Binds 127.0.0.1 unless the operator configures otherwise.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

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


class _Handler(BaseHTTPRequestHandler):
    """Serves /metrics and /healthz from the sink attached to the server."""

    server: _Server

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
    """A threading HTTP server that carries the sink and speaks IPv4 or IPv6."""

    daemon_threads = True

    def __init__(self, host: str, port: int, sink: Scrapeable) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sink = sink
        super().__init__((host, port), _Handler)


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
