"""Requests accepted and not answered, read from real loopback sockets through sock_diag."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from watchdog.engines.loader import load_engines
from watchdog.sources.tcpdiag import DUMP_MODES, PortDiag, own_ports, port_filter, unanswered

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


@pytest.fixture
def busy_host() -> Iterator[tuple[int, set[tuple[int, int]]]]:
    """500 connections to another listener on 127.0.0.1: (its port, their (local, peer)
    port pairs, both ends)."""
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1024)
    held: list[socket.socket] = []
    for _ in range(500):
        held.append(socket.create_connection(other.getsockname()))
        held.append(other.accept()[0])
    yield other.getsockname()[1], {(s.getsockname()[1], s.getpeername()[1]) for s in held}
    for s in [*held, other]:
        s.close()


def pairs(diag: PortDiag) -> set[tuple[int, int]]:
    return {(s.sport, s.dport) for s in diag.sockets()}


def test_the_kernel_filter_returns_only_the_servers_sockets_on_a_busy_host(
    server: socket.socket, busy_host: tuple[int, set[tuple[int, int]]]
) -> None:
    port = server.getsockname()[1]
    ends = [end for _ in range(2) for end in connect(server)]
    want = {(s.getsockname()[1], s.getpeername()[1]) for s in ends}
    assert len(want) == 4  # the server's two sockets and the two clients'
    for mode in (0, 1):  # one dump for both families; a dump per family
        diag = PortDiag(port, mode=mode)
        assert diag.mode.filtered and pairs(diag) == want
        assert diag.mode == DUMP_MODES[mode]  # the kernel took the filter: no fallback
    # The same as the whole table read and filtered here (what every tick did before).
    whole = PortDiag(port, mode=len(DUMP_MODES) - 1)
    assert not whole.mode.filtered and pairs(whole) == want
    # The filter is the port's own: the other listener's port gives its 1000 sockets.
    other_port, other_pairs = busy_host
    assert pairs(PortDiag(other_port)) == other_pairs
    free = socket.socket()
    free.bind(("127.0.0.1", 0))  # bound, never connected: no socket has its port
    assert pairs(PortDiag(free.getsockname()[1])) == set()
    free.close()
    for s in ends:
        s.close()


def test_a_filter_the_kernel_refuses_falls_back_to_the_whole_table_said_once(
    server: socket.socket, busy_host: tuple[int, set[tuple[int, int]]], caplog: Any
) -> None:
    port = server.getsockname()[1]
    client, accepted = connect(server)
    want = {(port, client.getsockname()[1]), (client.getsockname()[1], port)}
    # An op code the kernel does not know (inet_diag_bc_audit answers EINVAL).
    refused = PortDiag(port, bytecode=bytes([99, 4, 8, 0]))
    with caplog.at_level(logging.WARNING, logger="hang_watchdog.sources.tcpdiag"):
        assert pairs(refused) == want
        assert pairs(refused) == want
    assert refused.mode == DUMP_MODES[-1]
    assert [r.getMessage().count("refused") for r in caplog.records] == [1, 1]  # each mode once
    assert len(port_filter(port)) == 28  # the real filter: S_COND (12), JMP (4), D_COND (12)
    client.close()
    accepted.close()


def test_own_connections_are_told_by_the_inodes_this_process_holds(server: socket.socket) -> None:
    port = server.getsockname()[1]
    mine, mine_srv = connect(server)
    theirs = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(port)], stdout=subprocess.DEVNULL
    )  # a client in another process
    try:
        theirs_srv, _ = server.accept()
        sockets = PortDiag(port).sockets()
        clients = {s.sport for s in sockets if s.dport == port}
        assert mine.getsockname()[1] in clients and len(clients) == 2
        assert own_ports(sockets, port) == {mine.getsockname()[1]}
        theirs_srv.close()
    finally:
        theirs.kill()
        theirs.wait()
        for s in (mine, mine_srv):
            s.close()


def test_the_server_source_counts_a_clients_unanswered_request() -> None:
    """A real HTTP server whose completion never returns: /metrics still answers 0 running
    (as vLLM's does during a step that never ends), the socket table says a request waits."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from watchdog.core.state.witnesses import Witnesses
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
