"""The exporter's HTTP side: `/metrics` and `/healthz` from one thread of non-blocking sockets.

Separate from the sink so a stuck loop still answers `/healthz` (with 503) and the address
parsing is testable alone. Binds 127.0.0.1 unless the operator configures otherwise.

Not `http.server`: it imports `http.client` (and so `ssl`, OpenSSL's libssl and libcrypto) and
`email` to parse two header lines, several MiB of a daemon's RSS. A scrape is one small GET
answered with `Connection: close`, as prometheus_client's server (BaseHTTPRequestHandler,
HTTP/1.0) answers it. One selector holds every connection: a request is read as it arrives,
answered once its headers are complete, and its reply written as the client takes it, so a slow
or silent client costs a file descriptor, never a thread, and cannot delay another scrape or
the daemon's loop.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import selectors
import socket
import threading
import time

from watchdog.outputs.metrics_routes import TEXT, Scrapeable, respond, response

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1:9433"


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


CONNECTION_TIMEOUT_S = 10.0  # a connection answered and closed by then (a reply never read)
HEADER_DEADLINE_S = 5.0  # a request must have arrived in full by then (slowloris)
MAX_PENDING = 1024  # open connections; the oldest beyond are dropped
MAX_HEAD_BYTES = 65536  # a request head larger than this is refused (400)
LISTEN_BACKLOG = 128  # socketserver's default of 5 makes a burst of scrapers wait seconds


class _Conn:
    """One client: what it has sent so far, the reply still to write, and its deadlines."""

    __slots__ = ("sock", "head", "reply", "head_by", "done_by")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.head = bytearray()
        self.reply: memoryview | None = None
        self.head_by = now + HEADER_DEADLINE_S
        self.done_by = now + CONNECTION_TIMEOUT_S


class _Server:
    """The listening socket and its connections, served by `serve` on one thread."""

    def __init__(self, host: str, port: int, sink: Scrapeable) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((host, port))
            self.listener.listen(LISTEN_BACKLOG)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.sink = sink
        self.dropped = 0
        self._conns: dict[socket.socket, _Conn] = {}  # oldest first
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return str(host), int(port)

    def serve(self) -> None:
        while not self._stopping:
            for key, mask in self._sel.select(timeout=self._wait()):
                if key.fileobj is self.listener:
                    self._accept()
                elif isinstance(conn := key.data, _Conn) and conn.sock in self._conns:
                    self._write(conn) if mask & selectors.EVENT_WRITE else self._read(conn)
            self._expire()
        for sock in list(self._conns):
            self._close(sock)
        self._sel.close()
        self.listener.close()
        self._wake_r.close()

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close_waker(self) -> None:
        self._wake_w.close()

    def _wait(self) -> float:
        """Seconds until the nearest deadline (at most 1 s; nothing to wait for: 1 s)."""
        if not self._conns:
            return 1.0
        now = time.monotonic()
        soonest = min(c.done_by if c.reply is not None else c.head_by for c in self._conns.values())
        return min(1.0, max(0.0, soonest - now))

    def _accept(self) -> None:
        while True:
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the backlog waits a moment
                log.debug("metrics: accept failed: %s", exc)
                time.sleep(0.05)  # the listener stays readable: do not spin on it
                return
            sock.setblocking(False)
            if len(self._conns) >= MAX_PENDING:
                self._drop(next(iter(self._conns)), f"more than {MAX_PENDING} connections open")
            self._conns[sock] = _Conn(sock, time.monotonic())
            self._sel.register(sock, selectors.EVENT_READ, self._conns[sock])

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # closed (or reset) before the request was complete
            self._close(conn.sock)
            return
        conn.head += data
        end = _head_end(conn.head)
        if end < 0 and len(conn.head) < MAX_HEAD_BYTES:
            return
        if end < 0:
            reply = response(400, b"request head too large\n", TEXT)
        else:
            try:
                reply = respond(self.sink, bytes(conn.head[:end]))
            except Exception:  # the sink failed: this scrape gets a 500, the server serves on
                log.warning("metrics: answering a request failed", exc_info=True)
                reply = response(500, b"internal error\n", TEXT)
        conn.reply = memoryview(reply)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.reply is not None
        try:
            sent = conn.sock.send(conn.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client hung up: routine, never a traceback
            self._close(conn.sock)
            return
        conn.reply = conn.reply[sent:]
        if not conn.reply:
            self._close(conn.sock)

    def _expire(self) -> None:
        now = time.monotonic()
        for sock, conn in list(self._conns.items()):
            if conn.reply is None and now > conn.head_by:
                self._drop(sock, f"request not complete within {HEADER_DEADLINE_S:.0f} s")
            elif now > conn.done_by:
                self._drop(sock, f"reply not taken within {CONNECTION_TIMEOUT_S:.0f} s")

    def _drop(self, sock: socket.socket, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("metrics: %d connection(s) dropped so far (latest: %s)", self.dropped, why)
        self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        self._conns.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(sock)
        sock.close()


def _head_end(buf: bytearray) -> int:
    """Where a complete request head ends (its blank line), or -1."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        i = buf.find(sep)
        if i >= 0:
            return i
    return -1


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
        self._thread = threading.Thread(target=server.serve, name="metrics-http", daemon=True)
        self._thread.start()
        return server.address

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.stop()
        if thread is not None:
            thread.join(timeout=5)
        if server is not None:
            server.close_waker()
