"""A small stdlib HTTP/1.1 GET for the per-tick /metrics and /health scrape.

httpx's first request imports httpcore, h11, anyio and whatever optional backends are
installed (about 2 MiB of module code in a clean venv, more where trio or h2 are present), for
two GETs a second to one origin. http.client costs too (it imports ssl and email: about 4.4
MiB of RSS, loaded only when `server_url` is set, since the exporter no longer uses it). One
keep-alive connection; one overall deadline per request covering connect, headers and body;
a bounded body; redirects never followed (a 3xx is reported as its status, as httpx did).
"""

from __future__ import annotations

import base64
import codecs
import http.client
import io
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, unquote

# A reused keep-alive connection the server closed while idle fails like this before any
# byte of the answer; such a GET is sent once more on a fresh connection (it is idempotent).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
_CHUNK = 64 << 10


class BodyTooLarge(Exception):
    """The body passed the caller's limit; the rest is not read."""


class _DeadlineReader(io.RawIOBase):
    """A socket reader whose every recv gets only the time left before one deadline, so a
    server trickling a byte at a time cannot stretch a request past its timeout."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        # makefile() holds a reference that keeps the descriptor open after the connection
        # lets go of a will-close response, as http.client's own reader does.
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)
        return self._raw.readinto(buf)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Response(http.client.HTTPResponse):
    """A response read through a _DeadlineReader (http.client reads headers and body from
    `fp`, so the one deadline covers both)."""

    def __init__(self, sock: socket.socket, deadline: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


class HttpGet:
    """GETs paths of one origin over one keep-alive connection; raises OSError (TimeoutError
    past the deadline), http.client.HTTPException or BodyTooLarge, never hangs."""

    def __init__(self, parts: SplitResult) -> None:
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": "text/plain, */*", "Accept-Encoding": "identity"}
        self._headers["User-Agent"] = "hang-watchdog"
        if parts.username is not None:  # httpx sent URL credentials as Basic auth; so do we
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        self._conn: http.client.HTTPConnection | None = None
        self._answered = False

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
        reused = self._conn is not None
        self._answered = False
        try:
            return self._get(path, deadline, max_bytes, on_text)
        except _STALE:
            if not reused or self._answered:
                raise
        return self._get(path, deadline, max_bytes, on_text)

    def _get(
        self, path: str, deadline: float, max_bytes: int, on_text: Callable[[str], None] | None
    ) -> int:
        try:
            conn = self._connection(deadline)
            # http.client only calls response_class(sock, ...): a factory that binds the
            # deadline does, though typeshed declares a class.
            conn.response_class = lambda sock, *a, **kw: _Response(sock, deadline, *a, **kw)  # type: ignore[assignment]
            conn.request("GET", self._prefix + path, headers=self._headers)
            resp = conn.getresponse()
            self._answered = True
            if resp.status != 200:
                self.close()  # the body is not wanted: drop the connection, not drain it
                return resp.status
            self._read_body(resp, max_bytes, on_text)
            if resp.will_close:
                self.close()
            return resp.status
        except BaseException:
            self.close()
            raise

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        if self._conn is None:
            left = max(deadline - time.monotonic(), 0.001)
            if self._https:  # ssl is already loaded by http.client; this only builds a context
                import ssl

                ctx = ssl.create_default_context()
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=left, context=ctx
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=left)
            self._conn.connect()
        assert self._conn.sock is not None
        self._conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        return self._conn

    @staticmethod
    def _read_body(
        resp: http.client.HTTPResponse, max_bytes: int, on_text: Callable[[str], None] | None
    ) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        size = 0
        while chunk := resp.read1(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"more than {max_bytes} bytes")
            if on_text is not None:
                on_text(decoder.decode(chunk))
        if resp.length:  # read1 meets an early EOF with b"", not IncompleteRead as read() does
            raise http.client.IncompleteRead(b"", resp.length)
        # read1 stops at Content-Length without closing the reader; closing it marks the
        # response done, so the connection can carry the next request.
        resp.close()
        if on_text is not None:
            on_text(decoder.decode(b"", final=True))

    def close(self) -> None:
        """Drop the connection; the next GET opens a fresh one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
