"""What the exporter answers to one request: `/metrics` in the format the scraper accepts,
`/healthz` from the loop's freshness, 404 elsewhere (the socket side is metrics_http.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from watchdog.outputs.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Family,
    render_openmetrics,
    render_text,
    wants_openmetrics,
)


class Scrapeable(Protocol):
    """What the server reads: the families to render and the loop's freshness."""

    def collect(self) -> Iterable[Family]: ...

    def healthy(self) -> bool: ...

    def seconds_since_loop(self) -> float: ...


TEXT = "text/plain; charset=utf-8"
REASONS: tuple[tuple[int, str], ...] = (
    (200, "OK"),
    (400, "Bad Request"),
    (404, "Not Found"),
    (405, "Method Not Allowed"),
    (500, "Internal Server Error"),
    (503, "Service Unavailable"),
)


def respond(sink: Scrapeable, head: bytes) -> bytes:
    """The whole HTTP response to one request head (request line and headers)."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return response(400, b"bad request\n", TEXT)
    method, target = parts[0], parts[1]
    if method != "GET":
        return response(405, b"only GET\n", TEXT, extra="Allow: GET\r\n")
    path = target.split("?", 1)[0]
    if path == "/metrics":
        accept = ",".join(
            value for name, _, value in (h.partition(":") for h in lines[1:])
            if name.strip().lower() == "accept"
        )  # fmt: skip
        if wants_openmetrics(accept):
            return response(200, render_openmetrics(sink.collect()), OPENMETRICS_CONTENT_TYPE)
        return response(200, render_text(sink.collect()), TEXT_CONTENT_TYPE)
    if path == "/healthz":
        if sink.healthy():
            return response(200, b"ok\n", TEXT)
        body = f"stale: last loop {sink.seconds_since_loop():.0f} s ago\n".encode()
        return response(503, body, TEXT)
    return response(404, b"not found: try /metrics or /healthz\n", TEXT)


def response(status: int, body: bytes, content_type: str, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.0 {status} {dict(REASONS)[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
