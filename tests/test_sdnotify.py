"""The sd_notify client against a real AF_UNIX datagram socket, as systemd would bind it."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from watchdog.outputs.sdnotify import Notifier, child_environ

RECV_TIMEOUT_S = 20.0


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd's notify socket."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(RECV_TIMEOUT_S)
    yield sock, path
    sock.close()


def _recv(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def _nothing_pending(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(4096)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(RECV_TIMEOUT_S)
    return False


def test_messages_reach_the_socket_in_order(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    notifier.ready("watching pid 42")
    notifier.watchdog()
    notifier.status("state=serving")
    notifier.stopping()
    assert _recv(sock) == {"READY": "1", "STATUS": "watching pid 42"}
    assert _recv(sock) == {"WATCHDOG": "1"}
    assert _recv(sock) == {"STATUS": "state=serving"}
    assert _recv(sock) == {"STOPPING": "1"}


def test_ready_without_status_sends_only_ready(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    Notifier.from_env({"NOTIFY_SOCKET": path}).ready()
    assert _recv(sock) == {"READY": "1"}


def test_newline_in_status_cannot_inject_an_assignment(
    listener: tuple[socket.socket, str],
) -> None:
    sock, path = listener
    Notifier.from_env({"NOTIFY_SOCKET": path}).status("hung\nWATCHDOG=1")
    assert _recv(sock) == {"STATUS": "hung WATCHDOG=1"}


def test_abstract_socket_address() -> None:
    name = f"hang-watchdog-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(RECV_TIMEOUT_S)
        Notifier.from_env({"NOTIFY_SOCKET": "@" + name}).watchdog()
        assert _recv(sock) == {"WATCHDOG": "1"}


def test_unset_socket_is_a_silent_no_op(listener: tuple[socket.socket, str]) -> None:
    sock, _ = listener
    notifier = Notifier.from_env({})
    assert not notifier.enabled
    notifier.ready("x")
    notifier.watchdog()
    assert _nothing_pending(sock)


def test_send_failure_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with caplog.at_level(logging.WARNING, logger="hang_watchdog.sdnotify"):
        for _ in range(5):
            notifier.watchdog()
    failures = [r for r in caplog.records if "sd_notify" in r.getMessage()]
    assert len(failures) == 1
    assert "gone.sock" in failures[0].getMessage()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "OWN"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "OTHER"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    own = os.getpid()
    resolved = {k: {"OWN": str(own), "OTHER": str(own + 1)}.get(v, v) for k, v in environ.items()}
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "/nonexistent", **resolved})
    assert notifier.watchdog_interval_s() == expected


def test_child_environ_drops_only_notify_variables() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    assert child_environ(env) == {"PATH": "/bin"}


def test_real_process_started_with_notify_env(listener: tuple[socket.socket, str]) -> None:
    """A separate process reads its own environment, as it would under systemd."""
    sock, path = listener
    code = (
        "from watchdog.outputs.sdnotify import Notifier\n"
        "n = Notifier.from_env()\n"
        "n.ready('pid-check')\n"
        "n.status(str(n.watchdog_interval_s()))\n"
    )
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert _recv(sock) == {"READY": "1", "STATUS": "pid-check"}
    assert _recv(sock) == {"STATUS": "2.0"}
