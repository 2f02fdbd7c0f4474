"""The raw-socket /metrics and /health client against hostile servers on real 127.0.0.1
sockets: trickling status line, headers or body, header floods, oversize and truncated bodies,
chunked bodies, answers that are not HTTP, refused connections, a 503 with a body, keep-alive
reuse and a keep-alive connection the server dropped while idle."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from watchdog.engines.loader import load_engines
from watchdog.sources import server as server_mod
from watchdog.sources.httpget import (
    MAX_HEAD_BYTES,
    BadStatusLine,
    BodyTooLarge,
    HeadersTooLarge,
    HttpError,
    HttpGet,
    IncompleteRead,
    RemoteDisconnected,
)
from watchdog.sources.server import ServerSource

ENGINES = load_engines()  # the profiles; the engine in force comes in each poll's tick

PAGE = b'vllm:num_requests_running{model_name="m"} 3.0\nvllm:num_requests_waiting 1.0\n'

Handler = Callable[[socket.socket], None]


class RawServer:
    """A TCP listener on 127.0.0.1 handing each connection to `handler` in its own thread."""

    def __init__(self, handler: Handler, family: int = socket.AF_INET) -> None:
        self.handler = handler
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        host = "[::1]" if family == socket.AF_INET6 else "127.0.0.1"
        self.url = f"http://{host}:{self.port}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn)

    def read_request(self, conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return b""
            data += chunk
        self.requests.append(data)
        return data

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(handler: Handler, family: int = socket.AF_INET) -> RawServer:
        made.append(RawServer(handler, family))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _answer(status: str, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def _keepalive(srv_ref: list[RawServer], routes: dict[bytes, bytes]) -> Handler:
    def handle(conn: socket.socket) -> None:
        while req := srv_ref[0].read_request(conn):
            path = req.split(b" ", 2)[1]
            conn.sendall(routes.get(path, _answer("404 Not Found", b"no")))

    return handle


def test_keepalive_reuses_one_connection_per_probe(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []
    routes = {b"/metrics": _answer("200 OK", PAGE), b"/health": _answer("200 OK", b"")}
    ref.append(raw(_keepalive(ref, routes)))
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    try:
        samples = [src.poll() for _ in range(3)]
    finally:
        src.close()
    assert all(s.up and s.health_status == 200 and s.running == 3 for s in samples)
    # /metrics and /health each keep their own connection (they never share a deadline).
    assert ref[0].accepted == 2 and len(ref[0].requests) == 6


def test_a_keepalive_connection_dropped_while_idle_is_reopened(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []

    def one_answer_then_close(conn: socket.socket) -> None:
        if ref[0].read_request(conn):
            conn.sendall(_answer("200 OK", PAGE))  # says nothing of closing, then closes

    ref.append(raw(one_answer_then_close))
    client = HttpGet(urlsplit(ref[0].url))
    try:
        got: list[str] = []
        assert client.get("/metrics", 1.0, 1 << 20, got.append) == 200
        time.sleep(0.2)  # the server has closed the idle connection by now
        assert client.get("/metrics", 1.0, 1 << 20, got.append) == 200
    finally:
        client.close()
    assert "".join(got) == PAGE.decode() * 2 and ref[0].accepted == 2


def _drip(prefix: bytes, byte: bytes, every_s: float) -> Callable[[RawServer], Handler]:
    def make(srv: RawServer) -> Handler:
        def handle(conn: socket.socket) -> None:
            srv.read_request(conn)
            conn.sendall(prefix)
            while not srv.stop.is_set():
                conn.sendall(byte)
                time.sleep(every_s)

        return handle

    return make


@pytest.mark.parametrize(
    "prefix",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",  # slowloris body
        b"HTTP/1.1 200 OK\r\nX-Slow: ",  # slowloris headers: one header never ends
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",  # a chunk at a time
        b"HTTP/1.1 200 OK",  # the status line never ends
    ],
    ids=["body", "headers", "chunked", "status-line"],
)
def test_a_trickling_server_times_out_within_the_timeout(
    raw: Callable[..., RawServer], prefix: bytes
) -> None:
    ref: list[RawServer] = []
    drop = b"1\r\n#\r\n" if b"chunked" in prefix else b"#"
    ref.append(raw(lambda conn: _drip(prefix, drop, 0.05)(ref[0])(conn)))
    src = ServerSource(ref[0].url, timeout_s=0.5, engines=ENGINES)
    t0 = time.monotonic()
    s = src.poll()
    elapsed = time.monotonic() - t0
    src.close()
    # A read timeout per recv would never fire here (a byte every 50 ms); one deadline does.
    assert not s.up and "timed out after 0.5 s" in (s.error or "")
    assert s.health_status is None and elapsed < 1.5


def test_an_oversize_body_is_cut_off_and_named(
    raw: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_mod, "MAX_METRICS_BYTES", 1 << 20)
    big = PAGE * ((2 << 20) // len(PAGE))
    ref: list[RawServer] = []
    routes = {b"/metrics": _answer("200 OK", big), b"/health": _answer("200 OK", b"")}
    ref.append(raw(_keepalive(ref, routes)))
    src = ServerSource(ref[0].url, timeout_s=2.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "more than 1 MiB; is this the server's /metrics?" in (s.error or "")
    assert s.health_status == 200  # the source dropped the half-read connection, not the server


def test_body_limit_counts_bytes(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []
    ref.append(raw(_keepalive(ref, {b"/x": _answer("200 OK", b"a" * 5000)})))
    client = HttpGet(urlsplit(ref[0].url))
    with pytest.raises(BodyTooLarge):
        client.get("/x", 1.0, 4096)
    assert client.get("/x", 1.0, 8192) == 200  # a fresh connection after the cut
    client.close()


def test_a_503_with_a_body_is_its_status_and_health_still_read(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []
    routes = {
        b"/metrics": _answer("503 Service Unavailable", b'{"detail":"overloaded"}' * 1000),
        b"/health": _answer("503 Service Unavailable", b'{"status":"unhealthy"}'),
    }
    ref.append(raw(_keepalive(ref, routes)))
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and s.error == f"{ref[0].url}/metrics answered HTTP 503"
    assert s.health_status == 503


def test_a_redirect_is_not_followed(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []
    moved = _answer("302 Found", b"", "Location: http://192.0.2.1/metrics\r\n")
    ref.append(raw(_keepalive(ref, {b"/metrics": moved, b"/health": moved})))
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "answered HTTP 302" in (s.error or "") and s.health_status == 302


def test_a_body_cut_short_is_named(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []

    def short(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + PAGE)

    ref.append(raw(short))
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "IncompleteRead" in (s.error or "")


def test_a_port_that_is_not_http_is_named(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []

    def ssh_like(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        ref[0].read_request(conn)

    ref.append(raw(ssh_like))
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "BadStatusLine: not an HTTP answer" in (s.error or "")
    assert "SSH-2.0" in (s.error or "")


def test_connection_refused_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = ServerSource(f"http://127.0.0.1:{port}", timeout_s=1.0, engines=ENGINES)
    sample = src.poll()
    src.close()
    assert sample.error == (
        f"http://127.0.0.1:{port}/metrics: ConnectionRefusedError: [Errno 111] Connection refused"
    )


def test_chunked_body_and_ipv6_literal(raw: Callable[..., RawServer]) -> None:
    if not socket.has_ipv6:
        pytest.fail("this host has no IPv6 loopback; the [::1] URL form cannot be checked")
    ref: list[RawServer] = []

    def chunked(conn: socket.socket) -> None:
        while req := ref[0].read_request(conn):
            if b"/health" in req.split(b"\r\n", 1)[0]:
                conn.sendall(_answer("200 OK", b""))
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (PAGE[:10], PAGE[10:]):
                conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            conn.sendall(b"0\r\n\r\n")

    ref.append(raw(chunked, socket.AF_INET6))
    src = ServerSource(ref[0].url + "/", timeout_s=1.0, engines=ENGINES)
    samples = [src.poll() for _ in range(2)]
    src.close()
    assert all(s.up and (s.running, s.waiting, s.health_status) == (3, 1, 200) for s in samples)
    assert b"Host: [::1]:%d" % ref[0].port in ref[0].requests[0]
    assert ref[0].accepted == 2  # one keep-alive connection per probe


def test_url_credentials_are_sent_and_never_shown(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []
    ref.append(raw(_keepalive(ref, {b"/p/health": _answer("200 OK", b"")})))
    url = f"http://scraper:s3cret@127.0.0.1:{ref[0].port}/p/"
    src = ServerSource(url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    # base64("scraper:s3cret"); the path prefix is kept before /metrics and /health
    assert all(b"Authorization: Basic c2NyYXBlcjpzM2NyZXQ=" in r for r in ref[0].requests)
    firsts = sorted(r.split(b"\r\n", 1)[0] for r in ref[0].requests)
    assert firsts == [b"GET /p/health HTTP/1.1", b"GET /p/metrics HTTP/1.1"]
    assert s.error == f"http://127.0.0.1:{ref[0].port}/p/metrics answered HTTP 404"
    assert s.health_status == 200


TLS = Path(__file__).parent / "data" / "tls"  # a self-signed cert for 127.0.0.1, test-only


@pytest.fixture
def tls_server() -> Iterator[str]:
    """An HTTPS /metrics server on 127.0.0.1 with the test-only self-signed certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(TLS / "loopback-cert.pem", TLS / "loopback-key.pem")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            body = PAGE if self.path == "/metrics" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_https_is_verified_against_the_system_trust_store(
    tls_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = ServerSource(tls_server, timeout_s=2.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "SSLCertVerificationError" in (s.error or "")
    assert "CERTIFICATE_VERIFY_FAILED" in (s.error or "")
    # OpenSSL's SSL_CERT_FILE points the default context at another trust store.
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "loopback-cert.pem"))
    src = ServerSource(tls_server, timeout_s=2.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert s.up and s.running == 3 and s.health_status == 200


def _client(srv: RawServer) -> HttpGet:
    return HttpGet(urlsplit(srv.url))


def test_a_chunked_body_with_extensions_and_trailers_is_read_and_the_connection_kept(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []

    def chunked(conn: socket.socket) -> None:
        while ref[0].read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            conn.sendall(b"7;ext=1\r\n%s\r\n" % PAGE[:7])
            conn.sendall(b"%X\r\n%s\r\n" % (len(PAGE) - 7, PAGE[7:]))
            conn.sendall(b"0\r\nX-Trailer: yes\r\n\r\n")

    ref.append(raw(chunked))
    client = _client(ref[0])
    got: list[str] = []
    try:
        for _ in range(3):
            assert client.get("/metrics", 1.0, 1 << 20, got.append) == 200
    finally:
        client.close()
    assert "".join(got) == PAGE.decode() * 3
    assert ref[0].accepted == 1  # the trailers were consumed: the next answer parsed cleanly


def test_a_chunked_body_is_bounded_by_its_decoded_size(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []

    def endless(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not ref[0].stop.is_set():
            conn.sendall(b"1000\r\n" + b"a" * 0x1000 + b"\r\n")

    ref.append(raw(endless))
    client = _client(ref[0])
    with pytest.raises(BodyTooLarge):
        client.get("/metrics", 5.0, 100_000)
    client.close()


@pytest.mark.parametrize(
    "flood",
    [b"X-Flood: %d\r\n", b"X-Long: " + b"a" * 1000],
    ids=["many-lines", "one-endless-line"],
)
def test_a_header_flood_is_cut_off_quickly(raw: Callable[..., RawServer], flood: bytes) -> None:
    ref: list[RawServer] = []

    def flooder(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while not ref[0].stop.is_set():
            conn.sendall(flood % n if b"%d" in flood else flood)
            n += 1

    ref.append(raw(flooder))
    client = _client(ref[0])
    t0 = time.monotonic()
    with pytest.raises(HeadersTooLarge):
        client.get("/metrics", 10.0, 1 << 20)
    client.close()
    assert time.monotonic() - t0 < 5.0  # cut at the bound, not at the deadline
    src = ServerSource(ref[0].url, timeout_s=10.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and "HeadersTooLarge" in (s.error or "") and s.health_status is None


def test_headers_just_under_the_bound_are_read(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []
    filler = b"X-Pad: " + b"p" * 1000 + b"\r\n"  # 65 lines: under both bounds
    lines = (MAX_HEAD_BYTES - 200) // len(filler)
    answer = _answer("200 OK", PAGE, (filler * lines).decode())
    ref.append(raw(_keepalive(ref, {b"/metrics": answer})))
    client = _client(ref[0])
    got: list[str] = []
    assert client.get("/metrics", 2.0, 1 << 20, got.append) == 200
    client.close()
    assert "".join(got) == PAGE.decode()


def test_a_connection_reset_while_idle_is_retried_once(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []

    def answer_then_reset(conn: socket.socket) -> None:
        if ref[0].read_request(conn):
            conn.sendall(_answer("200 OK", PAGE))
            time.sleep(0.1)
            # SO_LINGER 0: close sends RST, the next send or recv on it fails with ECONNRESET
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    ref.append(raw(answer_then_reset))
    client = _client(ref[0])
    try:
        assert client.get("/metrics", 1.0, 1 << 20) == 200
        time.sleep(0.3)
        assert client.get("/metrics", 1.0, 1 << 20) == 200
    finally:
        client.close()
    assert ref[0].accepted == 2 and len(ref[0].requests) == 2


def test_a_fresh_connection_closed_without_an_answer_is_not_retried(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []
    ref.append(raw(lambda conn: ref[0].read_request(conn) and None))
    client = _client(ref[0])
    with pytest.raises(RemoteDisconnected):
        client.get("/metrics", 1.0, 1 << 20)
    client.close()
    assert ref[0].accepted == 1


def test_a_reused_connection_cut_inside_an_answer_is_not_retried(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []

    def second_answer_cut(conn: socket.socket) -> None:
        if ref[0].read_request(conn):
            conn.sendall(_answer("200 OK", PAGE))
        if ref[0].read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-")  # part of an answer, read by now,
            time.sleep(0.2)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # then a reset: the same error as a connection dropped while idle, but after bytes

    ref.append(raw(second_answer_cut))
    client = _client(ref[0])
    assert client.get("/metrics", 1.0, 1 << 20) == 200
    with pytest.raises(ConnectionResetError):
        client.get("/metrics", 1.0, 1 << 20)
    client.close()
    assert ref[0].accepted == 1  # the GET was answered (badly), so not sent again


def test_an_unframed_body_is_read_to_the_end_and_the_connection_not_reused(
    raw: Callable[..., RawServer],
) -> None:
    ref: list[RawServer] = []

    def http10(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE)

    ref.append(raw(http10))
    client = _client(ref[0])
    got: list[str] = []
    for _ in range(2):
        assert client.get("/metrics", 1.0, 1 << 20, got.append) == 200
    client.close()
    assert "".join(got) == PAGE.decode() * 2 and ref[0].accepted == 2


@pytest.mark.parametrize(
    ("answer", "error", "named"),
    [
        (b"\x15\x03\x01\x00\x02\x02\x46", BadStatusLine, "not an HTTP answer"),  # a TLS alert
        (b"", RemoteDisconnected, "Remote end closed connection without response"),
        (b"HTTP/1.1 OK\r\n\r\n", BadStatusLine, "not an HTTP answer"),
        (b"HTTP/1.1 2\xb200 OK\r\n\r\n", BadStatusLine, "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", HttpError, "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-", IncompleteRead, "ended inside the headers"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n", HttpError, "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
            HttpError,
            "Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
            HttpError,
            "bad chunk size",
        ),
    ],
    ids=[
        "tls-alert",
        "closed",
        "no-status-code",
        "latin1-digit-status",
        "latin1-digit-length",
        "headers-cut",
        "bad-length",
        "two-lengths",
        "bad-chunk",
    ],
)
def test_an_answer_that_is_not_http_marks_the_source_down_with_a_name(
    raw: Callable[..., RawServer], answer: bytes, error: type[Exception], named: str
) -> None:
    ref: list[RawServer] = []

    def reply(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(answer)

    ref.append(raw(reply))
    client = _client(ref[0])
    with pytest.raises(error):
        client.get("/metrics", 1.0, 1 << 20)
    client.close()
    src = ServerSource(ref[0].url, timeout_s=1.0, engines=ENGINES)
    s = src.poll()
    src.close()
    assert not s.up and named in (s.error or "") and f"{ref[0].url}/metrics: " in (s.error or "")
    assert not src.health.up


def test_a_1xx_interim_answer_is_skipped(raw: Callable[..., RawServer]) -> None:
    ref: list[RawServer] = []

    def interim(conn: socket.socket) -> None:
        ref[0].read_request(conn)
        conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + _answer("200 OK", PAGE))

    ref.append(raw(interim))
    client = _client(ref[0])
    got: list[str] = []
    assert client.get("/metrics", 1.0, 1 << 20, got.append) == 200
    client.close()
    assert "".join(got) == PAGE.decode()


@pytest.mark.parametrize("path", ["/a b", "/a\x7fb", "/métriques"])
def test_a_path_that_cannot_go_on_the_request_line_is_refused_at_start(path: str) -> None:
    with pytest.raises(ValueError, match="percent-encode it"):
        HttpGet(urlsplit(f"http://127.0.0.1:1{path}"))


SERVER_URL_RUN = """
import sys
from watchdog.config import build_config
from watchdog.daemon.wiring import build
cfg = build_config({
    "pid": int(sys.argv[1]), "server_url": sys.argv[2], "gpu_source": "none",
    "cdn_default": False, "metrics_addr": "127.0.0.1:0", "stacks": False,
})
built = build(cfg)
built.server.start()
for _ in range(2):
    built.daemon.tick()
built.close()
heavy = ("http.client", "ssl", "_ssl", "email", "hashlib", "urllib.request", "http.server",
         "encodings.idna", "unicodedata", "zipfile")
print(" ".join(m for m in heavy if m in sys.modules) or "none")
"""


def test_a_daemon_with_server_url_loads_no_http_client_ssl_or_email(
    raw: Callable[..., RawServer],
) -> None:
    """Memory: http.client imports ssl (libssl, libcrypto) and email, 4.8 MiB of RSS; the
    scrape of an http:// server_url uses none of them, resolving a name loads no idna codec
    (unicodedata), and the shipped knowledge is read without importlib.resources' zipfile (a
    fresh interpreter, so other tests' imports do not count)."""
    import os
    import subprocess
    import sys

    from tests.simfixtures import sim_env

    ref: list[RawServer] = []
    routes = {b"/metrics": _answer("200 OK", PAGE), b"/health": _answer("200 OK", b"")}
    ref.append(raw(_keepalive(ref, routes)))
    argv = [sys.executable, "-c", SERVER_URL_RUN, str(os.getpid()), ref[0].url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=sim_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["none"], out.stderr[-2000:]
    paths = {r.split(b" ", 2)[1] for r in ref[0].requests}
    assert {b"/metrics", b"/health"} <= paths  # it did scrape, through the client under test


def test_ascii_host_names_reach_the_resolver_as_bytes() -> None:
    from watchdog.sources.netaddr import host_arg

    assert host_arg("localhost") == b"localhost" and host_arg("::1") == b"::1"
    assert host_arg("bücher.example") == "bücher.example"  # the resolver's idna codec
