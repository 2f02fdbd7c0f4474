"""The scorecard: each injected class run N times against the real vLLM (CPU build), and the
simulator for what a CPU cannot show; per class p50 and p90 onset to verdict, how often the
right cause was named, and false alarms per hour of healthy serving. Prints numbers, asserts
nothing.

Every run is the real-engine tier's harness (tests/real_engine): a real vLLM 0.32 serving a
tiny random Llama, hangs injected from inside its worker by the tier's plugin, FlashInfer's
real cubin loader fetching from a stand-in CDN on 127.0.0.1, and `hang-watchdog run` attached
with its shipped thresholds. Onset is the time the plugin wrote when the hang began (the
SIGSTOP itself for `sigstop`); the verdict is the first state event into hung, stalled or dead,
as the watchdog's JSON log says it, read every 0.2 s.

Run (about 2 minutes a run on 2 cores; the full card, 5 runs of 12 classes, about 2 hours):
  HANG_WATCHDOG_REAL_ENGINE_PYTHON=$(tests/real_engine/install.sh) \\
      python3 benchmarks/scorecard.py --runs 5 --out benchmarks/results/scorecard.jsonl
  python3 benchmarks/scorecard.py --table benchmarks/results/scorecard.jsonl
Short form (one run of one class): --runs 1 --classes worker_exception
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.scorecard_table import CLASSES, Run, read_runs, table  # noqa: E402
from tests.real_engine.dtype_probe import choose_dtype  # noqa: E402
from tests.real_engine.engine import (  # noqa: E402
    HERE,
    Hang,
    Load,
    VllmServer,
    make_model,
    plugin_site,
    wait_until,
)
from tests.real_engine.watch import Watchdog  # noqa: E402
from watchdog.sim.cdn import start_cdn  # noqa: E402

HUNG_WAIT_S = 200.0  # a hang class that says nothing in this long counts as a miss

# What a right verdict names, per hang class; a class not here is healthy (nothing may be raised).
EXPECTED = {
    "cubin_trickle": "cubin_download_stall",
    "cubin_silent": "cubin_download_stall",
    "tp2_collective": "collective_hang",
    "sigstop": "stopped",
    "worker_exception": "engine_dead",
    "illegal_instruction": "build_machine_mismatch",
    "gpu_spin_sim": "gpu_kernel_spin",
}


@dataclass
class Kit:
    """What every run shares: the real-engine python, the model, the plugin and the dtype."""

    python: str
    model: Path
    site: Path
    dtype: str
    work: Path

    @contextlib.contextmanager
    def server(self, name: str, hang: Hang | None = None, **kw: object) -> Iterator[VllmServer]:
        kw.setdefault("dtype", self.dtype)
        server = VllmServer(
            self.python, self.model, self.work / name, self.site, hang=hang or Hang(), **kw
        )  # type: ignore[arg-type]
        try:
            yield server.start()
        finally:
            server.stop()

    @contextlib.contextmanager
    def watchdog(self, server: VllmServer, name: str) -> Iterator[Watchdog]:
        args = ["--pid", str(server.pid), "--log-file", str(server.log_file)]
        args += ["--server-url", server.url, "--gpu-source", "none"]
        wd = Watchdog(self.work / name, args, name="watchdog").start()
        try:
            yield wd
        finally:
            wd.stop()


def first_alarm(wd: Watchdog, since: float, timeout: float) -> tuple[str, float | None]:
    """(what the first alarm named, its time) after `since`, or ("", None) within `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for ev in wd.states():
            if ev.get("new") in ("hung", "stalled", "dead") and ev["_read_at"] >= since:
                return _named(ev), float(ev["_read_at"])
        time.sleep(0.2)
    return "", None


def _named(ev: dict[str, object]) -> str:
    verdict = ev.get("verdict") or {}
    assert isinstance(verdict, dict)
    if verdict.get("signature"):
        return str(verdict["signature"])
    kinds = {e.get("kind") for e in verdict.get("evidence") or [] if isinstance(e, dict)}
    return "stopped" if "stopped" in kinds else str(ev.get("new"))


def _hang(kit: Kit, cls: str, hang: Hang, cdn: str = "", **kw: object) -> Run:
    port, stop_cdn = start_cdn(cdn or "trickle")
    env = {
        "FLASHINFER_CUBINS_REPOSITORY": f"http://127.0.0.1:{port}/",
        "FLASHINFER_CUBIN_DIR": str(kit.work / cls / "cubins"),
        **kw.pop("extra_env", {}),  # type: ignore[dict-item]
    }
    try:
        with kit.server(cls, hang, extra_env=env, **kw) as server, kit.watchdog(server, cls) as wd:
            server.wait_ready()
            load = Load(server.url, clients=4).start()
            try:
                wd.wait_state("serving", 120)
                assert hang.trigger is not None
                hang.trigger.touch()
                onset = server.onset()
                named, at = first_alarm(wd, onset, HUNG_WAIT_S)
            finally:
                load.stop()
    finally:
        stop_cdn()
    return Run(cls, EXPECTED[cls], named, None if at is None else at - onset)


def run_cubin(kit: Kit, cls: str) -> Run:
    trigger = kit.work / cls / "go"
    cdn = "trickle" if cls == "cubin_trickle" else "blackhole"
    return _hang(kit, cls, Hang(mode="cubin", trigger=trigger), cdn)


def run_collective(kit: Kit, cls: str) -> Run:
    hang = Hang(mode="block", rank=1, trigger=kit.work / cls / "go")
    return _hang(kit, cls, hang, tp=2)


def run_exception(kit: Kit, cls: str) -> Run:
    return _hang(kit, cls, Hang(mode="raise", trigger=kit.work / cls / "go"))


def run_illegal(kit: Kit, cls: str) -> Run:
    """The plugin's SIGILL at the first step with tokens, in whatever dtype serves here."""
    sigill = {"HW_SIGILL_DTYPE": kit.dtype}
    with kit.server(cls, extra_env=sigill) as server, kit.watchdog(server, cls) as wd:
        server.wait_ready()
        wd.wait_state("idle", 120)
        onset = time.time()
        server.complete(timeout=30)
        named, at = first_alarm(wd, onset, 60)
    return Run(cls, EXPECTED[cls], named, None if at is None else at - onset)


def run_sigstop(kit: Kit, cls: str) -> Run:
    with kit.server(cls) as server, kit.watchdog(server, cls) as wd:
        server.wait_ready()
        load = Load(server.url, clients=4).start()
        try:
            wd.wait_state("serving", 120)
            core = server.process("VLLM::EngineCore")
            core.send_signal(signal.SIGSTOP)
            onset = time.time()
            named, at = first_alarm(wd, onset, 60)
            core.send_signal(signal.SIGCONT)
        finally:
            load.stop()
    return Run(cls, EXPECTED[cls], named, None if at is None else at - onset)


def run_gpu_spin_sim(kit: Kit, cls: str) -> Run:
    """The simulated vLLM whose first batch spins in a kernel (SM busy, DRAM idle in its GPU
    file), watched with the file: GPU source: what no CPU can show."""
    work = kit.work / cls
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sim_argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", "kernel_deadlock"]
    sim_argv += ["--mode", "serve", "--startup-s", "1", "--workdir", str(work), "--cc", "9.0"]
    sim_argv += ["--gpu-file", str(work / "gpu.jsonl"), "--log-file", str(work / "sim.log")]
    sim_argv += ["--port-file", str(work / "port")]
    sim = subprocess.Popen(sim_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: (work / "port").exists(), 60, "the simulator's port")
        url = f"http://127.0.0.1:{(work / 'port').read_text().strip()}"
        args = ["--pid", str(sim.pid), "--server-url", url, "--log-file", str(work / "sim.log")]
        args += ["--gpu-source", f"file:{work / 'gpu.jsonl'}"]
        wd = Watchdog(work, args).start()
        try:
            ready = "Application startup complete."
            wait_until(lambda: ready in (work / "sim.log").read_text(errors="replace"), 60, ready)
            onset = time.time()  # its first batch begins at startup and never returns
            named, at = first_alarm(wd, onset, 120)
        finally:
            wd.stop()
    finally:
        sim.kill()
        sim.wait()
    return Run(cls, EXPECTED[cls], named, None if at is None else at - onset)


def _quiet(kit: Kit, cls: str, serve: Callable[[VllmServer, Watchdog], float], **kw: object) -> Run:
    with kit.server(cls, **kw) as server, kit.watchdog(server, cls) as wd:
        healthy = serve(server, wd)
        alarms = len(wd.alarms())
    return Run(cls, "", "", None, healthy_s=healthy, alarms=alarms)


def _load_drain_idle(
    server: VllmServer, wd: Watchdog, load_s: float = 60, idle_s: float = 30
) -> float:
    server.wait_ready()
    start = time.monotonic()
    load = Load(server.url).start()
    wd.wait_state("serving", 120)
    time.sleep(load_s)
    load.stop()
    wd.wait_state("idle", 60)
    time.sleep(idle_s)
    return time.monotonic() - start


def run_healthy(kit: Kit, cls: str) -> Run:
    return _quiet(kit, cls, _load_drain_idle)


def run_idle(kit: Kit, cls: str) -> Run:
    def idle(server: VllmServer, wd: Watchdog) -> float:
        server.wait_ready()
        wd.wait_state("idle", 120)
        time.sleep(60)
        return 60.0

    return _quiet(kit, cls, idle)


def run_stats_150(kit: Kit, cls: str) -> Run:
    def drained(server: VllmServer, wd: Watchdog) -> float:
        return _load_drain_idle(server, wd, load_s=20, idle_s=120)

    return _quiet(kit, cls, drained, extra_env={"VLLM_LOG_STATS_INTERVAL": "150"})


def run_cold_compile(kit: Kit, cls: str) -> Run:
    env = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "2"}
    return _quiet(kit, cls, _load_drain_idle, eager=False, extra_env=env)


def run_slow_load(kit: Kit, cls: str) -> Run:
    return _quiet(kit, cls, _load_drain_idle, hang=Hang(mode="silent_load", load_s=60))


RUNNERS: dict[str, Callable[[Kit, str], Run]] = {
    "cubin_trickle": run_cubin,
    "cubin_silent": run_cubin,
    "tp2_collective": run_collective,
    "sigstop": run_sigstop,
    "worker_exception": run_exception,
    "illegal_instruction": run_illegal,
    "gpu_spin_sim": run_gpu_spin_sim,
    "healthy_drain": run_healthy,
    "idle": run_idle,
    "stats_150s": run_stats_150,
    "cold_compile": run_cold_compile,
    "slow_load": run_slow_load,
}
assert set(RUNNERS) == set(CLASSES)


def real_python() -> str:
    given = os.environ.get("HANG_WATCHDOG_REAL_ENGINE_PYTHON")
    if given:
        return given
    out = subprocess.run([str(HERE / "install.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=5, help="runs of each class (default 5)")
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma-separated classes")
    ap.add_argument("--out", type=Path, help="append each run here as a JSON line")
    ap.add_argument("--table", type=Path, help="only print the table of a recorded file")
    ap.add_argument("--dtype", help="serve in this dtype without probing (default: probe)")
    args = ap.parse_args(argv)
    if args.table is not None:
        print(table(read_runs(args.table)))
        return 0
    chosen = [c.strip() for c in args.classes.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in RUNNERS]
    if unknown:
        ap.error(f"unknown class {', '.join(unknown)}; known: {', '.join(RUNNERS)}")
    work = Path(tempfile.mkdtemp(prefix="scorecard-"))
    python = real_python()
    model = make_model(python, work / "tiny-llama")
    site = plugin_site(work)
    dtype = args.dtype
    if dtype is None:
        choice = choose_dtype(python, model, site, work / "dtype-probe")
        print(f"[scorecard] {choice.describe()}", flush=True)
        if choice.dtype is None:
            return 1
        dtype = choice.dtype
    kit = Kit(python, model, site, dtype, work)
    runs: list[Run] = []
    for i in range(args.runs):
        for cls in chosen:
            kit.work = work / f"run{i}"
            try:
                run = RUNNERS[cls](kit, cls)
            except AssertionError as e:  # the harness could not set the run up: a miss, said
                print(f"[scorecard] {cls} run {i}: {str(e).splitlines()[0]}", flush=True)
                quiet = cls not in EXPECTED
                run = Run(cls, EXPECTED.get(cls, ""), "error", None, alarms=int(quiet))
            runs.append(run)
            print(f"[scorecard] {json.dumps(run.to_json())}", flush=True)
            if args.out is not None:
                with args.out.open("a") as fh:
                    fh.write(json.dumps(run.to_json()) + "\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
