"""Faults: a py-spy that misbehaves (wrong JSON shapes, non-UTF-8 bytes, exit 1, hangs) run
as a real executable against a real Python process. The capture always returns a result that
says what happened, never a traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import alive, kill_if_alive, wait_for
from watchdog.core.model import ProcInfo
from watchdog.sources.stacks.capture import StackCapturer

pytestmark = pytest.mark.slow


def fake_pyspy(tmp_path: Path, body: str) -> str:
    """An executable named py-spy that runs `body` (Python) whatever it is asked."""
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def target() -> Iterator[ProcInfo]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield ProcInfo(proc.pid, os.getpid(), "python", "python -c sleep")
    finally:
        proc.kill()
        proc.wait()


CASES = {
    "frames_not_a_list": ("print('[{\"frames\": 1}]')", "malformed field"),
    "frame_line_object": (
        'print(\'[{"thread_id": 1, "frames": [{"name": "f", "line": {"x": 1}}]}]\')',
        "malformed field",
    ),
    "huge_thread_id": ('print(\'[{"thread_id": 1' + "0" * 400 + "}]')", "malformed field"),
    "nested_json": ("print('[' * 100000 + ']' * 100000)", "py-spy"),
    "not_a_list": ("print('{\"threads\": []}')", "not a list of thread objects"),
    "truncated_json": ('print(\'[{"thread_id": 1, "fr\')', "invalid JSON"),
    "exit_1_no_output": ("sys.exit(1)", "py-spy"),
    "exit_1_not_python": (
        "print('Error: Failed to find python version from target process', file=sys.stderr);"
        " sys.exit(1)",
        "exit 1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_misbehaving_pyspy_gives_a_result_that_says_why(
    tmp_path: Path, target: ProcInfo, case: str
) -> None:
    body, needle = CASES[case]
    cap = StackCapturer(pyspy=fake_pyspy(tmp_path, body), deadline_s=10, second_after_s=-1)
    result = cap.capture_now([target])
    assert result.result != "ok"
    assert needle in result.reason, result.reason


def test_non_utf8_output_keeps_the_dump(tmp_path: Path, target: ProcInfo) -> None:
    """A stray non-UTF-8 byte in py-spy's JSON (a frame name it copied raw) is replaced, and
    the dump, its frames and the text rendered from it are kept."""
    good = (
        b'[{"pid": 1, "thread_id": 7, "thread_name": "MainThread", "active": true,'
        b' "frames": [{"name": "wait\xff\xfe", "filename": "x.py", "line": 3}]}]'
    )
    body = "out = sys.stdout.buffer\nout.write(" + repr(good) + ")\n"
    cap = StackCapturer(pyspy=fake_pyspy(tmp_path, body), deadline_s=10, second_after_s=-1)
    result = cap.capture_now([target])
    assert result.result == "ok", result.reason
    (sample,) = result.samples
    assert sample.threads[0].frames[0].name == "wait\ufffd\ufffd"
    assert "wait\ufffd\ufffd (x.py:3)" in result.raw_text[target.pid]


def test_a_hanging_pyspy_is_killed_at_its_deadline(tmp_path: Path, target: ProcInfo) -> None:
    cap = StackCapturer(
        pyspy=fake_pyspy(tmp_path, "time.sleep(600)"), deadline_s=1.0, second_after_s=-1
    )
    began = time.monotonic()
    result = cap.capture_now([target])
    assert result.result == "timeout" and "deadline" in result.reason
    assert time.monotonic() - began < 10


def test_a_helper_that_left_pyspys_group_is_killed_with_it(
    tmp_path: Path, target: ProcInfo
) -> None:
    """py-spy forks a helper that calls setsid (its own group and session), then hangs: the
    group kill misses the helper; the capture still kills it (its environment's tag)."""
    pidfile = tmp_path / "helper.pid"
    body = (
        "import subprocess\n"
        "p = subprocess.Popen(['sleep', '615'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)"
    )
    cap = StackCapturer(pyspy=fake_pyspy(tmp_path, body), deadline_s=2.0, second_after_s=-1)
    result = cap.capture_now([target])
    helper = int(pidfile.read_text())
    try:
        assert result.result == "timeout"
        wait_for(lambda: not alive(helper), timeout=5)
    finally:
        kill_if_alive([helper])


def test_a_helper_left_behind_by_a_pyspy_that_finished_is_killed(
    tmp_path: Path, target: ProcInfo
) -> None:
    pidfile = tmp_path / "helper.pid"
    body = (
        "import subprocess\n"
        "p = subprocess.Popen(['sleep', '615'], start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('[]')"
    )
    cap = StackCapturer(pyspy=fake_pyspy(tmp_path, body), deadline_s=10.0, second_after_s=-1)
    cap.capture_now([target])
    helper = int(pidfile.read_text())
    try:
        wait_for(lambda: not alive(helper), timeout=5)
    finally:
        kill_if_alive([helper])


def test_shutdown_kills_a_capture_in_flight(tmp_path: Path, target: ProcInfo) -> None:
    """A stop signal during a dump: py-spy (its own session) and its helpers must not outlive
    the watchdog, nor hold the server paused through its grace."""
    pidfile = tmp_path / "pyspy.pid"
    body = (
        "import os, subprocess\n"
        "p = subprocess.Popen(['sleep', '617'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
        "time.sleep(600)"
    )
    cap = StackCapturer(pyspy=fake_pyspy(tmp_path, body), deadline_s=60.0, second_after_s=-1)
    assert cap.start([target])
    pids = [int(x) for x in wait_for(lambda: pidfile.exists() and pidfile.read_text()).split()]
    try:
        began = time.monotonic()
        cap.close()
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout=5)
        wait_for(lambda: not cap.busy(), timeout=10)
        assert time.monotonic() - began < 10
        result = cap.poll()
        assert result is not None and result.result != "ok"
    finally:
        kill_if_alive(pids)
