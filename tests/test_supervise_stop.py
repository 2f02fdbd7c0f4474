"""Supervise mode stops the server's whole tree, with real processes: a worker that ignores
SIGTERM (vLLM's engine core keeps its GPU memory) is killed even when its parent is gone."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.fakes import SIGS, hang, wait_for
from watchdog.daemon.supervise import Supervisor
from watchdog.outputs.sdnotify import child_environ
from watchdog.remediation.plan import make_plan
from watchdog.remediation.restarters import SuperviseRestarter

# The server: starts a worker, then sleeps (default SIGTERM: it exits) or exits at once.
LEADER = """
import os, subprocess, sys, time
mode, pidfile, worker = sys.argv[1:4]
subprocess.Popen([sys.executable, "-c", worker, pidfile, mode])
while not os.path.exists(pidfile + ".ready"):
    time.sleep(0.02)
if mode == "leader_gone":
    sys.exit(0)
time.sleep(120)
"""
# The worker: ignores SIGTERM; in "own_session" it leaves the server's process group too.
WORKER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[2] == "own_session":
    os.setsid()
open(sys.argv[1], "w").write(str(os.getpid()))
os.rename(sys.argv[1], sys.argv[1] + ".pid")
open(sys.argv[1] + ".ready", "w").write("")
time.sleep(120)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # killed, not yet reaped
    except psutil.NoSuchProcess:
        return True


def start(tmp_path: Path, mode: str) -> tuple[Supervisor, int]:
    mark = tmp_path / "worker"
    sup = Supervisor([sys.executable, "-c", LEADER, mode, str(mark), WORKER],
                     tee_out=io.BytesIO(), tee_err=io.BytesIO())  # fmt: skip
    sup.start()
    wait_for(lambda: Path(f"{mark}.ready").exists())
    return sup, int(Path(f"{mark}.pid").read_text())


def cleanup(sup: Supervisor, worker: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker, signal.SIGKILL)
    if sup.popen is not None and sup.popen.poll() is None:
        sup.popen.kill()
        sup.popen.wait()
    sup.close()


@pytest.mark.parametrize("mode", ["same_group", "own_session", "leader_gone"])
def test_stop_kills_a_worker_that_ignores_sigterm(tmp_path: Path, mode: str) -> None:
    sup, worker = start(tmp_path, mode)
    try:
        if mode == "leader_gone":
            wait_for(lambda: sup.returncode() is not None)
        begun = time.monotonic()
        code = sup.stop(grace_s=1.0)
        assert gone(worker), f"worker {worker} survived stop() ({mode})"
        assert time.monotonic() - begun < 15
        assert code == (0 if mode == "leader_gone" else -signal.SIGTERM)
    finally:
        cleanup(sup, worker)


def test_stop_does_not_wait_the_grace_when_the_tree_exits() -> None:
    sup = Supervisor([sys.executable, "-c", "import time; time.sleep(120)"],
                     tee_out=io.BytesIO(), tee_err=io.BytesIO())  # fmt: skip
    sup.start()
    try:
        begun = time.monotonic()
        assert sup.stop(grace_s=30.0) == -signal.SIGTERM
        assert time.monotonic() - begun < 10
    finally:
        sup.close()


def test_the_supervise_restarter_leaves_no_worker_behind(tmp_path: Path) -> None:
    sup, worker = start(tmp_path, "same_group")
    try:
        plan = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
        assert plan is not None
        old = sup.pid
        result = SuperviseRestarter(sup, grace_s=1.0, child_env=child_environ).restart(plan, old)
        assert gone(worker) and sup.pid != old and "started it again" in result
    finally:
        cleanup(sup, worker)
        if sup.popen is not None:  # the restarted server is a new tree with its own worker
            sup.stop(grace_s=1.0)


def test_a_restart_in_flight_at_shutdown_does_not_start_a_new_server() -> None:
    """SIGTERM to the watchdog while a restart waits out its stop grace: the restart must not
    start a server after the watchdog's own shutdown, which would leave it running unwatched."""
    import threading

    from watchdog.remediation.plan import Plan
    from watchdog.remediation.restarters import RestartError

    stubborn = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').close(); time.sleep(120)"
    )
    ready = Path(tempfile.mkdtemp()) / "ready"
    sup = Supervisor(
        [sys.executable, "-c", stubborn, str(ready)], tee_out=io.BytesIO(), tee_err=io.BytesIO()
    )
    first = sup.start()
    wait_for(ready.exists)  # SIGTERM is ignored from here on
    restarter = SuperviseRestarter(sup, grace_s=1.0, child_env=child_environ)
    outcome: dict[str, object] = {}

    def restart() -> None:
        try:
            outcome["result"] = restarter.restart(Plan("sig", "restart", True), first)
        except RestartError as exc:
            outcome["error"] = str(exc)

    job = threading.Thread(target=restart)
    job.start()
    time.sleep(0.3)  # the restart is inside its stop grace (the server ignores SIGTERM)
    sup.shutdown(1.0)
    job.join(timeout=30)
    assert "shutting down" in str(outcome.get("error")), outcome
    assert sup.starts == 1 and not psutil.pid_exists(first) or _zombie(first)
    with pytest.raises(RuntimeError, match="shutting down"):
        sup.start()
    sup.close()


def _zombie(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True
