"""systemd notify in the loop: READY then WATCHDOG pings per completed loop, never from a stuck one.

A real AF_UNIX datagram socket bound by the test stands in for systemd's NOTIFY_SOCKET
(sd_notify(3)); the watchdog runs as a real process, or in-process for the stuck-loop case.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simfixtures import sim_env, stop_process
from watchdog.config import build_config
from watchdog.core.state.tick import Tick
from watchdog.daemon.wiring import build
from watchdog.outputs.sdnotify import Notifier


class NotifySocket:
    """A bound datagram socket that collects what the watchdog sends."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="hwn-", dir="/tmp")  # AF_UNIX paths max ~108 bytes
        self.path = str(Path(self.dir) / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []

    def drain(self, seconds: float) -> list[str]:
        """Collect datagrams for `seconds`; returns the ones received in that time."""
        got: list[str] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))
            got.append(data.decode())
        return got

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in m for m in self.drain(0.2)):
                return
        raise AssertionError(f"no {text!r} datagram within {timeout} s: {self.messages[-5:]}")

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()


def start_run(tmp_path: Path, notify: NotifySocket, *args: str) -> subprocess.Popen[bytes]:
    log = tmp_path / "server.log"
    log.write_text("", encoding="utf-8")
    argv = [sys.executable, "-m", "watchdog", "run", "--metrics-addr", "off", "--no-cdn-default"]
    argv += ["--log-file", str(log), "--no-stacks", *args]
    env = {**sim_env(), "NOTIFY_SOCKET": notify.path}
    with open(tmp_path / "wd.err", "wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_run_sends_ready_then_watchdog_pings(tmp_path: Path, notify: NotifySocket) -> None:
    proc = start_run(tmp_path, notify, "--gpu-source", "none", "--tick-s", "0.2")
    try:
        notify.wait_for("READY=1")
        later = notify.drain(3.0)
    finally:
        stop_process(proc)
    texts = [m for _, m in notify.messages]
    ready_at = next(i for i, m in enumerate(texts) if "READY=1" in m)
    assert not any("WATCHDOG=1" in m for m in texts[:ready_at]), texts[: ready_at + 1]
    assert sum("WATCHDOG=1" in m for m in later) >= 3, later


class _Silent:
    """A loopback HTTP 'exporter' that accepts connections and never answers."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stopped = threading.Event()
        self.server.settimeout(0.2)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.server.close()


@pytest.mark.slow
def test_hanging_gpu_source_is_isolated_and_pings_continue(
    tmp_path: Path, notify: NotifySocket
) -> None:
    silent = _Silent()
    url = f"dcgm:http://127.0.0.1:{silent.port}/metrics"
    proc = start_run(tmp_path, notify, "--gpu-source", url, "--tick-s", "0.5")
    try:
        notify.wait_for("READY=1", timeout=60)
        pings = [m for m in notify.drain(10.0) if "WATCHDOG=1" in m]
    finally:
        stop_process(proc)
        silent.close()
    stderr = (tmp_path / "wd.err").read_text(encoding="utf-8")
    assert silent.held, "the watchdog never connected to the silent exporter"
    assert "source gpu is down" in stderr, stderr[-2000:]
    assert len(pings) >= 3, (pings, stderr[-2000:])


class _Blocker:
    """A hook that blocks the loop inside on_tick while `hold` is set."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.release = threading.Event()
        self.blocked = threading.Event()

    def on_tick(self, tick: Tick) -> None:
        if self.hold.is_set():
            self.blocked.set()
            self.release.wait(timeout=60)
            self.hold.clear()


@pytest.mark.slow
def test_pings_stop_while_the_loop_is_stuck(
    tmp_path: Path, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "server.log"
    log.write_text("", encoding="utf-8")
    cfg = build_config(
        {
            "log_files": [str(log)],
            "gpu_source": "none",
            "metrics_addr": "off",
            "cdn_default": False,
            "stacks": False,
            "tick_s": 0.1,
        }
    )
    monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
    assert Notifier.from_env().enabled
    built = build(cfg)
    blocker = _Blocker()
    built.daemon.hooks.append(blocker)
    halt = threading.Event()
    loop = threading.Thread(target=built.daemon.run, kwargs={"stop": halt}, daemon=True)
    loop.start()
    try:
        notify.wait_for("READY=1", timeout=30)
        assert any("WATCHDOG=1" in m for m in notify.drain(1.0))
        blocker.hold.set()
        assert blocker.blocked.wait(timeout=30)
        notify.drain(0.3)  # a ping already in flight before the block
        assert [m for m in notify.drain(2.0) if "WATCHDOG=1" in m] == []
        blocker.release.set()
        notify.wait_for("WATCHDOG=1", timeout=30)
    finally:
        blocker.release.set()
        halt.set()
        loop.join(timeout=30)
        built.close()
    assert not loop.is_alive()


@pytest.mark.slow
def test_a_tick_too_slow_for_watchdogsec_is_refused(tmp_path: Path, notify: NotifySocket) -> None:
    # WatchdogSec=1 means a ping every 0.5 s; a 1 s loop would be killed over and over.
    log = tmp_path / "server.log"
    log.write_text("", encoding="utf-8")
    argv = [sys.executable, "-m", "watchdog", "run", "--metrics-addr", "off", "--no-cdn-default"]
    argv += ["--no-stacks", "--gpu-source", "none", "--log-file", str(log), "--tick-s", "1"]
    env = {**sim_env(), "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "key 'tick_s'" in done.stderr and "WatchdogSec=" in done.stderr
    assert not any("READY=1" in m for _, m in notify.messages)


def test_the_loop_lag_is_how_late_a_tick_started() -> None:
    """A tick that starts late (a starved watchdog, a slow tick before it) shows as lag."""
    import threading

    from watchdog.config import build_config
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.core.model import Verdict
    from watchdog.daemon.loop import Daemon

    offset = [0.0]
    clock = lambda: time.monotonic() + offset[0]  # noqa: E731
    daemon = Daemon(build_config({"tick_s": 0.2}), load_signatures(), [], clock=clock)
    lags: list[float] = []
    stop = threading.Event()

    def tick() -> Verdict:
        lags.append(daemon.stats.last_lag_s)
        if len(lags) == 2:
            offset[0] += 1.5  # the second tick takes 1.5 s: the third starts 1.3 s late
        if len(lags) == 4:
            stop.set()
        return Verdict(state="idle")

    daemon.tick = tick  # type: ignore[method-assign]
    daemon.run(stop=stop)
    assert lags[0] == 0.0 and lags[1] < 0.1
    assert 1.2 < lags[2] < 1.45, lags
    assert lags[3] < 0.1, lags
