"""Faults of the supervised server's process tree (`run -- COMMAND`): a stop signal answered
with vLLM's shutdown lines, and a command that forks a grandchild and exits. The watchdog's
exit code tells the truth, and nothing it started runs on after it."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.faults.harness import QUIET, Watchdog, alive, child_pid, kill_if_alive, wait_for

pytestmark = pytest.mark.slow

OFF = (*QUIET, "--metrics-addr", "off", "--tick-s", "0.2")

# vLLM's API server on SIGTERM: the engine client sees its engine go and logs EngineDeadError
# (vllm/v1/engine/core_client.py), then the server exits 0.
STOPS_LIKE_VLLM = """\
import signal, sys, time
def stop(*_):
    print("ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.", flush=True)
    print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_not_reported_as_the_engines_death(
    tmp_path: Path, sig: signal.Signals
) -> None:
    script = tmp_path / "server.py"
    script.write_text(STOPS_LIKE_VLLM)
    wd = Watchdog(tmp_path, *OFF, "--", sys.executable, str(script))
    child_pid(wd)
    wait_for(lambda: "Starting vLLM API server" in wd.stdout)  # its handler is in place
    wd.signal(sig)
    code = wd.wait(40)
    assert "reporting failure" not in wd.stderr, wd.stderr[-2000:]
    assert code == 0, wd.stderr[-2000:]  # the server's own exit code after our stop
    wd.assert_clean()


def test_an_engine_that_died_before_the_server_exited_0_is_still_a_failure(
    tmp_path: Path,
) -> None:
    """The rule the stop must not trip (vllm #48966) still holds when the server ends itself."""
    script = tmp_path / "server.py"
    script.write_text(
        "import time\nprint('INFO start', flush=True)\ntime.sleep(1)\n"
        "print('vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.',"
        " flush=True)\ntime.sleep(0.5)\n"
    )
    wd = Watchdog(tmp_path, *OFF, "--", sys.executable, str(script))
    assert wd.wait(40) == 1
    assert "exited 0 after its engine died" in wd.stderr


FORKS = {
    # the grandchild stays in the server's process group
    "same_group": "pid = subprocess.Popen(['sleep', '614']).pid",
    # the grandchild leaves the group and the session
    "setsid": "pid = subprocess.Popen(['sleep', '614'], start_new_session=True).pid",
    # the classic daemon: fork, setsid, fork again, the middle one exits (orphan under PID 1)
    "double_fork": (
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode())\n"
        "        os.execvp('sleep', ['sleep', '614'])\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "pid = int(os.read(r, 32))"
    ),
}


@pytest.mark.parametrize("how", sorted(FORKS))
def test_a_grandchild_does_not_outlive_a_server_that_exits(tmp_path: Path, how: str) -> None:
    script, pidfile = tmp_path / "server.py", tmp_path / "helper.pid"
    script.write_text(
        "import os, subprocess, sys, time\n"
        f"{FORKS[how]}\n"
        f"open({str(pidfile)!r}, 'w').write(str(pid))\n"
        "print('INFO started a helper', flush=True)\n"
        "time.sleep(1)\n"
    )
    wd = Watchdog(tmp_path, *OFF, "--", sys.executable, str(script))
    child_pid(wd)
    helper = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=20))
    try:
        code = wd.wait(60)
        assert code == 0, wd.stderr[-2000:]
        wait_for(lambda: not alive(helper), timeout=10)
        assert "stopping what it left running" in wd.stderr
        wd.assert_clean()
    finally:
        kill_if_alive([helper])


def test_a_stop_signal_during_a_stack_capture_is_the_servers_own_exit(tmp_path: Path) -> None:
    """The simulated vLLM hangs, the watchdog dumps it with a py-spy that never finishes, and
    SIGTERM arrives mid-dump: py-spy is killed first (it would hold the server paused through
    its grace and outlive the watchdog), the server stops, and no failure is invented."""
    from tests.fakes import SHORT, SIM, workdir

    pidfile = tmp_path / "pyspy.pid"
    pyspy = tmp_path / "py-spy"
    pyspy.write_text(
        f"#!{sys.executable}\nimport os, time\n"
        f"open({str(pidfile)!r}, 'a').write(f'{{os.getpid()}}\\n')\ntime.sleep(600)\n"
    )
    pyspy.chmod(0o755)
    gpu = tmp_path / "gpu.jsonl"
    child = [*SIM, "--scenario", "kernel_deadlock", "--mode", "bench", "--startup-s", "1"]
    child += ["--gpu-file", str(gpu), "--cc", "10.0", "--workdir", str(workdir(tmp_path))]
    wd = Watchdog(
        tmp_path, "--no-cdn-default", "--metrics-addr", "off", "--gpu-source", f"file:{gpu}",
        *SHORT, "--pyspy", str(pyspy), "--stack-deadline-s", "120", "--", *child,
    )  # fmt: skip
    pids: list[int] = []
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=120)
        pids = [int(x) for x in pidfile.read_text().split()]
        wd.signal(signal.SIGTERM)
        code = wd.wait(60)
        assert "reporting failure" not in wd.stderr, wd.stderr[-3000:]
        assert code in (0, 128 + signal.SIGTERM), wd.stderr[-3000:]
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10)
        wd.assert_clean()
    finally:
        kill_if_alive(pids)
