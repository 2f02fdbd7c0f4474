"""End to end, `run`: supervising a command (`run -- COMMAND`) and following a `--match` target.

Real processes and real py-spy; only the GPU is a fake (the simulator's JSON Lines file).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import simfixtures
from tests.fakes import SHORT, SIM, workdir
from tests.simfixtures import SimHandle, sim_env

pytestmark = pytest.mark.slow  # real watchdog and simulator processes

sim_factory = simfixtures.sim_factory  # fixture, used by name

SHORT += ["--gpu-spin-for-s", "4"]
DEADLINE_S = 120.0  # generous: a loaded 2-core machine must not fail a run that works


class Watchdog:
    """A `python -m watchdog run ...` process with its stdout and stderr in files."""

    def __init__(self, tmp_path: Path, args: Sequence[str], command: Sequence[str] = ()) -> None:
        self.out_path, self.err_path = tmp_path / "wd.out", tmp_path / "wd.err"
        argv = [
            sys.executable,
            "-m",
            "watchdog",
            "run",
            "--metrics-addr",
            "off",
            "--no-cdn-default",
        ]
        argv += list(args) + (["--", *command] if command else [])
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=sim_env(), cwd=tmp_path)

    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The JSON objects on stderr (with `--log-format json`); other lines are the child's."""
        out = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait_for(self, cond: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
        """Poll `cond` until it returns something truthy; fail with the stderr tail otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            found = cond()
            if found:
                return found
            if time.monotonic() > deadline or self.proc.poll() is not None:
                tail = self.stderr()[-3000:]
                raise AssertionError(
                    f"no {what} (watchdog exit {self.proc.poll()}); stderr:\n{tail}"
                )
            time.sleep(0.2)

    def wait(self, timeout: float = DEADLINE_S) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Cleanup: the watchdog and anything it left running."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in [*procs]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                continue
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def hang_verdict(wd: Watchdog, signature: str) -> dict[str, Any] | None:
    for ev in wd.events():
        hung = ev.get("event") == "state" and ev.get("new") == "hung"
        if hung and ev["verdict"]["signature"] == signature:
            return ev["verdict"]
    return None


def test_supervise_reports_hang_passes_output_and_stops_child_on_sigterm(tmp_path: Path) -> None:
    """`run -- sim`: child output passes through, the hang is named, SIGTERM stops both."""
    gpu = tmp_path / "gpu.jsonl"
    child = [*SIM, "--scenario", "kernel_deadlock", "--mode", "bench", "--startup-s", "1"]
    # --cc 10.0: gpu_kernel_spin needs no package facts (their lookup is asynchronous).
    child += ["--gpu-file", str(gpu), "--cc", "10.0"]
    child += ["--workdir", str(workdir(tmp_path))]
    wd = Watchdog(tmp_path, ["--gpu-source", f"file:{gpu}", *SHORT, "--log-format", "json"], child)
    try:
        verdict = wd.wait_for(lambda: hang_verdict(wd, "gpu_kernel_spin"), "hang verdict")
        assert {e["source"] for e in verdict["evidence"]} >= {"gpu", "progress"}, verdict
        tree = psutil.Process(wd.proc.pid).children(recursive=True)
        assert tree, "the supervised child should still be running while hung"
        assert "Loading weights took" in wd.stdout()  # the child's stdout, passed through
        assert "Loading safetensors checkpoint shards" in wd.stderr()  # the child's stderr
        wd.proc.send_signal(signal.SIGTERM)
        wd.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not all(gone(p.pid) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.pid for p in tree if not gone(p.pid)] == [], "child tree outlived the watchdog"
    finally:
        wd.kill()


def test_supervise_passes_through_exit_code(tmp_path: Path) -> None:
    """A child that exits on its own ends the watchdog with the same exit code."""
    wd = Watchdog(
        tmp_path, ["--gpu-source", "none"], [sys.executable, "-c", "import sys; sys.exit(3)"]
    )
    try:
        assert wd.wait(timeout=60) == 3, wd.stderr()[-2000:]
    finally:
        wd.kill()


def test_supervise_healthy_bench_finishes_with_zero(tmp_path: Path) -> None:
    """A healthy benchmark runs to the end under the watchdog: exit 0, no hang reported."""
    gpu = tmp_path / "gpu.jsonl"
    child = [*SIM, "--scenario", "healthy", "--mode", "bench", "--startup-s", "1", "--bench-s", "3"]
    child += ["--gpu-file", str(gpu), "--workdir", str(workdir(tmp_path))]
    wd = Watchdog(tmp_path, ["--gpu-source", f"file:{gpu}", *SHORT, "--log-format", "json"], child)
    try:
        assert wd.wait(timeout=DEADLINE_S) == 0, wd.stderr()[-3000:]
        assert "Throughput:" in wd.stdout() + wd.stderr()
        bad = [e["message"] for e in wd.events() if e.get("new") in ("hung", "stalled")]
        assert bad == []
    finally:
        wd.kill()


def incident_path(wd: Watchdog, signature: str) -> str | None:
    """The path of the first incident bundle written for `signature`, from the JSON stderr."""
    for ev in wd.events():
        if ev.get("event") == "incident" and ev.get("signature") == signature and ev.get("path"):
            return str(ev["path"])
    return None


def mentions(verdict: dict[str, Any], pids: set[int]) -> set[int]:
    """The pids in `pids` that the verdict's evidence names."""
    text = " ".join(e["detail"] for e in verdict["evidence"])
    return {p for p in pids if f"pid {p} " in text or f"pid {p})" in text}


def tree_pids(sim: SimHandle) -> set[int]:
    try:
        return {sim.pid} | {c.pid for c in psutil.Process(sim.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {sim.pid}


def test_match_follows_a_restarted_target(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    """`run --match`: the first server is killed, a new one starts; the hang names the new pid."""
    token = f"e2e-match-{time.monotonic_ns()}"
    shared = ["--log-file", str(tmp_path / "shared.log"), "--gpu-file", str(tmp_path / "gpu.jsonl")]
    shared += ["--model", f"sim/{token}"]
    args = ["--match", token, "--log-file", str(tmp_path / "shared.log")]
    args += ["--gpu-source", f"file:{tmp_path / 'gpu.jsonl'}", *SHORT, "--log-format", "json"]
    args += ["--incident-dir", str(tmp_path / "inc")]
    first = sim_factory("healthy", mode="serve", extra_args=[*shared, "--load", "2"])
    wd = Watchdog(tmp_path, args)
    try:
        wd.wait_for(lambda: any(e.get("new") == "serving" for e in wd.events()), "serving state")
        old = tree_pids(first)
        first.stop()
        seen = len(wd.events())
        second = sim_factory("kernel_deadlock", extra_args=[*shared, "--cc", "10.0"])
        second.engine_pid()
        wd.wait_for(lambda: hang_verdict(wd, "gpu_kernel_spin"), "hang verdict")
        path = wd.wait_for(lambda: incident_path(wd, "gpu_kernel_spin"), "incident bundle")
        assert len(wd.events()) > seen
        incident = json.loads((Path(path) / "incident.json").read_text(encoding="utf-8"))
        assert incident["environment"]["target_pid"] == second.pid, incident["environment"]
        new = tree_pids(second)
        dumped = {p["pid"] for p in incident["capture"]["pids"]}
        assert dumped and dumped <= new and not dumped & old, (dumped, new, old)
        assert not mentions(incident["verdict"], old), incident["verdict"]["evidence"]
    finally:
        wd.kill()
