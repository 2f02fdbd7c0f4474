"""A small HTTP/1.1 GET on a raw socket for the per-tick /metrics and /health scrape.

Not httpx: its first request imports httpcore, h11, anyio and whatever optional backends are
installed (about 2 MiB of module code in a clean venv, more where trio or h2 are present), for
two GETs a second to one origin. Not http.client either: it imports `ssl` (OpenSSL's libssl and
libcrypto) and `email`, about 4.8 MiB of RSS, which would be the only user of either in a
deployed daemon (the exporter serves its own pages, outputs/metrics_http.py). `ssl` is imported
here only for an https:// URL, when its first connection is opened.

What is read (RFC 9112): the status line, headers (at most MAX_HEAD_BYTES and MAX_HEADERS
lines), and a body framed by Transfer-Encoding: chunked, Content-Length, or the end of the
connection. One keep-alive connection; one overall deadline per request covering connect,
TLS handshake, headers and body, so a server trickling a byte at a time cannot stretch it; a
bounded body; redirects never followed (a 3xx is reported as its status, as httpx did).
"""

from __future__ import annotations

import binascii
import codecs
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, unquote

from watchdog.sources.netaddr import connect

if TYPE_CHECKING:
    import ssl

_CHUNK = 64 << 10
# The status line and headers together; http.client allowed 64 KiB a line and 100 lines. A
# /metrics or /health answer carries a handful of short headers, so more is not a server's.
MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 100
_MAX_CHUNK_LINE = 4096  # a chunk-size line: hex digits and perhaps extensions


class BodyTooLarge(Exception):
    """The body passed the caller's limit; the rest is not read."""


class HttpError(Exception):
    """The answer is not HTTP/1.x as read here; the connection is dropped."""


class BadStatusLine(HttpError):
    """The first line is not an HTTP status line (another protocol on that port)."""


class IncompleteRead(HttpError):
    """The connection ended before the body its framing announced."""


class HeadersTooLarge(HttpError):
    """More header bytes or lines than MAX_HEAD_BYTES or MAX_HEADERS."""


class RemoteDisconnected(ConnectionResetError):
    """The server closed the connection before any byte of an answer (as http.client names
    it): on a reused keep-alive connection, one it closed while idle."""


# A reused keep-alive connection the server closed while idle fails like this before any
# byte of the answer; such a GET is sent once more on a fresh connection (it is idempotent).
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Conn:
    """One connection and the bytes read from it but not yet used; every recv gets only the
    time left before the current request's deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.deadline = 0.0
        self.received = 0  # bytes of the current answer read so far

    def _recv(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)
        data = self.sock.recv(_CHUNK)
        self.received += len(data)
        return data

    def send(self, data: bytes) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)
        self.sock.sendall(data)

    def readline(self, limit: int) -> bytes:
        """Up to and including the next LF; what is left at the end of the stream (perhaps
        b""); raises HeadersTooLarge past `limit` bytes without an LF."""
        start = 0
        while (end := self.buf.find(b"\n", start)) < 0:
            if len(self.buf) > limit:
                raise HeadersTooLarge(f"a line longer than {limit} bytes")
            start = len(self.buf)
            data = self._recv()
            if not data:
                line, self.buf = bytes(self.buf), bytearray()
                return line
            self.buf += data
        if end + 1 > limit:
            raise HeadersTooLarge(f"a line longer than {limit} bytes")
        line = bytes(self.buf[: end + 1])
        del self.buf[: end + 1]
        return line

    def read(self, n: int) -> bytes:
        """Up to n bytes: what is buffered, or one recv; b"" at the end of the stream."""
        if not self.buf:
            data = self._recv()
            if len(data) <= n:
                return data
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def close(self) -> None:
        self.sock.close()


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²' (Latin-1 0xB2), which int() refuses."""
    return text.isascii() and text.isdigit()


