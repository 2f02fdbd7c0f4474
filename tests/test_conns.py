"""ConnSource against a real child process connected to a silent listener on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from watchdog.sources.conns import (
    DEFAULT_CDN,
    CdnHosts,
    ConnSource,
    Resolver,
    parse_cdn_host,
)

CLIENT = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
time.sleep(600)
"""


class StepClock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def silent_listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback listener that accepts connections and never answers."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(lsock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield lsock.getsockname()[1], accepted
    lsock.close()
    for s in accepted:
        s.close()


@pytest.fixture
def connected_child(silent_listener: tuple[int, list[socket.socket]]) -> Iterator[Any]:
    port, _ = silent_listener
    p = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "connected"
    yield p, port
    p.kill()
    p.wait(timeout=10)


def test_reports_established_socket_with_growing_age(connected_child: Any) -> None:
    child, port = connected_child
    clock = StepClock()
    resolver = Resolver()
    src = ConnSource(CdnHosts([f"127.0.0.1:{port}"], default=None), resolver, clock=clock)
    try:
        first = src.connections([child.pid])
        assert len(first) == 1
        c = first[0]
        assert (c.pid, c.host, c.ip, c.port, c.state) == (
            child.pid,
            "127.0.0.1",
            "127.0.0.1",
            port,
            "ESTABLISHED",
        )
        assert c.age_s == 0.0
        clock.now += 7.5
        assert [c.age_s for c in src.connections([child.pid])] == [7.5]
        assert src.health.up
    finally:
        src.close()


def test_port_must_match_and_other_pids_ignored(connected_child: Any) -> None:
    child, port = connected_child
    other_port = port + 1 if port < 65535 else port - 1
    src = ConnSource(CdnHosts([f"127.0.0.1:{other_port}"], default=None), Resolver())
    assert src.connections([child.pid]) == ()
    any_port = ConnSource(CdnHosts(["127.0.0.1"], default=None), Resolver())
    assert len(any_port.connections([child.pid])) == 1
    assert any_port.connections([]) == ()


def test_closed_socket_disappears_and_age_restarts(connected_child: Any) -> None:
    child, port = connected_child
    clock = StepClock()
    src = ConnSource(CdnHosts([f"127.0.0.1:{port}"], default=None), Resolver(), clock=clock)
    assert len(src.connections([child.pid])) == 1
    child.kill()
    child.wait()
    clock.now += 3
    assert src.connections([child.pid]) == ()  # vanished pid: skipped, no exception
    assert src.health.up


def test_name_resolved_in_background_matches_later(connected_child: Any) -> None:
    child, port = connected_child
    release = threading.Event()

    def slow_resolve(host: str) -> list[str]:
        release.wait(30)
        return ["127.0.0.1"] if host == "cdn.test" else []

    resolver = Resolver(slow_resolve)
    src = ConnSource(CdnHosts([f"cdn.test:{port}"], default=None), resolver)
    try:
        # not resolved yet: matches nothing, does not wait
        assert src.connections([child.pid]) == ()
        release.set()
        deadline = time.monotonic() + 15
        while not (found := src.connections([child.pid])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [c.host for c in found] == ["cdn.test"]
    finally:
        src.close()


def test_never_resolving_host_does_not_block_poll(connected_child: Any) -> None:
    child, _ = connected_child
    stuck = threading.Event()

    def hang(host: str) -> list[str]:
        stuck.wait(600)
        return []

    src = ConnSource(CdnHosts(["never.test"]), Resolver(hang))
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(src.connections([child.pid])), daemon=True)
    t.start()
    t.join(timeout=20)
    stuck.set()
    src.close()
    assert not t.is_alive() and result == [()]


def test_resolver_failure_keeps_trying_and_marks_down() -> None:
    calls: list[str] = []

    def fail(host: str) -> list[str]:
        calls.append(host)
        raise socket.gaierror(-2, "Name or service not known")

    resolver = Resolver(fail)
    try:
        assert resolver.addresses("bad.test") == frozenset()
        _wait(lambda: calls and not resolver.health.up)
        assert "bad.test" in (resolver.health.last_error or "")
    finally:
        resolver.close()


