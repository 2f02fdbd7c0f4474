"""Faults of the fleet Prometheus while `--remediate` is on in cause mode: a Prometheus on
127.0.0.1 that accepts and never answers, trickles its answer a byte a second, or answers JSON
of the wrong shape or none at all. No node restarts on it, the loop's tick never waits on it,
the reason is said once per outage, and the query thread always ends at its deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fakes import FakeDaemon, hang, make_hook, obs
from watchdog.remediation.machine import Phase

pytestmark = pytest.mark.slow

BODY = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
ANSWERS = {
    "silent": None,
    "trickle": BODY,
    "not_json": b"<html>502 Bad Gateway</html>",
    "wrong_shape": b'{"status": "success", "data": {"result": [{"metric": 1, "value": "x"}]}}',
    "a_list": b"[1, 2, 3]",
    "truncated": BODY[:30],
}


class StubPrometheus:
    """Answers every request on 127.0.0.1 the way `mode` says."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.requests += 1
                body = ANSWERS[self.mode]
                if body is None:
                    self._stop.wait(60)
                    return
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(ANSWERS["trickle"]))
                if self.mode == "trickle":
                    for i in range(len(body)):
                        if self._stop.wait(1.0):
                            return
                        conn.sendall(body[i : i + 1])
                else:
                    conn.sendall(body)
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._srv.close()


@pytest.fixture
def prom(request: pytest.FixtureRequest) -> Iterator[StubPrometheus]:
    stub = StubPrometheus(request.param)
    yield stub
    stub.stop()


@pytest.mark.parametrize("prom", sorted(ANSWERS), indirect=True)
def test_a_broken_fleet_prometheus_never_restarts_nor_stalls(
    tmp_path: Path, prom: StubPrometheus
) -> None:
    hook, restarter, _ = make_hook(
        tmp_path, deployment="llama-405b", fleet_prometheus_url=prom.url, fleet_settle_s=0,
        dry_run=False,
    )  # fmt: skip
    assert hook.fleet is not None
    daemon = FakeDaemon({"vllm": "0.14.0"})
    cause = replace(hang(), cause_rank=5, cause_role="Worker")
    slowest = 0.0
    began = time.monotonic()
    t = 0.0
    while time.monotonic() - began < 8:  # past the 3 s query deadline, twice
        tick = time.monotonic()
        hook.on_tick(daemon.tick(obs(t), cause))
        slowest = max(slowest, time.monotonic() - tick)
        t += 0.2
        time.sleep(0.2)
    assert restarter.calls == [] and hook.machine.phase is Phase.WATCHING
    assert slowest < 0.5, f"a tick waited {slowest:.2f} s on Prometheus"
    assert prom.requests >= 1
    hook.fleet.wait(6)  # the query thread ends at its deadline, even against a trickle
    assert hook.fleet._thread is not None and not hook.fleet._thread.is_alive()
    out = daemon.out.getvalue()
    said = [line for line in out.splitlines() if "did not answer" in line]
    assert len(said) <= 1, out  # one line per outage, not one per tick or per round
    assert "Traceback" not in out