class _Head:
    """A status line and the headers that frame the body."""

    def __init__(self, version: str, status: int) -> None:
        self.version = version
        self.status = status
        self.length: int | None = None
        self.chunked = False
        self.coded = False  # a transfer coding other than chunked last: read to the end
        self.close = version == "HTTP/1.0"

    def header(self, name: str, value: str) -> None:
        if name == "content-length":
            if not _digits(value) or (self.length is not None and int(value) != self.length):
                raise HttpError(f"bad Content-Length {value[:40]!r}")
            self.length = int(value)
        elif name == "transfer-encoding":
            codings = [c.strip().lower() for c in value.split(",") if c.strip()]
            self.chunked = bool(codings) and codings[-1] == "chunked"
            self.coded = not self.chunked
        elif name == "connection":
            tokens = {t.strip().lower() for t in value.split(",")}
            if "close" in tokens:
                self.close = True
            elif "keep-alive" in tokens:
                self.close = False


def _read_head(conn: _Conn) -> _Head:
    """The status line and headers of the answer, 1xx interim answers skipped."""
    while True:
        line = conn.readline(MAX_HEAD_BYTES)
        if not line:
            raise RemoteDisconnected("Remote end closed connection without response")
        text = line.decode("iso-8859-1")
        version, _, rest = text.rstrip("\r\n").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not (_digits(code) and len(code) == 3):
            raise BadStatusLine(text)
        head = _Head(version, int(code))
        size, count = len(line), 0
        while (line := conn.readline(MAX_HEAD_BYTES - size)) not in (b"\r\n", b"\n"):
            if not line.endswith(b"\n"):
                raise IncompleteRead("the connection ended inside the headers")
            size += len(line)
            count += 1
            if count > MAX_HEADERS:
                raise HeadersTooLarge(f"more than {MAX_HEADERS} header lines")
            name, colon, value = line.decode("iso-8859-1").partition(":")
            if colon:
                head.header(name.strip().lower(), value.strip())
        if not 100 <= head.status < 200:
            return head


def _body(conn: _Conn, head: _Head) -> Iterator[bytes]:
    """The body's bytes as they arrive (only a 200's is read); sets head.close when it ran to
    the connection's end."""
    if head.chunked:
        yield from _chunked(conn)
    elif head.length is not None and not head.coded:
        left = head.length
        while left:
            data = conn.read(min(left, _CHUNK))
            if not data:
                raise IncompleteRead(f"{head.length - left} bytes read, {left} more expected")
            left -= len(data)
            yield data
    else:  # no framing: the body is all the server sends before it closes
        head.close = True
        while data := conn.read(_CHUNK):
            yield data


def _chunked(conn: _Conn) -> Iterator[bytes]:
    while True:
        line = conn.readline(_MAX_CHUNK_LINE)
        if not line.endswith(b"\n"):
            raise IncompleteRead("the connection ended inside a chunked body")
        digits = line.split(b";", 1)[0].strip()
        if not digits or digits.strip(b"0123456789abcdefABCDEF"):
            raise HttpError(f"bad chunk size {digits[:40]!r}")
        size = int(digits, 16)
        if size == 0:
            break
        while size:
            data = conn.read(min(size, _CHUNK))
            if not data:
                raise IncompleteRead("the connection ended inside a chunk")
            size -= len(data)
            yield data
        if conn.readline(_MAX_CHUNK_LINE) not in (b"\r\n", b"\n"):
            raise HttpError("a chunk not followed by CRLF")
    size = 0  # trailer fields, read and dropped, under the same bounds as headers
    for _ in range(MAX_HEADERS + 1):
        line = conn.readline(MAX_HEAD_BYTES - size)
        if line in (b"\r\n", b"\n"):
            return
        if not line.endswith(b"\n"):
            raise IncompleteRead("the connection ended inside the trailers")
        size += len(line)
    raise HeadersTooLarge(f"more than {MAX_HEADERS} trailer lines")


