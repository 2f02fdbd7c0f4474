"""Finds the server process and reads its whole tree each tick: titles, CPU, I/O, compilers.

What changes each tick (CPU time, I/O, status) is read each tick; what does not (the tree's
membership, each process's title) is re-read every `tree_every_s`: finding the children reads
every process's /proc/N/stat on the host, and a title is set once by setproctitle at start.

The target is found by a strategy (a PID, a command-line regex, a systemd unit, or the child
the watchdog supervises) and followed across restarts. vLLM names its processes with
setproctitle (`VLLM::EngineCore`, `VLLM::Worker_TP0`, ...), so the joined command line is the
title other sources key on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

import psutil

from watchdog.core.model import ProcInfo, ProcSnapshot
from watchdog.engines.detect import EngineInForce
from watchdog.engines.loader import EngineSet
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, proc_deadline

# A live child with one of these names means a JIT build is running (not a hang).
COMPILERS = frozenset({"nvcc", "ninja", "cicc", "ptxas", "cc1plus"})

Runner = Callable[[Sequence[str]], str]


class TargetFinder(Protocol):
    """A way to name the server process; `find()` returns its PID or None."""

    def find(self) -> int | None: ...


class PidTarget:
    """A fixed PID (`--pid`); once it dies it stays dead."""

    refind = False

    def __init__(self, pid: int) -> None:
        if pid <= 0:
            raise ValueError(f"--pid must be a positive process id, got {pid}")
        self.pid = pid

    def find(self) -> int | None:
        return self.pid


class MatchTarget:
    """The oldest process whose joined command line matches a regex (`--match`)."""

    refind = True

    def __init__(
        self, regex: str, *, psutil_module: ModuleType = psutil, self_pid: int | None = None
    ) -> None:
        try:
            self.pattern = re.compile(regex)
        except re.error as e:
            raise ValueError(f"--match {regex!r} is not a valid regular expression: {e}") from e
        self._ps = psutil_module
        self._self_pid = os.getpid() if self_pid is None else self_pid

    def _excluded(self) -> set[int]:
        """The watchdog itself and its ancestors: their command lines often hold the regex."""
        excluded = {self._self_pid}
        with contextlib.suppress(self._ps.NoSuchProcess, self._ps.AccessDenied):
            excluded.update(p.pid for p in self._ps.Process(self._self_pid).parents())
        return excluded

    def find(self) -> int | None:
        excluded = self._excluded()
        matches: dict[int, tuple[float, int]] = {}  # pid -> (create_time, ppid)
        for p in self._ps.process_iter(["pid", "ppid", "cmdline", "create_time"]):
            info: dict[str, Any] = p.info
            if info["pid"] in excluded or not info.get("cmdline"):
                continue
            if self.pattern.search(" ".join(info["cmdline"])):
                matches[info["pid"]] = (info.get("create_time") or 0.0, info.get("ppid") or 0)
        # Prefer the root of a matching tree (`vllm serve` over its EngineCore), then the oldest.
        roots = [pid for pid, (_, ppid) in matches.items() if ppid not in matches]
        if not roots:
            return None
        return min(roots, key=lambda pid: (matches[pid][0], pid))


def run_argv(argv: Sequence[str]) -> str:
    """Run argv (no shell) with a short deadline and return its stdout."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=5.0, check=True)
    return done.stdout


class SystemdTarget:
    """The MainPID of a systemd unit (`--systemd-unit`); 0 means the unit is not running."""

    refind = True

    def __init__(self, unit: str, runner: Runner = run_argv, systemctl: str = "systemctl") -> None:
        if not unit or unit.startswith("-") or any(c.isspace() for c in unit):
            raise ValueError(f"--systemd-unit {unit!r} is not a unit name; e.g. vllm.service")
        self.unit = unit
        self._runner = runner
        self._systemctl = systemctl

    def find(self) -> int | None:
        argv = [self._systemctl, "show", "-p", "MainPID", "--value", self.unit]
        try:
            pid = int(self._runner(argv).strip() or "0")
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        return pid if pid > 0 else None


