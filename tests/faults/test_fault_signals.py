"""Faults: signals to a supervising watchdog, and a server that lies with its exit code."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tests.faults.harness import QUIET, Watchdog, alive, child_pid, kill_if_alive, wait_for

pytestmark = pytest.mark.slow

OFF = (*QUIET, "--metrics-addr", "off", "--tick-s", "0.2")
# A server that ignores SIGTERM (a stuck engine core does): only SIGKILL ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(612)"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_stop_signal_stops_the_server_and_says_so(tmp_path: Path, sig: signal.Signals) -> None:
    wd = Watchdog(tmp_path, *OFF, "--", "sleep", "612")
    pid = child_pid(wd)
    wd.signal(sig)
    code = wd.wait(30)
    assert f"{sig.name} received: stopping the server (pid {pid}" in wd.stderr
    assert not alive(pid), "the supervised server outlived the watchdog"
    assert code == 128 + signal.SIGTERM  # the server's own code: it died of our SIGTERM
    wd.assert_clean()


def test_sigkill_of_the_watchdog_kills_the_server(tmp_path: Path) -> None:
    wd = Watchdog(tmp_path, *OFF, "--", "sleep", "612")
    pid = child_pid(wd)
    wd.signal(signal.SIGKILL)
    wd.wait(10)
    try:
        wait_for(lambda: not alive(pid), timeout=10)
    finally:
        kill_if_alive([pid])


def test_sigkill_kills_a_server_restarted_from_another_thread(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG follows the forking thread: a start from a thread that has since
    ended must not kill the server, and the watchdog's death still must."""
    import io
    import threading

    from watchdog.daemon.supervise import Supervisor

    sup = Supervisor(["sleep", "612"], tee_out=io.BytesIO(), tee_err=io.BytesIO())
    t = threading.Thread(target=sup.start)
    t.start()
    t.join()
    time.sleep(0.3)
    try:
        assert sup.returncode() is None, "the server died with the thread that started it"
    finally:
        sup.shutdown(2)
        sup.close()


def test_second_signal_hurries_the_stop(tmp_path: Path) -> None:
    wd = Watchdog(tmp_path, *OFF, "--stop-grace-s", "60", "--", sys.executable, "-c", STUBBORN)
    pid = child_pid(wd)
    time.sleep(0.5)  # the child has installed its SIG_IGN
    wd.signal(signal.SIGINT)
    wd.wait_line("SIGINT received: stopping the server")
    began = time.monotonic()
    wd.signal(signal.SIGINT)
    code = wd.wait(30)  # well inside the 60 s grace
    took = time.monotonic() - began
    assert "killing the server now" in wd.stderr
    assert not alive(pid)
    assert code == 128 + signal.SIGKILL
    assert took < 30
    wd.assert_clean()


def test_secret_on_the_command_line_is_not_logged(tmp_path: Path) -> None:
    token = "hf_" + "Ab3dE" * 6
    wd = Watchdog(tmp_path, *OFF, "--", "env", f"HF_TOKEN={token}", "API_KEY=s3cr3t", "true")
    wd.wait(30)
    err = wd.stderr
    assert "HF_TOKEN=<redacted>" in err and "API_KEY=<redacted>" in err
    assert token not in err and "s3cr3t" not in err
    wd.assert_clean()


ENGINE_DIES_EXIT_0 = (
    "import sys; print('ERROR [core.py:1] EngineCore encountered a fatal error.', flush=True);"
    "print('vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.',"
    " file=sys.stderr, flush=True); sys.exit(0)"
)


def test_exit_0_after_the_engine_died_is_a_failure(tmp_path: Path) -> None:
    wd = Watchdog(tmp_path, *OFF, "--", sys.executable, "-c", ENGINE_DIES_EXIT_0)
    assert wd.wait(30) == 1
    assert "exited 0 after its engine died" in wd.stderr
    wd.assert_clean()


def test_clean_exit_0_passes_through(tmp_path: Path) -> None:
    wd = Watchdog(tmp_path, *OFF, "--", sys.executable, "-c", "print('bye')")
    assert wd.wait(30) == 0
    wd.assert_clean()