class HttpGet:
    """GETs paths of one origin over one keep-alive connection; raises OSError (TimeoutError
    past the deadline), HttpError or BodyTooLarge, never hangs."""

    def __init__(self, parts: SplitResult) -> None:
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        if not self._prefix.isascii() or any(c <= " " or c == "\x7f" for c in self._prefix):
            raise ValueError(
                f"URL path {self._prefix!r} has a space, a control character or non-ASCII text;"
                " percent-encode it"
            )
        host = f"[{self._host}]" if ":" in self._host else self._host
        if parts.port is not None and parts.port != (443 if self._https else 80):
            host = f"{host}:{parts.port}"
        lines = [
            f"Host: {host.encode('idna').decode('ascii') if not host.isascii() else host}",
            "Accept: text/plain, */*",
            "Accept-Encoding: identity",
            "User-Agent: hang-watchdog",
        ]
        if parts.username is not None:  # httpx sent URL credentials as Basic auth; so do we
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            token = binascii.b2a_base64(cred.encode(), newline=False).decode("ascii")
            lines.append(f"Authorization: Basic {token}")
        self._head = "".join(line + "\r\n" for line in lines) + "\r\n"
        self._conn: _Conn | None = None
        self._tls: ssl.SSLContext | None = None
        self._answered = False  # whether the last failed GET had read any byte of an answer

    def get(
        self,
        path: str,
        timeout_s: float,
        max_bytes: int,
        on_text: Callable[[str], None] | None = None,
    ) -> int:
        """GET prefix+path; the body goes to on_text as UTF-8 text. Returns the status; the
        body of a status other than 200 is not read."""
        deadline = time.monotonic() + timeout_s
        request = f"GET {self._prefix}{path} HTTP/1.1\r\n{self._head}".encode("ascii")
        reused = self._conn is not None
        try:
            return self._get(request, deadline, max_bytes, on_text)
        except _STALE:
            if not reused or self._answered:
                raise
        return self._get(request, deadline, max_bytes, on_text)

    def _get(
        self,
        request: bytes,
        deadline: float,
        max_bytes: int,
        on_text: Callable[[str], None] | None,
    ) -> int:
        self._answered = False
        conn: _Conn | None = None
        try:
            conn = self._connection(deadline)
            conn.deadline, conn.received = deadline, 0
            conn.send(request)
            head = _read_head(conn)
            if head.status != 200:
                self.close()  # the body is not wanted: drop the connection, not drain it
                return head.status
            if head.length is not None and head.length > max_bytes and not head.chunked:
                raise BodyTooLarge(f"more than {max_bytes} bytes (Content-Length {head.length})")
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            size = 0
            for data in _body(conn, head):
                size += len(data)
                if size > max_bytes:
                    raise BodyTooLarge(f"more than {max_bytes} bytes")
                if on_text is not None:
                    on_text(decoder.decode(data))
            if on_text is not None:
                on_text(decoder.decode(b"", final=True))
            if head.close or conn.buf:  # closing, or sent more than it framed: not reusable
                self.close()
            return head.status
        except BaseException:
            # Part of an answer came: the failure is not a keep-alive connection left idle.
            self._answered = conn is not None and conn.received > 0
            self.close()
            raise

    def _connection(self, deadline: float) -> _Conn:
        if self._conn is not None:
            return self._conn
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock = connect(self._host, self._port, left)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._https:
                sock = self._wrap(sock, deadline)
        except BaseException:
            sock.close()
            raise
        self._conn = _Conn(sock)
        return self._conn

    def _wrap(self, sock: socket.socket, deadline: float) -> socket.socket:
        """TLS over the connected socket, verified against the default trust store (ssl is
        imported here, for https:// only; SSL_CERT_FILE and SSL_CERT_DIR are honoured)."""
        import ssl

        if self._tls is None:
            self._tls = ssl.create_default_context()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)  # the handshake runs inside wrap_socket, under the deadline
        return self._tls.wrap_socket(sock, server_hostname=self._host)

    def close(self) -> None:
        """Drop the connection; the next GET opens a fresh one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