def _wait(cond: Callable[[], Any], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_cdn_hosts_from_environment() -> None:
    hosts = CdnHosts(["mirror.example:8443"])
    env = {"FLASHINFER_CUBINS_REPOSITORY": "http://Cubins.Internal:8081/artifactory/x/"}
    assert hosts.endpoints(env) == (
        DEFAULT_CDN,
        ("cubins.internal", 8081),
        ("mirror.example", 8443),
    )
    https = {"FLASHINFER_CUBINS_REPOSITORY": "https://edge.urm.nvidia.com/artifactory/"}
    assert hosts.endpoints(https) == (DEFAULT_CDN, ("mirror.example", 8443))
    local = {"FLASHINFER_CUBINS_REPOSITORY": "/opt/cubins"}
    assert hosts.endpoints(local) == (DEFAULT_CDN, ("mirror.example", 8443))
    assert CdnHosts(default=None).endpoints(None) == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("edge.urm.nvidia.com", ("edge.urm.nvidia.com", None)),
        ("Mirror.Example:8080", ("mirror.example", 8080)),
        ("10.0.0.1:443", ("10.0.0.1", 443)),
        ("[::1]:8080", ("::1", 8080)),
        ("[2001:db8::5]", ("2001:db8::5", None)),
        ("2001:db8::5", ("2001:db8::5", None)),
    ],
)
def test_parse_cdn_host(text: str, expected: tuple[str, int | None]) -> None:
    assert parse_cdn_host(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not a host name"),
        ("https://edge.urm.nvidia.com", "not a host name"),
        ("host:0", "1-65535"),
        ("host:http", "1-65535"),
        ("host:70000", "1-65535"),
        ("[::1:80", "unclosed"),
        ("[nothex]:80", "not an IPv6 address"),
        (":80", "has no host"),
    ],
)
def test_parse_cdn_host_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cdn_host(text)


class CountingPsutil:
    """psutil with a count of Process() lookups (the per-process socket walk)."""

    NoSuchProcess = psutil.NoSuchProcess
    AccessDenied = psutil.AccessDenied

    def __init__(self) -> None:
        self.lookups = 0

    def Process(self, pid: int) -> Any:  # noqa: N802 - psutil's name
        self.lookups += 1
        return psutil.Process(pid)


def test_no_process_walk_while_no_socket_table_mentions_a_cdn_address(
    connected_child: Any,
) -> None:
    """The real tables hold the child's socket to 127.0.0.1: walked and found. A CDN address
    that no table mentions: not one process is looked at."""
    proc, port = connected_child
    counting = CountingPsutil()
    here = ConnSource(
        CdnHosts([f"127.0.0.1:{port}"], default=None), Resolver(), psutil_module=counting
    )
    elsewhere = ConnSource(
        CdnHosts(["192.0.2.7:443"], default=None), Resolver(), psutil_module=counting
    )
    try:
        assert [c.port for c in here.connections([proc.pid])] == [port]
        assert counting.lookups == 1
        assert elsewhere.connections([proc.pid]) == ()
        assert counting.lookups == 1 and elsewhere.health.up
    finally:
        here.close()
        elsewhere.close()


def test_unreadable_socket_tables_fall_back_to_the_process_walk(connected_child: Any) -> None:
    proc, port = connected_child
    counting = CountingPsutil()
    source = ConnSource(
        CdnHosts([f"127.0.0.1:{port}"], default=None),
        Resolver(),
        psutil_module=counting,
        net_root="/nonexistent/net",
    )
    try:
        assert [c.port for c in source.connections([proc.pid])] == [port]
        assert counting.lookups == 1
    finally:
        source.close()


def test_bytes_received_read_from_tcp_info(
    silent_listener: tuple[int, list[socket.socket]], connected_child: Any
) -> None:
    """A CDN socket carries the kernel's count of bytes it received (tcp_info over
    NETLINK_SOCK_DIAG): a trickle shows as a count that grows between ticks."""
    child, port = connected_child
    _, accepted = silent_listener
    src = ConnSource(CdnHosts([f"127.0.0.1:{port}"], default=None), Resolver())
    try:
        first = src.connections([child.pid])
        if first and first[0].bytes_received is None:
            pytest.skip("sock_diag tcp_info not available here")
        assert [c.bytes_received for c in first] == [0]
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        accepted[0].sendall(b"x" * 1234)
        deadline = time.monotonic() + 5
        got: list[int | None] = []
        while time.monotonic() < deadline:
            got = [c.bytes_received for c in src.connections([child.pid])]
            if got == [1234]:
                break
            time.sleep(0.02)
        assert got == [1234]
    finally:
        src.close()


def test_bytes_received_none_when_sock_diag_fails(connected_child: Any) -> None:
    from watchdog.sources.tcpdiag import DiagUnavailable

    def broken(ports: object) -> dict[tuple[int, int], int]:
        raise DiagUnavailable("no netlink here")

    child, port = connected_child
    src = ConnSource(CdnHosts([f"127.0.0.1:{port}"], default=None), Resolver(), received=broken)
    try:
        assert [c.bytes_received for c in src.connections([child.pid])] == [None]
        assert src.health.up
    finally:
        src.close()
