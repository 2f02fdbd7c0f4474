"""Dump the Python stacks of every process of the server's tree with py-spy, never blocking.

Every py-spy run has a hard deadline and its process group is killed when it passes (SGLang's
watchdog blocked forever inside py-spy: sglang #17941). `--subprocesses --json` only prints the
parent (py-spy 0.4), so each pid is dumped on its own, in parallel. `--locals` is off
unless the operator asks: locals can hold user prompts.

Python frames first: a Python-only dump of a vLLM process takes a fraction of a second, a
`--native` one seconds (py-spy unwinds through libtorch's symbols; about 8 s on two busy
cores), and the Python frames usually decide the cause. So a capture takes two Python-only
dumps `second_after_s` apart and hands that result out at once; the native dump (for the
bundle and for the rules that name a native frame) follows and is handed out after it, its
threads keeping what the two Python dumps proved while their Python frames still agree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from watchdog.core.model import ProcInfo, StackSample, ThreadStack
from watchdog.core.state.capture import CaptureResult
from watchdog.sources.procenv import tracer_pid
from watchdog.sources.stacks.parse import (
    FIX_INSTALL,
    FIX_PERMISSION,
    FIX_TIMEOUT,
    DumpParseError,
    classify_failure,
    common_outer,
    is_python_process,
    mark_unchanged,
    parse_dump_json,
    preflight_pyspy,
    resolve_pyspy,
)
from watchdog.sources.stacks.text import render_text
from watchdog.sources.treetag import TAG_VAR, new_tag, signal_tagged

__all__ = ["CaptureResult", "StackCapturer", "preflight_pyspy", "resolve_pyspy"]

Runner = Callable[..., subprocess.Popen]
TRACER_RETRY_S = 0.25  # wait between tries while another tracer holds the target


@dataclass
class _PidDump:
    """One pid's progress through a capture."""

    proc: ProcInfo
    threads: tuple[ThreadStack, ...] = ()
    raw_json: list[dict] = field(default_factory=list)
    text: str | None = None
    second_text: str | None = None
    kind: str = "ok"
    error: str | None = None
    fix: str | None = None
    native: bool = True
    native_failed: bool = False
    deadline: float = 0.0  # monotonic: this pid's own deadline in the current phase


