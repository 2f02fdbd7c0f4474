"""Requests accepted and not answered, read from real loopback sockets through sock_diag."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from watchdog.engines.loader import load_engines
from watchdog.sources.tcpdiag import unanswered

ENGINES = load_engines()

CLIENT = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 0\\r\\n\\r\\n")
c.recv(4096)
"""


@pytest.fixture
def server() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv
    srv.close()


def connect(srv: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(srv.getsockname())
    accepted, _ = srv.accept()
    return client, accepted


def test_a_request_with_no_answer_is_pending_and_an_answered_one_is_not(
    server: socket.socket,
) -> None:
    port = server.getsockname()[1]
    waiting, waiting_srv = connect(server)
    answered, answered_srv = connect(server)
    idle, _idle_srv = connect(server)  # connected, never sent a byte
    for c in (waiting, answered):
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    waiting_srv.recv(4096)
    answered_srv.recv(4096)
    time.sleep(1.3)
    answered_srv.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    time.sleep(0.1)
    got = unanswered(port)
    assert [p.peer_port for p in got] == [waiting.getsockname()[1]]
    assert got[0].waiting_s >= 1.2
    # A keep-alive connection that sends its next request is pending again.
    answered.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    answered_srv.recv(4096)
    assert {p.peer_port for p in unanswered(port, min_age_s=0.0)} == {
        waiting.getsockname()[1],
        answered.getsockname()[1],
    }
    # The watchdog's own connections can be left out; other ports are never read.
    assert unanswered(port, exclude_peers=[waiting.getsockname()[1]]) == []
    assert unanswered(port + 1 if port < 65535 else port - 1) == []
    for s in (waiting, waiting_srv, answered, answered_srv, idle):
        s.close()


def test_the_server_source_counts_a_clients_unanswered_request() -> None:
    """A real HTTP server whose completion never returns: /metrics still answers 0 running
    (as vLLM's does during a step that never ends), the socket table says a request waits."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from watchdog.core.witnesses import Witnesses
    from watchdog.sources.server import ServerSource

    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            release.wait(30)  # the step that never ends
            self.send_response(200)
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    source = ServerSource(f"http://127.0.0.1:{port}", engines=ENGINES)
    try:
        assert source.poll().unanswered == 0
        # A client of its own (the source leaves the watchdog's own connections out).
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port)])
        time.sleep(2.0)
        sample = source.poll()
        assert sample.running == 0 and sample.unanswered == 1, sample
        assert sample.unanswered_oldest_s is not None and sample.unanswered_oldest_s >= 1.0
        w = Witnesses()
        w.on_server(sample, 1.0, advanced=False)
        assert w.active(1.0) == [
            "requests accepted and not answered (1 request(s), the oldest waiting "
            f"{sample.unanswered_oldest_s:.0f} s)"
        ]
        release.set()
        client.wait(timeout=30)
        assert source.poll().unanswered == 0
    finally:
        release.set()
        source.close()
        httpd.shutdown()
        httpd.server_close()
