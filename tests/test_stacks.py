"""Stack capture with real py-spy against real blocked processes, and every way it can fail."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from stackprocs.spawn import start_target, stop

from tests.tickkit import TickKit
from watchdog.core.model import Frame, ProcInfo, ThreadStack
from watchdog.sources.stacks.capture import (
    CaptureResult,
    StackCapturer,
    preflight_pyspy,
    resolve_pyspy,
)
from watchdog.sources.stacks.parse import DumpParseError, mark_unchanged, parse_dump_json

REAL_PYSPY = resolve_pyspy(None)
needs_pyspy = pytest.mark.skipif(REAL_PYSPY is None, reason="py-spy is a test dependency")


def _proc(p: subprocess.Popen[str], title: str = "python") -> ProcInfo:
    return ProcInfo(pid=p.pid, ppid=os.getpid(), name="python", title=title)


def _thread_with(result: CaptureResult, pid: int, frame: str) -> ThreadStack:
    (sample,) = [s for s in result.samples if s.pid == pid]
    assert sample.error is None, sample.error
    matches = [t for t in sample.threads if any(f.name == frame for f in t.frames)]
    assert matches, f"no thread of pid {pid} has a {frame} frame: {sample.threads}"
    return matches[0]


def _wait_result(capturer: StackCapturer, timeout_s: float = 60.0) -> CaptureResult:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = capturer.poll()
        if result is not None:
            return result
        time.sleep(0.05)
    raise AssertionError("capture did not finish")


@pytest.fixture
def download_target() -> Iterator[subprocess.Popen[str]]:
    proc = start_target("download_stall.py")
    yield proc
    stop(proc)


@needs_pyspy
def test_download_stall_frame_is_captured_and_marked_unchanged(download_target) -> None:
    capturer = StackCapturer(deadline_s=30.0, second_after_s=1.0)
    result = capturer.capture_now([_proc(download_target)])
    assert result.result == "ok", result.reason
    stuck = _thread_with(result, download_target.pid, "download_file")
    assert stuck.unchanged is True
    moving = _thread_with(result, download_target.pid, "climb")
    assert moving.name == "climber" and moving.unchanged is False
    assert "download_file" in result.raw_text[download_target.pid]
    assert "download_file" in result.second_text[download_target.pid]
    raw = result.raw_json[download_target.pid]
    assert any(f["name"] == "download_file" for t in raw for f in t["frames"])
    assert all(f["locals"] is None for t in raw for f in t["frames"])  # never --locals by default


@needs_pyspy
def test_collective_wait_is_captured_with_its_module_path() -> None:
    proc = start_target("collective_wait.py")
    try:
        result = StackCapturer(deadline_s=30.0, second_after_s=0.5).capture_now([_proc(proc)])
    finally:
        stop(proc)
    assert result.result == "ok", result.reason
    thread = _thread_with(result, proc.pid, "all_reduce")
    names = [f.name for f in thread.frames]
    assert names.index("barrier") < names.index("all_reduce")  # innermost first
    reduce = next(f for f in thread.frames if f.name == "all_reduce")
    assert reduce.filename.endswith("torch/distributed/distributed_c10d.py")
    assert thread.unchanged is True


@needs_pyspy
def test_start_returns_at_once_and_poll_hands_the_result_out_once(download_target) -> None:
    capturer = StackCapturer(deadline_s=30.0, second_after_s=0.5, native=False)
    assert capturer.start([_proc(download_target)]) is True
    assert capturer.start([_proc(download_target)]) is False  # one capture at a time
    result = _wait_result(capturer)
    assert result.result == "ok"
    assert capturer.poll() is None
    assert not capturer.busy()


@needs_pyspy
def test_the_python_dumps_come_out_before_the_native_one_which_keeps_their_proof(
    download_target,
) -> None:
    """The verdict must not wait for native unwinding (seconds on a vLLM process): poll hands
    out the two Python-only dumps first, then the same capture with native frames, whose
    stuck thread is still marked unchanged."""
    seen: list[list[str]] = []

    def slow_native_runner(argv: list[str], **kw: object) -> subprocess.Popen[str]:
        seen.append(list(argv))
        if "--native" in argv:
            time.sleep(1.0)  # as a native unwind of a big process takes seconds
        return subprocess.Popen(argv, **kw)  # type: ignore[call-overload]

    capturer = StackCapturer(deadline_s=30.0, second_after_s=0.5, runner=slow_native_runner)
    assert capturer.start([_proc(download_target)]) is True
    first = _wait_result(capturer)
    assert capturer.native_pending() and capturer.busy()
    stuck = _thread_with(first, download_target.pid, "download_file")
    assert stuck.unchanged is True
    assert not any(f.module for f in stuck.frames), "a native frame in the Python-only dump"
    final = _wait_result(capturer)
    assert final.result == "ok", final.reason
    native = _thread_with(final, download_target.pid, "download_file")
    assert any(f.module for f in native.frames), "no native frame in the native dump"
    assert native.unchanged is True and native.held > 0
    moving = _thread_with(final, download_target.pid, "climb")
    assert moving.unchanged is False
    assert capturer.poll() is None and not capturer.native_pending()
    assert [("--native" in a) for a in seen] == [False, False, True]


@needs_pyspy
def test_non_python_processes_are_skipped(download_target) -> None:
    seen: list[list[str]] = []

    def recording_runner(argv: list[str], **kw: object) -> subprocess.Popen[str]:
        seen.append(list(argv))
        return subprocess.Popen(argv, **kw)  # type: ignore[call-overload]

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        capturer = StackCapturer(second_after_s=0.2, runner=recording_runner, deadline_s=30.0)
        procs = [_proc(download_target), ProcInfo(sleeper.pid, os.getpid(), "sleep", "sleep 60")]
        result = capturer.capture_now(procs)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.result == "ok"
    assert [s.pid for s in result.samples] == [download_target.pid]
    assert all(str(sleeper.pid) not in argv for argv in seen)
    assert seen and all("--locals" not in argv for argv in seen)


def test_pyspy_at_a_missing_path_is_not_found_with_the_fix() -> None:
    me = ProcInfo(os.getpid(), os.getppid(), "python", "pytest")
    result = StackCapturer(pyspy="/nonexistent/bin/py-spy").capture_now([me])
    assert result.result == "not_found"
    assert "pip install py-spy" in result.reason


def test_pyspy_missing_from_path_is_reported_and_the_caller_keeps_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    capturer = StackCapturer(pyspy="py-spy")
    assert capturer.start([ProcInfo(os.getpid(), os.getppid(), "python", "pytest")])
    result = _wait_result(capturer)
    assert result.result == "not_found"
    assert "install py-spy" in result.reason
    ok, why = preflight_pyspy("py-spy", None)
    assert not ok and "pip install py-spy" in why


def _write_script(folder: Path, body: str) -> str:
    path = folder / "py-spy"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_hanging_pyspy_is_killed_at_its_deadline_without_blocking_start(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The stand-in starts a child of its own: the whole process group must die at the deadline.
    fake = _write_script(tmp_path, f'sleep 300 &\necho $! > "{pidfile}"\nwait\n')
    capturer = StackCapturer(pyspy=fake, deadline_s=1.0, second_after_s=0.0)
    me = ProcInfo(os.getpid(), os.getppid(), "python", "pytest")
    assert capturer.start([me]) is True
    assert capturer.busy()  # start() returned while py-spy was still hanging
    result = _wait_result(capturer)
    assert result.result == "timeout"
    assert "sglang #17941" in result.reason
    assert result.samples[0].error == "py-spy timed out"
    child = int(pidfile.read_text())
    assert _gone(child), f"py-spy's child {child} survived the deadline"


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True  # killed; waiting for a reaper that is not us
        time.sleep(0.05)
    return False


@needs_pyspy
def test_native_failure_falls_back_to_python_frames(tmp_path: Path, download_target) -> None:
    fake = _write_script(
        tmp_path,
        'for a in "$@"; do [ "$a" = --native ] && { echo "Error: unwind failed" >&2; exit 1; }; '
        f'done\nexec "{REAL_PYSPY}" "$@"\n',
    )
    result = StackCapturer(pyspy=fake, second_after_s=0.2, deadline_s=30.0).capture_now(
        [_proc(download_target)]
    )
    assert result.result == "ok", result.reason
    assert _thread_with(result, download_target.pid, "download_file").unchanged


def _setpriv() -> str | None:
    if os.geteuid() != 0:
        return None
    return shutil.which("setpriv")


@needs_pyspy
@pytest.mark.skipif(
    _setpriv() is None, reason="needs root and setpriv to run py-spy as an unprivileged user"
)
def test_pyspy_denied_gives_permission_denied_with_the_fix(download_target) -> None:
    # py-spy under /root is unreachable for nobody: copy it to a world-readable folder.
    folder = Path(tempfile.mkdtemp(prefix="pyspy-"))
    try:
        folder.chmod(0o755)
        exe = folder / "py-spy"
        shutil.copy2(str(REAL_PYSPY), exe)
        exe.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        drop = [str(_setpriv()), "--reuid=65534", "--regid=65534", "--clear-groups"]

        def as_nobody(argv: list[str], **kw: object) -> subprocess.Popen[str]:
            return subprocess.Popen([*drop, *argv], **kw)  # type: ignore[call-overload]

        capturer = StackCapturer(pyspy=str(exe), runner=as_nobody, deadline_s=30.0)
        result = capturer.capture_now([_proc(download_target)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert result.result == "permission_denied", result.reason
    for needle in ("SYS_PTRACE", "shareProcessNamespace", "ptrace_scope"):
        assert needle in result.reason
    assert result.samples[0].fix is not None and "SYS_PTRACE" in result.samples[0].fix


@needs_pyspy
def test_preflight_passes_for_our_own_child(download_target) -> None:
    ok, why = preflight_pyspy(None, download_target.pid)
    assert ok, why


def _fake_proc(root: Path, *, cap_eff: str, scope: str | None, pids: dict[int, str]) -> str:
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{cap_eff}\n")
    if scope is not None:
        (root / "sys/kernel/yama").mkdir(parents=True)
        (root / "sys/kernel/yama/ptrace_scope").write_text(scope + "\n")
    for pid, uid in pids.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "status").write_text(f"PPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return str(root)


@needs_pyspy
@pytest.mark.parametrize(
    ("cap_eff", "scope", "uid", "needle"),
    [
        ("0000000000000000", "2", None, "ptrace_scope=2"),
        ("0000000000000000", "1", "self", "ptrace_scope=1"),
        ("0000000000000000", None, "12345", "another user"),
        ("000001fffeffffff", "3", None, "ptrace_scope=3"),
        ("000001fffeffffff", "0", "missing", "shareProcessNamespace"),
    ],
)
def test_preflight_names_the_blocker(tmp_path: Path, cap_eff, scope, uid, needle) -> None:
    uids = {} if uid in (None, "missing") else {4242: str(os.geteuid() if uid == "self" else uid)}
    root = _fake_proc(tmp_path, cap_eff=cap_eff, scope=scope, pids=uids)
    ok, why = preflight_pyspy(None, 4242, proc_root=root)
    assert not ok
    assert needle in why


def test_preflight_with_cap_sys_ptrace_passes_for_another_user(tmp_path: Path) -> None:
    root = _fake_proc(tmp_path, cap_eff="0000000000080000", scope="1", pids={4242: "12345"})
    ok, why = preflight_pyspy(sys.executable, 4242, proc_root=root)  # any executable path
    assert ok, why


def test_mark_unchanged_compares_frames_by_thread() -> None:
    a = (Frame("recv", "x.py", 3), Frame("download_file", "x.py", 9))
    b = (Frame("climb", "y.py", 1),)
    first = (ThreadStack(1, "main", a), ThreadStack(2, "climber", b), ThreadStack(3, "gone", a))
    second = (ThreadStack(1, "main", a), ThreadStack(2, "climber", b + b))
    marks = {t.thread_id: t.unchanged for t in mark_unchanged(first, second)}
    assert marks == {1: True, 2: False, 3: False}


def test_parse_dump_json_rejects_garbage() -> None:
    with pytest.raises(DumpParseError, match="invalid JSON"):
        parse_dump_json("Permission Denied")
    with pytest.raises(DumpParseError, match="list of thread"):
        parse_dump_json('{"frames": []}')
    raw, threads = parse_dump_json(
        '[{"os_thread_id": 7, "thread_name": null, "active": true, "frames": '
        '[{"name": "f", "filename": "a.py", "module": null, "line": 2}]}]'
    )
    assert raw[0]["os_thread_id"] == 7
    assert threads == (ThreadStack(7, "", (Frame("f", "a.py", 2, ""),), active=True),)


def test_missing_pyspy_is_said_at_once_and_reaches_the_verdict(download_target) -> None:
    from watchdog.core.judge.classify import Context, Thresholds
    from watchdog.core.model import Observation, ProcSnapshot, Verdict
    from watchdog.core.state.window import Window
    from watchdog.daemon.episodes import EpisodeHook

    hook = EpisodeHook(capturer=StackCapturer(pyspy="/nonexistent/py-spy"))
    me = ProcInfo(download_target.pid, os.getpid(), "python3", "target", 0.0, None, "sleeping")
    obs = Observation(t=1.0, wall=1.0, procs=ProcSnapshot(me.pid, True, (me,)))
    daemon = TickKit()
    hook.on_tick(daemon.tick(obs, Verdict(state="serving", suspicious=True)))
    assert hook.capture_warning and "py-spy not found" in hook.capture_warning
    deadline = time.monotonic() + 10
    while not daemon.attached and time.monotonic() < deadline:
        time.sleep(0.05)
        hook.on_tick(daemon.tick(obs, Verdict(state="serving", suspicious=True)))
    (sample,) = daemon.attached[0]
    assert sample.error and "py-spy not found" in sample.error
    window = Window()
    window.append(replace(obs, t=2.0, stacks=daemon.attached[0]))
    problems = Context(window, window.latest, Thresholds()).capture_problems()
    assert any("py-spy not found" in e.detail for e in problems)


@needs_pyspy
@pytest.mark.parametrize(
    ("target", "signature"),
    [("download_stall.py", "cubin_download_stall"), ("collective_wait.py", "collective_hang")],
)
def test_real_py_spy_stacks_name_the_signature(target: str, signature: str) -> None:
    """What py-spy prints for a stuck process, fed to the classifier as the daemon does."""
    from tests.obsbuilder import Timeline, final, frozen_bar, gpu, procs
    from watchdog.core.knowledge.signatures import load_signatures

    proc = start_target(target)
    try:
        result = StackCapturer(deadline_s=30.0, second_after_s=1.0).capture_now([_proc(proc)])
    finally:
        stop(proc)
    assert result.result == "ok", result.reason
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 30, stacks=tuple(result.samples))
    v = final(tl.obs, load_signatures())
    assert (v.state, v.signature) == ("hung", signature)
    assert any(e.source == "stacks" and f"pid {proc.pid}" in e.detail for e in v.evidence)


def test_dumps_begun_before_the_server_moved_on_are_discarded(download_target) -> None:
    """A capture that started during a stall which then cleared shows a moment the server has
    left: it must not be attached as evidence, and a later stall takes new dumps."""
    from watchdog.core.model import Observation, ProcSnapshot, Verdict
    from watchdog.daemon.episodes import EpisodeHook

    hook = EpisodeHook(capturer=StackCapturer(deadline_s=30.0, second_after_s=0.5))
    me = ProcInfo(download_target.pid, os.getpid(), "python3", "target", 0.0, None, "sleeping")
    snap = ProcSnapshot(me.pid, True, (me,))
    daemon = TickKit()
    suspicious = Verdict(state="serving", suspicious=True)
    hook.on_tick(daemon.tick(Observation(t=10.0, wall=10.0, procs=snap), suspicious))
    assert hook.episode is not None and hook.episode.capture_started_t == 10.0
    daemon.window.progress.last_progress_t = 11.0  # the batch finished while py-spy ran
    deadline = time.monotonic() + 60
    while hook.capturer.busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    hook.on_tick(daemon.tick(Observation(t=12.0, wall=12.0, procs=snap), Verdict(state="serving")))
    assert daemon.attached == [] and hook.episode.capture_started_t is None
    hook.on_tick(daemon.tick(Observation(t=13.0, wall=13.0, procs=snap), suspicious))
    assert hook.episode.capture_started_t == 13.0  # stalled again: fresh dumps


def test_dumps_the_server_moved_on_from_after_they_came_in_are_retaken_at_once(
    download_target,
) -> None:
    """A slow first batch is dumped (suspicious, no cause), then completes, then the hang
    begins within the same episode: the old dumps show a moment the server has left, so the
    new stall is dumped at once, not after the 10 s re-capture wait (the real TP=2 hang was
    named 18.8 s after its onset that way)."""
    from watchdog.core.model import Observation, ProcSnapshot, Verdict
    from watchdog.daemon.episodes import EpisodeHook

    hook = EpisodeHook(capturer=StackCapturer(deadline_s=30.0, second_after_s=0.2, native=False))
    me = ProcInfo(download_target.pid, os.getpid(), "python3", "target", 0.0, None, "sleeping")
    snap = ProcSnapshot(me.pid, True, (me,))
    daemon = TickKit()
    suspicious = Verdict(state="serving", suspicious=True)
    hook.on_tick(daemon.tick(Observation(t=10.0, wall=10.0, procs=snap), suspicious))
    deadline = time.monotonic() + 60
    while hook.capturer.busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    hook.on_tick(daemon.tick(Observation(t=11.0, wall=11.0, procs=snap), suspicious))
    assert hook.episode is not None and hook.episode.capture_done_t == 11.0
    daemon.window.progress.last_progress_t = 12.0  # the slow batch finished after the dumps
    hook.on_tick(daemon.tick(Observation(t=12.0, wall=12.0, procs=snap), Verdict(state="serving")))
    hook.on_tick(daemon.tick(Observation(t=15.0, wall=15.0, procs=snap), suspicious))
    assert hook.episode.capture_started_t == 15.0  # the new stall: fresh dumps at once


def test_a_server_that_keeps_moving_on_is_not_dumped_back_to_back(download_target) -> None:
    """Slow, not stuck: every capture is overtaken by progress. After the second discard the
    next capture waits CAPTURE_BACKOFF_S, then twice that: py-spy suspends what it reads, so
    dumping back to back would slow the server further."""
    from watchdog.core.model import Observation, ProcSnapshot, Verdict
    from watchdog.daemon.episodes import CAPTURE_BACKOFF_S, EpisodeHook

    hook = EpisodeHook(capturer=StackCapturer(deadline_s=30.0, second_after_s=-1))
    me = ProcInfo(download_target.pid, os.getpid(), "python3", "target", 0.0, None, "sleeping")
    snap = ProcSnapshot(me.pid, True, (me,))
    daemon = TickKit()
    suspicious = Verdict(state="serving", suspicious=True)

    def overtaken(t: float) -> None:
        """Capture at t; the server moves on while it runs; the result is read at t + 1."""
        hook.on_tick(daemon.tick(Observation(t=t, wall=t, procs=snap), suspicious))
        assert hook.episode is not None and hook.episode.capture_started_t == t
        daemon.window.progress.last_progress_t = t + 0.5
        deadline = time.monotonic() + 60
        while hook.capturer.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        hook.on_tick(
            daemon.tick(Observation(t=t + 1, wall=t + 1, procs=snap), Verdict(state="serving"))
        )

    overtaken(10.0)  # first discard: the next tick may capture at once
    overtaken(12.0)  # second discard at t=13: nothing before 13 + CAPTURE_BACKOFF_S
    for t in (14.0, 13.0 + CAPTURE_BACKOFF_S - 0.5):
        hook.on_tick(daemon.tick(Observation(t=t, wall=t, procs=snap), suspicious))
        assert hook.episode.capture_started_t is None, t
    overtaken(13.0 + CAPTURE_BACKOFF_S)  # third discard: the wait doubles
    later = 14.0 + CAPTURE_BACKOFF_S
    hook.on_tick(
        daemon.tick(Observation(t=later + CAPTURE_BACKOFF_S, wall=0, procs=snap), suspicious)
    )
    assert hook.episode.capture_started_t is None
    at = later + 2 * CAPTURE_BACKOFF_S
    hook.on_tick(daemon.tick(Observation(t=at, wall=at, procs=snap), suspicious))
    assert hook.episode.capture_started_t == at
    assert daemon.attached == []


# Holds a ptrace attachment on the target for argv[2] seconds, then exits (the kernel detaches
# a tracer that exits): what another py-spy or a debugger looks like to ours.
PTRACE_HOLDER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
    sys.exit(f"ptrace seize failed: errno {ctypes.get_errno()}")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold(pid: int, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", PTRACE_HOLDER, str(pid), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


@needs_pyspy
def test_a_dump_waits_for_another_tracer_to_let_go(download_target) -> None:
    """Two watchdogs (or a person's py-spy) on one server: ptrace takes one tracer at a time,
    so ours is refused with EPERM while the other holds it, then succeeds."""
    holder = _hold(download_target.pid, 1.5)
    try:
        capturer = StackCapturer(deadline_s=20.0, second_after_s=0.5)
        result = capturer.capture_now([_proc(download_target)])
    finally:
        holder.wait(timeout=30)
    assert result.result == "ok", result.reason
    _thread_with(result, download_target.pid, "download_file")


@needs_pyspy
def test_a_tracer_that_never_lets_go_is_named(download_target) -> None:
    holder = _hold(download_target.pid, 30)
    try:
        capturer = StackCapturer(deadline_s=3.0, second_after_s=0.5)
        result = capturer.capture_now([_proc(download_target)])
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert result.result != "ok"
    (sample,) = [s for s in result.samples if s.pid == download_target.pid]
    assert sample.error is not None and f"another tracer (pid {holder.pid})" in sample.error