class StackCapturer:
    """Runs py-spy captures in a background thread; the loop starts one and polls for the result."""

    def __init__(
        self,
        *,
        pyspy: str | None = None,
        native: bool = True,
        with_locals: bool = False,
        deadline_s: float = 10.0,
        second_after_s: float = 2.0,
        max_parallel: int = 8,
        overall_s: float | None = None,
        runner: Runner = subprocess.Popen,
        proc_root: str = "/proc",
    ) -> None:
        self._pyspy = pyspy
        self._native = native
        self._locals = with_locals
        self._deadline_s = deadline_s
        self._second_after_s = second_after_s
        self._max_parallel = max(1, max_parallel)
        # The whole capture (both dumps of every rank) ends by this; each pid also has its own
        # deadline_s per phase, counted from when its dump starts, so a rank queued behind
        # others (more ranks than max_parallel) gets its full time.
        self._overall_s = overall_s if overall_s is not None else 2 * deadline_s + second_after_s
        self._overall_deadline = 0.0
        self._runner = runner
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._result: CaptureResult | None = None
        self._pending_native = False  # the Python result is out; its native dump follows
        self._stop = threading.Event()
        self._running: dict[int, tuple[subprocess.Popen, str]] = {}  # py-spy runs: pid -> tag

    def start(self, procs: Sequence[ProcInfo]) -> bool:
        """Begin a capture in a background thread; False if one is already running."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._result = None
            self._thread = threading.Thread(
                target=self._background, args=(tuple(procs),), name="stack-capture", daemon=True
            )
            self._thread.start()
            return True

    def poll(self) -> CaptureResult | None:
        """The newest result not handed out yet (the Python dumps, then the same capture with
        native frames), once each; None while running or after it was handed out."""
        with self._lock:
            result, self._result = self._result, None
            return result

    def check(self, pid: int | None) -> tuple[bool, str]:
        """Whether a capture of `pid` can work from here, and the fix when it cannot."""
        return preflight_pyspy(self._pyspy, pid, proc_root=self._proc_root)

    def busy(self) -> bool:
        """True while a background capture is running."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Daemon shutdown: cut short the wait before a second dump and kill the py-spy runs
        still going (a dump pauses the server, which then cannot act on its own SIGTERM;
        and py-spy in its own session would outlive the watchdog)."""
        self._stop.set()
        with self._lock:
            running = list(self._running.values())
        for proc, tag in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            signal_tagged(tag, signal.SIGKILL)

    def _background(self, procs: tuple[ProcInfo, ...]) -> None:
        result = self.capture_now(procs, publish=self._publish)
        with self._lock:
            self._result = result
            self._pending_native = False

    def _publish(self, result: CaptureResult) -> None:
        with self._lock:
            self._result = result
            self._pending_native = True

    def native_pending(self) -> bool:
        """True between the Python result and the native one of the same capture."""
        with self._lock:
            return self._pending_native

    def capture_now(
        self,
        procs: Sequence[ProcInfo],
        publish: Callable[[CaptureResult], None] | None = None,
    ) -> CaptureResult:
        """Dump every Python process in `procs` twice (and once with native frames), blocking;
        `publish` gets the Python-only result before the native dump starts. Never raises."""
        try:
            return self._capture(procs, publish)
        except (OSError, ValueError, RuntimeError) as e:  # last line of defence: never raise
            return _empty("error", f"stack capture failed: {e}")

    def _capture(
        self, procs: Sequence[ProcInfo], publish: Callable[[CaptureResult], None] | None
    ) -> CaptureResult:
        exe = resolve_pyspy(self._pyspy)
        if exe is None:
            where = self._pyspy or "next to the watchdog's Python or on PATH"
            return _empty("not_found", f"py-spy not found ({where}): {FIX_INSTALL}")
        targets = [p for p in procs if is_python_process(p.pid, self._proc_root)]
        if not targets:
            return _empty("error", "no Python processes in the server's tree to dump")
        self._overall_deadline = time.monotonic() + self._overall_s
        dumps = [_PidDump(p, native=False) for p in targets]
        self._each(dumps, lambda d: self._first(exe, d))
        good = [d for d in dumps if d.kind == "ok"]
        wait = min(self._second_after_s, self._overall_deadline - time.monotonic())
        if good and wait >= 0 and self._second_after_s >= 0 and not self._stop.wait(wait):
            self._each(good, lambda d: self._second(exe, d))
        if not self._native or not good or self._stop.is_set():
            return _assemble(dumps)
        if publish is not None:
            publish(_assemble(dumps))
        # The native pass has its own deadlines: the Python result is already out.
        self._overall_deadline = time.monotonic() + self._deadline_s
        natives = [_PidDump(d.proc, native=True) for d in good]
        self._each(natives, lambda n: self._native_dump(exe, n))
        return _assemble(_with_native(dumps, natives))

    def _each(self, dumps: Sequence[_PidDump], work: Callable[[_PidDump], None]) -> None:
        """Every pid in parallel (at most max_parallel at once), each under its own deadline."""

        def timed(d: _PidDump) -> None:
            d.deadline = min(time.monotonic() + self._deadline_s, self._overall_deadline)
            work(d)

        with ThreadPoolExecutor(max_workers=min(self._max_parallel, len(dumps))) as pool:
            list(pool.map(timed, dumps))

    def _first(self, exe: str, d: _PidDump) -> None:
        ok = self._dump_json(exe, d, second=False)
        if not ok and d.kind == "native":
            d.native, d.native_failed, d.kind, d.error, d.fix = False, True, "ok", None, None
            ok = self._dump_json(exe, d, second=False)
        if ok:
            d.text = render_text(d.proc.pid, d.proc.title, d.raw_json)

    def _native_dump(self, exe: str, n: _PidDump) -> None:
        if self._dump_json(exe, n, second=False):
            n.text = render_text(n.proc.pid, n.proc.title, n.raw_json)

    def _second(self, exe: str, d: _PidDump) -> None:
        later = _PidDump(d.proc, native=d.native, deadline=d.deadline)
        if self._dump_json(exe, later, second=True):
            d.threads = mark_unchanged(d.threads, later.threads)
            d.second_text = render_text(d.proc.pid, d.proc.title, later.raw_json)

    def _dump_json(self, exe: str, d: _PidDump, *, second: bool) -> bool:
        rc, out, err = self._run(self._argv(exe, d, json_out=True), d.deadline)
        tracer = None
        while rc is not None and rc != 0 and self._held_by_tracer(rc, err, d):
            # Another py-spy or a debugger has it paused (ptrace allows one tracer at a time);
            # a dump takes well under a second, so wait for it to let go.
            tracer = tracer_pid(d.proc.pid, self._proc_root) or tracer
            time.sleep(TRACER_RETRY_S)
            rc, out, err = self._run(self._argv(exe, d, json_out=True), d.deadline)
        if rc is None:
            d.kind, d.error, d.fix = "timeout", "py-spy timed out", FIX_TIMEOUT
            return False
        if rc != 0:
            failure = classify_failure(rc, err, native=d.native)
            d.kind, d.error, d.fix = failure.kind, failure.error, failure.fix
            if failure.kind == "permission_denied" and tracer:
                d.error = (
                    f"another tracer (pid {tracer}) kept it attached until the deadline: "
                    f"{failure.error}"
                )
                d.fix = "stop the other py-spy or debugger attached to the server"
            return False
        try:
            d.raw_json, d.threads = parse_dump_json(out)
        except DumpParseError as e:
            d.kind, d.error, d.fix = "error", str(e), None
            return False
        return True

    def _held_by_tracer(self, rc: int, err: str, d: _PidDump) -> bool:
        """EPERM from py-spy while another process traces the target (TracerPid), or while
        the watchdog is root (whom no capability check refuses), with time left to retry."""
        if classify_failure(rc, err, native=d.native).kind != "permission_denied":
            return False
        if time.monotonic() + TRACER_RETRY_S + 0.5 > d.deadline:
            return False
        traced = tracer_pid(d.proc.pid, self._proc_root)
        return bool(traced) or os.geteuid() == 0

    def _argv(self, exe: str, d: _PidDump, *, json_out: bool) -> list[str]:
        argv = [exe, "dump", "--pid", str(d.proc.pid)]
        argv += ["--native"] if d.native else []
        argv += ["--locals"] if self._locals else []
        return argv + (["--json"] if json_out else [])

    def _run(self, argv: list[str], deadline: float) -> tuple[int | None, str, str]:
        """Run py-spy until `deadline` (monotonic); None as the status when it was killed."""
        if self._stop.is_set():  # shutting down: no retry, no second dump
            return None, "", ""
        timeout = max(0.1, deadline - time.monotonic())
        tag = new_tag()  # finds what py-spy forks, even past setsid or a double fork
        try:
            proc = self._runner(
                argv,
                env={**os.environ, TAG_VAR: tag},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",  # a stray non-UTF-8 byte must not lose the whole dump
                start_new_session=True,  # its own process group, so the kill takes its children
            )
        except PermissionError as e:
            return 126, "", f"permission denied running py-spy: {e}"
        except OSError as e:
            return 127, "", f"could not run py-spy: {e}"
        with self._lock:
            self._running[proc.pid] = (proc, tag)
            stopping = self._stop.is_set()  # close() ran between the check above and here
        if stopping:
            _kill_group(proc, tag)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, tag)
            return None, "", ""
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
        signal_tagged(tag, signal.SIGKILL)  # a helper it left behind: nothing outlives a dump
        return proc.returncode, out or "", err or ""


def _with_native(dumps: Sequence[_PidDump], natives: Sequence[_PidDump]) -> list[_PidDump]:
    """The Python dumps, each given its native dump's frames where that dump worked: a thread
    keeps `unchanged` while its Python frames in the native dump are still those of the two
    Python dumps, and `held` for the outer Python frames all three share."""
    by_pid = {n.proc.pid: n for n in natives}
    out = []
    for d in dumps:
        n = by_pid.get(d.proc.pid)
        if d.kind != "ok" or n is None:
            out.append(d)
        elif n.kind != "ok":
            out.append(replace(d, native_failed=True))
        else:
            threads = tuple(_merge_thread(t, n.threads) for t in d.threads)
            out.append(replace(d, threads=threads, raw_json=n.raw_json, text=n.text or d.text))
    return out


def _merge_thread(py: ThreadStack, native: Sequence[ThreadStack]) -> ThreadStack:
    t = next((x for x in native if x.thread_id == py.thread_id), None)
    if t is None:
        return py
    # py-spy gives a native frame its library as `module`; a Python frame has none.
    python_part = [i for i, f in enumerate(t.frames) if not f.module]
    same = tuple(t.frames[i] for i in python_part) == py.frames
    shared = common_outer(py.frames, tuple(t.frames[i] for i in python_part))
    held_py = min(py.held, shared)
    held = len(t.frames) - python_part[len(python_part) - held_py] if held_py else 0
    return replace(t, unchanged=py.unchanged and same, held=held, active=py.active)


def _kill_group(proc: subprocess.Popen, tag: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    signal_tagged(tag, signal.SIGKILL)  # the ones that left the group (setsid)
    try:
        proc.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipes
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        # unkillable (D state): the OS reaps it later, the capture must not block on it
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)


def _empty(result: str, reason: str) -> CaptureResult:
    return CaptureResult((), {}, {}, {}, result, reason)


def _assemble(dumps: Sequence[_PidDump]) -> CaptureResult:
    samples = tuple(
        StackSample(pid=d.proc.pid, title=d.proc.title, threads=d.threads, error=d.error, fix=d.fix)
        for d in dumps
        if d.kind != "not_python"
    )
    good = [d for d in dumps if d.kind == "ok"]
    bad = [d for d in dumps if d.kind not in ("ok", "not_python")]
    raw_text = {d.proc.pid: d.text for d in good if d.text is not None}
    second = {d.proc.pid: d.second_text for d in good if d.second_text is not None}
    raw_json = {d.proc.pid: d.raw_json for d in good}
    skipped = [d for d in dumps if d.kind == "not_python"]
    result, reason = _summarise(good, bad, skipped)
    return CaptureResult(samples, raw_text, raw_json, second, result, reason)


def _summarise(
    good: Sequence[_PidDump], bad: Sequence[_PidDump], skipped: Sequence[_PidDump] = ()
) -> tuple[str, str]:
    unchanged = sum(t.unchanged for d in good for t in d.threads)
    problems = "; ".join(f"pid {d.proc.pid}: {d.error}" for d in bad)
    if good and not bad:
        note = " (native frames unavailable for some)" if any(d.native_failed for d in good) else ""
        return "ok", f"dumped {len(good)} process(es){note}; {unchanged} thread(s) unchanged"
    if good:
        return "partial", f"dumped {len(good)} of {len(good) + len(bad)} process(es); {problems}"
    if not bad:
        said = "; ".join(f"pid {d.proc.pid}: {d.error}" for d in skipped[:3])
        return "error", "py-spy found no Python interpreter in the server's tree" + (
            f" ({said})" if said else ""
        )
    kinds = {d.kind for d in bad}
    for kind in ("permission_denied", "timeout"):
        if kind in kinds:
            fix = FIX_PERMISSION if kind == "permission_denied" else FIX_TIMEOUT
            return kind, f"{problems}. Fix: {fix}"
    return "error", problems
