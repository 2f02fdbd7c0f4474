"""What each part of a daemon tick costs: every source's poll, classify and each hook, timed
in-process on a daemon built by the same wiring `hang-watchdog run` uses (bench_daemon.py).

CPU is the polling thread's own (`time.thread_time`, read inside the call, so a poll that runs
on its deadline worker is charged to that worker); wall is the call's elapsed time, which
includes waiting for the server's answer. The rest of a tick (handing each poll to its worker
thread, building the Observation, the window) shows as the difference between the process's
CPU per tick and the sum of the parts.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import watchdog.daemon.loop as loop_module
from watchdog.commands.cli import build_parser, config_from_args
from watchdog.daemon.wiring import build

# The server source's poll, in parts: the /metrics scrape and parse, /health, the socket dump.
SERVER_PARTS = (
    ("_scrape_metrics", "  server: /metrics"),
    ("_health_status", "  server: /health"),
    ("_inflight", "  server: unanswered (tcpdiag)"),
)


@dataclass
class Costs:
    """(thread CPU s, wall s) of each timed call, by part name, in first-seen order."""

    calls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    recording: bool = False

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.recording:
                    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
                    self.calls.setdefault(name, []).append((cpu, wall))

        return call


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def tick_costs(run_argv: list[str], warmup_s: float, seconds: float) -> tuple[Costs, float, int]:
    """Build `run ARGV`'s daemon in this process, tick it at its tick for warmup_s + seconds;
    (the costs of the measured ticks, process CPU seconds over them, ticks measured)."""
    cfg = config_from_args(build_parser().parse_args(["run", *run_argv]))
    built = build(cfg)
    daemon = built.daemon
    costs = Costs()
    for src in daemon.sources:  # Polled calls source.poll: the instance attribute wins
        src.poll = costs.timed(f"source {src.name}", src.poll)  # type: ignore[method-assign]
    server = daemon.source("server")
    for attr, part in SERVER_PARTS:  # within the server's poll, where they exist
        if server is not None and hasattr(server, attr):
            obj = getattr(server, attr)
            if part.endswith("(tcpdiag)"):  # InflightRequests.poll
                obj.poll = costs.timed(part, obj.poll)
            else:
                setattr(server, attr, costs.timed(part, obj))
    for hook in daemon.hooks:
        hook.on_tick = costs.timed(f"hook {type(hook).__name__}", hook.on_tick)  # type: ignore[method-assign]
    # On the loop thread, observe() is what the polls cost it: each hand-off to a worker and
    # the run-queue read before it (deadline.py), then building the Observation.
    daemon.observe = costs.timed("observe (loop thread)", daemon.observe)  # type: ignore[method-assign]
    daemon.window.append = costs.timed("window.append", daemon.window.append)  # type: ignore[method-assign]
    classify = loop_module.classify
    loop_module.classify = costs.timed("classify", classify)  # type: ignore[assignment]
    tick = daemon.tick
    daemon.tick = costs.timed("whole tick (loop thread)", tick)  # type: ignore[method-assign]
    try:
        if built.server is not None:
            built.server.start()
        daemon.run(max_seconds=warmup_s)
        costs.recording = True
        n0, p0 = daemon.stats.iterations, time.process_time()
        daemon.run(max_seconds=seconds)
        return costs, time.process_time() - p0, daemon.stats.iterations - n0
    finally:
        loop_module.classify = classify
        built.close()


def report(costs: Costs, process_cpu_s: float, ticks: int) -> list[str]:
    """One line per part: calls, CPU mean and p90 ms, wall mean and p90 ms."""
    lines = [
        f"{'part':<34} {'calls':>5} {'CPU ms':>7} {'p90':>6} {'wall ms':>8} {'p90':>6}",
    ]
    for name, calls in costs.calls.items():
        cpu = [c * 1000 for c, _ in calls]
        wall = [w * 1000 for _, w in calls]
        lines.append(
            f"{name:<34} {len(calls):>5} {sum(cpu) / len(cpu):>7.3f} {_p90(cpu):>6.3f} "
            f"{sum(wall) / len(wall):>8.3f} {_p90(wall):>6.3f}"
        )
    per_tick = process_cpu_s / max(ticks, 1) * 1000
    lines.append(
        f"process CPU per tick (every thread): {per_tick:.3f} ms over {ticks} ticks "
        f"= {process_cpu_s / max(ticks, 1) * 100:.2f} % of a core at 1 Hz"
    )
    return lines


# Holds n connections open until its standard input closes; prints the listener's port.
_HOLDER = """
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1024)
held = []
for _ in range(int(sys.argv[1])):
    held.append(socket.create_connection(srv.getsockname()))
    held.append(srv.accept()[0])
print(srv.getsockname()[1], flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def host_connections(n: int) -> Iterator[int]:
    """n idle established TCP connections on 127.0.0.1 (2n sockets in the host's table, as on
    a busy server), held by a child process until the block ends (in this process they would
    be the in-process daemon's own descriptors); yields the listener's port (0 when n is 0)."""
    if n <= 0:
        yield 0
        return
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        yield int(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()
