"""ProcSource, its target finders, and the /proc readers, against real child processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from watchdog.sources.procenv import ns_pid, read_cmdline, read_environ
from watchdog.sources.procs import (
    ChildTarget,
    MatchTarget,
    PidTarget,
    ProcSource,
    SystemdTarget,
)

SLEEP = shutil.which("sleep") or "/bin/sleep"
Spawn = Callable[..., subprocess.Popen[Any]]

# A parent that starts children under vLLM-like titles (argv[0]) and then waits.
TREE = """
import subprocess, sys, time
kids = [subprocess.Popen([title, "600"], executable=sys.argv[1]) for title in sys.argv[2:]]
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[Any]] = []

    def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        p = subprocess.Popen(argv, **kw)
        started.append(p)
        return p

    yield _spawn
    for p in started:
        try:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
        p.kill()
        p.wait(timeout=10)


def wait_for(cond: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def tree(spawn: Spawn, *titles: str, executable: str = SLEEP, tag: str = "") -> Any:
    argv = [sys.executable, "-c", TREE, executable, *titles]
    if tag:
        argv = [sys.executable, "-c", TREE + f"# {tag}\n", executable, *titles]
    p = spawn(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    wait_for(lambda: len(psutil.Process(p.pid).children()) == len(titles))
    return p


def test_tree_titles_cpu_io_status(spawn: Spawn) -> None:
    parent = tree(spawn, "VLLM::EngineCore", "VLLM::Worker_TP0")
    src = ProcSource(PidTarget(parent.pid))
    snap = src.poll()
    assert snap.alive and snap.target_pid == parent.pid and not snap.restarted
    titles = {p.title for p in snap.procs}
    assert {"VLLM::EngineCore 600", "VLLM::Worker_TP0 600"} <= titles
    assert snap.procs[0].pid == parent.pid
    assert all(p.ppid == parent.pid for p in snap.procs[1:])
    assert all(p.cpu_s is not None and p.cpu_s >= 0 for p in snap.procs)
    assert all(isinstance(p.read_bytes, int) for p in snap.procs)
    assert all(p.status in ("sleeping", "running") for p in snap.procs)
    assert sorted(src.pids()) == sorted(p.pid for p in snap.procs)
    assert snap.compilers == () and src.health.up


def test_compiler_children_are_reported(spawn: Spawn, tmp_path: Path) -> None:
    ninja = tmp_path / "ninja"
    shutil.copy(SLEEP, ninja)
    parent = tree(spawn, "ninja", executable=str(ninja))
    src = ProcSource(PidTarget(parent.pid))
    assert src.poll().compilers == ("ninja",)
    for child in psutil.Process(parent.pid).children():
        child.kill()
    wait_for(lambda: src.poll().compilers == ())


# A parent that starts one more child (titled "late") when it receives SIGUSR1, and reaps it.
LATE = """
import signal, subprocess, sys, time
kids = []
def late(*_):
    kids.append(subprocess.Popen(["late", "600"], executable=sys.argv[1]))
signal.signal(signal.SIGUSR1, late)
print("ready", flush=True)
while True:
    [k.poll() for k in kids]  # reaps a killed child: it vanishes from /proc
    time.sleep(0.05)
"""


def test_membership_and_titles_are_reread_every_tree_interval(spawn: Spawn) -> None:
    import signal

    now = [0.0]
    parent = spawn([sys.executable, "-c", LATE, SLEEP], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
    src = ProcSource(PidTarget(parent.pid), clock=lambda: now[0], tree_every_s=5.0)
    first = src.poll()
    assert len(first.procs) == 1 and first.procs[0].cpu_s is not None
    os.kill(parent.pid, signal.SIGUSR1)
    wait_for(lambda: psutil.Process(parent.pid).children())
    now[0] = 4.9  # within the interval: the cached membership, CPU read afresh
    assert [p.pid for p in src.poll().procs] == [parent.pid]
    now[0] = 5.0  # the interval passed: the tree is walked again and the child's title read
    titles = [p.title for p in src.poll().procs]
    assert titles[1:] == ["late 600"]
    for child in psutil.Process(parent.pid).children():
        child.kill()
    wait_for(lambda: not psutil.Process(parent.pid).children())
    wait_for(lambda: len(src.poll().procs) == 1)  # a vanished child goes at once, no interval


def test_dead_pid_target_stays_dead(spawn: Spawn) -> None:
    p = spawn([SLEEP, "600"])
    src = ProcSource(PidTarget(p.pid))
    assert src.poll().alive
    p.kill()
    p.wait()
    snap = src.poll()
    assert not snap.alive and snap.target_pid == p.pid and snap.procs == ()
    assert src.pids() == [] and src.health.up  # a dead target is data, not a source failure


def test_missing_pid_is_not_alive() -> None:
    src = ProcSource(PidTarget(2**22 + 12345))
    snap = src.poll()
    assert not snap.alive and snap.procs == ()


def test_pid_target_rejects_non_positive() -> None:
    with pytest.raises(ValueError, match="--pid"):
        PidTarget(0)


def test_match_prefers_root_of_matching_tree_and_follows_restart(spawn: Spawn) -> None:
    tag = f"hwtest-{uuid.uuid4().hex}"
    # Children carry the tag in argv too: the root of the matching tree must win.
    first = tree(spawn, f"{tag}-child", tag=tag)
    src = ProcSource(MatchTarget(tag))
    snap = src.poll()
    assert snap.alive and snap.target_pid == first.pid and len(snap.procs) == 2
    first.kill()
    first.wait()
    second = tree(spawn, "VLLM::EngineCore", tag=tag)
    # The orphaned child of `first` still matches; wait until it is gone too.
    for child in psutil.process_iter(["cmdline"]):
        if f"{tag}-child" in " ".join(child.info["cmdline"] or []):
            child.kill()
    snap = wait_for(lambda: (s := src.poll()).target_pid == second.pid and s)
    assert snap.alive and snap.restarted
    again = src.poll()
    assert again.target_pid == second.pid and not again.restarted


def test_match_chooses_oldest_and_skips_watchdog_itself(spawn: Spawn) -> None:
    tag = f"hwtest-{uuid.uuid4().hex}"
    old = spawn([sys.executable, "-c", f"import time; time.sleep(600)  # {tag}"])
    wait_for(lambda: tag in " ".join(psutil.Process(old.pid).cmdline()))
    time.sleep(0.05)  # create_time has 10 ms resolution
    new = spawn([sys.executable, "-c", f"import time; time.sleep(600)  # {tag}"])
    wait_for(lambda: tag in " ".join(psutil.Process(new.pid).cmdline()))
    assert MatchTarget(tag).find() == old.pid
    # Pretend the watchdog is `old`: it and its ancestors are never the target.
    assert MatchTarget(tag, self_pid=old.pid).find() == new.pid


def test_match_never_returns_self_or_ancestors(spawn: Spawn) -> None:
    # A tagged parent with a tagged child stands in for the watchdog and its launcher;
    # a younger tagged sibling is the only process that may be chosen.
    tag = f"hwtest-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {tag}'])\n"
        "time.sleep(600)\n"
        f"# {tag}"
    )
    parent = spawn([sys.executable, "-c", code])
    child = wait_for(lambda: next(iter(psutil.Process(parent.pid).children()), None))
    wait_for(lambda: tag in " ".join(child.cmdline()))
    assert MatchTarget(tag, self_pid=child.pid).find() is None
    time.sleep(0.05)  # create_time has 10 ms resolution
    sibling = spawn([sys.executable, "-c", f"import time; time.sleep(600)  # {tag}"])
    wait_for(lambda: tag in " ".join(psutil.Process(sibling.pid).cmdline()))
    assert MatchTarget(tag, self_pid=child.pid).find() == sibling.pid
    # Without the exclusion the oldest root, the parent, would win.
    assert MatchTarget(tag, self_pid=os.getpid()).find() == parent.pid


def test_match_bad_regex_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a valid regular expression"):
        MatchTarget("(unclosed")


def _fake_systemctl(tmp_path: Path, out: str, code: int = 0) -> Path:
    script = tmp_path / "systemctl"
    script.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/args"\nprintf "{out}\\n"\nexit {code}\n'
    )
    script.chmod(0o755)
    return script


def test_systemd_main_pid_via_argv(spawn: Spawn, tmp_path: Path) -> None:
    p = spawn([SLEEP, "600"])
    target = SystemdTarget("vllm.service", systemctl=str(_fake_systemctl(tmp_path, str(p.pid))))
    assert target.find() == p.pid
    args = (tmp_path / "args").read_text().split()
    assert args == ["show", "-p", "MainPID", "--value", "vllm.service"]
    assert ProcSource(target).poll().alive


@pytest.mark.parametrize(("out", "code"), [("0", 0), ("garbage", 0), ("123", 1)])
def test_systemd_not_running_or_failing(tmp_path: Path, out: str, code: int) -> None:
    target = SystemdTarget("vllm.service", systemctl=str(_fake_systemctl(tmp_path, out, code)))
    assert target.find() is None


def test_systemd_missing_binary_and_bad_unit(tmp_path: Path) -> None:
    assert SystemdTarget("vllm.service", systemctl=str(tmp_path / "nope")).find() is None
    with pytest.raises(ValueError, match="unit name"):
        SystemdTarget("--all")


def test_child_target_follows_supervisor_restart(spawn: Spawn) -> None:
    current: dict[str, subprocess.Popen[Any]] = {"p": spawn([SLEEP, "600"])}
    src = ProcSource(ChildTarget(lambda: current["p"]))
    first = current["p"].pid
    assert src.poll().target_pid == first
    current["p"].kill()
    current["p"].wait()
    assert not src.poll().alive
    current["p"] = spawn([SLEEP, "600"])
    snap = src.poll()
    assert snap.alive and snap.restarted and snap.target_pid == current["p"].pid != first


def test_child_target_plain_popen(spawn: Spawn) -> None:
    p = spawn([SLEEP, "600"])
    target = ChildTarget(p)
    assert target.find() == p.pid
    p.kill()
    p.wait()
    assert target.find() is None


def test_churning_tree_never_raises(spawn: Spawn) -> None:
    p = spawn(["/bin/sh", "-c", "while true; do /bin/true; /bin/true & done"])
    src = ProcSource(PidTarget(p.pid))
    for _ in range(60):
        snap = src.poll()
        assert snap.alive and snap.procs[0].pid == p.pid


def test_read_environ_and_cmdline(spawn: Spawn) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "HW_TEST_VAR": "a=b c"}
    p = spawn([SLEEP, "600"], env=env)
    wait_for(lambda: read_cmdline(p.pid) == [SLEEP, "600"])
    assert read_environ(p.pid)["HW_TEST_VAR"] == "a=b c"
    assert read_environ(2**22 + 12345) == {} and read_cmdline(2**22 + 12345) == []


def test_ns_pid_real_and_fake_root(tmp_path: Path) -> None:
    mine = ns_pid(os.getpid())
    assert mine and mine[0] == os.getpid()
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text("Name:\tpython\nNSpid:\t4242\t7\nNStgid:\t4242\t7\n")
    (tmp_path / "77" / "environ").write_bytes(b"A=1\0B=x=y\0NOEQUALS\0")
    assert ns_pid(77, proc_root=str(tmp_path)) == [4242, 7]
    assert read_environ(77, proc_root=str(tmp_path)) == {"A": "1", "B": "x=y"}
    assert ns_pid(78, proc_root=str(tmp_path)) == []