class ChildTarget:
    """The child the watchdog supervises; pass a callable to follow restarts it makes."""

    refind = True

    def __init__(
        self, popen: subprocess.Popen[Any] | Callable[[], subprocess.Popen[Any] | None]
    ) -> None:
        self._get = popen if callable(popen) else (lambda: popen)

    def find(self) -> int | None:
        child = self._get()
        if child is None or child.poll() is not None:
            return None
        return child.pid


class ProcSource:
    """Reads the target's process tree each tick; never raises."""

    name = "procs"
    part = "procs"

    def __init__(
        self,
        finder: TargetFinder,
        *,
        psutil_module: ModuleType = psutil,
        clock: Callable[[], float] = time.monotonic,
        engines: EngineSet | None = None,
        tree_every_s: float = 5.0,
    ) -> None:
        """`tree_every_s`: how often the tree's membership and titles are read again (a new
        child, a compiler say, shows within that; a vanished one at once). `engines`: the
        profiles the engine in force is detected among (None: roles are not named)."""
        self.finder = finder
        self.engines = engines
        self._engine: EngineInForce | None = None  # what this source detected last
        self._detected_for: int | None = None
        self.health = SourceHealth(self.name)
        self._ps = psutil_module
        self._clock = clock
        self._pid: int | None = None
        self._create_time: float | None = None
        self._last: ProcSnapshot = ProcSnapshot(target_pid=None, alive=False)
        self._tree_every_s = tree_every_s
        self._tree: list[Any] = []  # psutil.Process objects of the last membership read
        self._tree_at = float("-inf")
        self._titles: dict[int, str] = {}  # pid -> title, read with the membership

    def _same_process(self, pid: int, create_time: float | None) -> bool:
        """Is pid alive and the process we saw before (not a reused PID, not a zombie)?"""
        try:
            p = self._ps.Process(pid)
            if p.status() == self._ps.STATUS_ZOMBIE:
                return False
            return create_time is None or p.create_time() == create_time
        except (self._ps.NoSuchProcess, self._ps.AccessDenied):
            return False

    def _resolve_target(self) -> tuple[int | None, bool, bool]:
        """(pid, alive, restarted) for this tick; a dead target keeps its last PID."""
        if self._pid is not None and self._same_process(self._pid, self._create_time):
            return self._pid, True, False
        if self._pid is not None and not getattr(self.finder, "refind", True):
            return self._pid, False, False  # a fixed --pid that died stays dead
        pid = self.finder.find()
        if pid is None or not self._same_process(pid, None):
            return (self._pid if pid is None else pid), False, False
        restarted = self._pid is not None and pid != self._pid
        try:
            self._create_time = self._ps.Process(pid).create_time()
        except (self._ps.NoSuchProcess, self._ps.AccessDenied):
            self._create_time = None
        self._pid = pid
        return pid, True, restarted

    def deadline(self, tick_s: float) -> Deadline:
        return proc_deadline(tick_s)

    def poll(self, tick: SourceTick | None = None) -> ProcSnapshot:
        """One snapshot of the target and its descendants; a live target and its tree go into
        `tick` for the sources polled after this one.

        A dead or missing target is an observation (alive=False), not a source failure: the
        source stays up so the classifier sees it. It goes down only when the tree is unreadable.
        """
        tick = tick if tick is not None else SourceTick()
        snap = self._snapshot(tick)
        if snap.alive:
            tick.target_pid = snap.target_pid
            tick.tree_pids = tuple(p.pid for p in snap.procs)
        return snap

    def _snapshot(self, tick: SourceTick) -> ProcSnapshot:
        pid, alive, restarted = self._resolve_target()
        procs = self._walk(pid) if (pid is not None and alive) else []
        if pid is None or not alive:
            self.health.ok()
        if alive and not procs:
            alive = not self._gone(pid)
        compilers = sorted(
            {p.name for p in procs[1:] if p.name in COMPILERS and p.status != "zombie"}
        )
        procs = self._with_roles(procs, tick, detect=restarted or pid != self._detected_for)
        snap = ProcSnapshot(
            target_pid=pid,
            alive=alive,
            procs=tuple(procs),
            compilers=tuple(compilers),
            restarted=restarted and alive,
            engine=tick.engine.profile.name if self.engines is not None else "",
        )
        self._last = snap
        return snap

    def _with_roles(self, procs: list[ProcInfo], tick: SourceTick, detect: bool) -> list[ProcInfo]:
        """Detect the engine for a new target (into the tick), then name each process's role
        and rank."""
        if self.engines is None or not procs:
            return procs
        # Its own last detection, not only the tick's: a poll that returned past its deadline
        # wrote to a tick the loop had already read.
        engine = self._engine or tick.engine
        if detect or engine.profile.name == "unknown":  # children appear after the launcher
            self._detected_for = procs[0].pid
            engine = engine.observed(self.engines, procs[0].title, [p.title for p in procs[1:]])
        tick.engine = self._engine = engine
        profile = engine.profile
        out = []
        for info in procs:
            role, rank = profile.role_of(info.title)
            out.append(dataclasses.replace(info, role=role, rank=rank) if role else info)
        return out

    def _gone(self, pid: int | None) -> bool:
        return pid is None or not self._ps.pid_exists(pid)

    def _walk(self, pid: int) -> list[ProcInfo]:
        now = self._clock()
        fresh = (
            not self._tree or self._tree[0].pid != pid or now - self._tree_at >= self._tree_every_s
        )
        if fresh:
            try:
                root = self._ps.Process(pid)
                self._tree = [root, *root.children(recursive=True)]
            except self._ps.NoSuchProcess:
                self.health.ok()
                self._tree = []
                return []
            except self._ps.AccessDenied:
                self.health.down(
                    f"permission denied reading process {pid}; run the watchdog as the same user "
                    "or with CAP_SYS_PTRACE (Kubernetes: shareProcessNamespace + SYS_PTRACE)"
                )
                self._tree = []
                return []
            self._tree_at, self._titles = now, {}
        self.health.ok()
        infos: list[ProcInfo] = []
        members = {p.pid for p in self._tree}
        for p in self._tree:
            info = self._info(p)
            # a child whose parent is no longer in the tree (reparented, or its PID reused by
            # another process) is not ours: a fresh walk would not find it either
            if info is not None and (not infos or info.ppid in members):
                infos.append(info)
        if len(infos) < len(self._tree):  # one vanished: read the membership again next tick
            self._tree_at = float("-inf")
        return infos

    def _title(self, p: Any, name: str) -> str:
        """The joined command line (setproctitle's title), read with the tree's membership."""
        title = self._titles.get(p.pid)
        if title is None:
            try:
                title = " ".join(p.cmdline()) or name
            except self._ps.AccessDenied:
                title = name
            self._titles[p.pid] = title
        return title

    def _info(self, p: Any) -> ProcInfo | None:
        """One process, or None when it vanished mid-walk; unreadable fields become None."""
        ps = self._ps
        try:
            with p.oneshot():
                name = p.name()
                ppid = p.ppid()
                status = p.status()
                title = self._title(p, name)
                try:
                    times = p.cpu_times()
                    cpu_s: float | None = times.user + times.system
                except ps.AccessDenied:
                    cpu_s = None
                read_bytes = _read_bytes(p, ps)
        except (ps.NoSuchProcess, ps.AccessDenied):
            return None
        return ProcInfo(
            pid=p.pid,
            ppid=ppid,
            name=name,
            title=title,
            cpu_s=cpu_s,
            read_bytes=read_bytes,
            status=status,
        )

    def pids(self) -> list[int]:
        """The PIDs of the last snapshot, for the connection and stack sources."""
        return [p.pid for p in self._last.procs]

    def close(self) -> None:
        """Nothing to release; here for the Source interface."""


def _read_bytes(p: Any, ps: ModuleType) -> int | None:
    # io_counters needs the same user or CAP_SYS_PTRACE, and is missing on some platforms.
    if not hasattr(p, "io_counters"):
        return None
    try:
        return int(p.io_counters().read_bytes)
    except (ps.AccessDenied, NotImplementedError, AttributeError):
        return None
