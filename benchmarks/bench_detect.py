"""Detection latency per hang scenario of the simulator, and recovery time in supervise mode
(prints median, p90 and max; asserts nothing).

Detection: for each scenario, --runs times: a simulated vLLM serves on 127.0.0.1 and
`hang-watchdog diagnose --until-hang` attaches to it (file GPU source, its log, /metrics,
process tree, sockets) with the default thresholds (or --short: the e2e tests' short ones).
Onset is when the hang begins, seen in the simulator's own log:
  cubin_download_stall  the first `flashinfer.jit: Fetching` line (stand-in CDN black-holes)
  kernel_deadlock       `Application startup complete.` (the first batch never returns)
  engine_dead           the engine's fatal-error line
Detected is when the watchdog's JSON log reports the state turning hung (or dead).
Recovery: `hang-watchdog run --remediate -- vllm_sim --scenario hang_unless_fallback`: from
the first startup's onset to the hang verdict and to the remediation event with outcome
`recovered` (restarted with the fallback and answering completions again).

Witness sets (--witness-sets): onset -> verdict for each set of witnesses that can prove a cause,
with GPU figures (file source) and without (--gpu-source none), default thresholds:
  stack+socket  SGLang's first batch fetches cubins, the watchdog knows the CDN host (a socket)
  stack only    the same, the CDN host unknown to the watchdog: the stack is the only witness
  log only      vLLM's download with py-spy off: FlashInfer's own `attempt 1 failed` line
  GPU only      vLLM's first batch spins in a kernel, py-spy off: only the GPU figures
Onset: SGLang's `The server is fired up and ready to roll!` (its first batch begins then; FlashInfer
logs nothing under SGLang), vLLM's `flashinfer.jit: Fetching` or `Application startup complete.`
The first hung (or, failing that, stalled) state in the watchdog's JSON log is the verdict.

Run: flock /tmp/e2e.lock python3 benchmarks/bench_detect.py [--runs 20] [--short]
     flock /tmp/e2e.lock python3 benchmarks/bench_detect.py --witness-sets [--runs 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from watchdog.sim.cdn import start_cdn  # noqa: E402
from watchdog.sim.versions import write_dist_infos  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]
SHORT += ["--gpu-spin-for-s", "4"]
ONSET = {
    "cubin_download_stall": "flashinfer.jit: Fetching",
    "kernel_deadlock": "Application startup complete.",
    "engine_dead": "EngineCore encountered a fatal error",
}
DETECTED = ('"new": "hung"', '"new": "dead"')


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def one_detection(scenario: str, short: bool, timeout: float) -> float | None:
    """Seconds from onset to the hang verdict; None if either was not seen in time."""
    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    cdn_port, stop_cdn = start_cdn("blackhole")
    sim_argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario]
    sim_argv += ["--mode", "serve", "--startup-s", "1", "--workdir", str(work)]
    sim_argv += ["--gpu-file", str(work / "gpu.jsonl"), "--log-file", str(work / "sim.log")]
    sim_argv += ["--port-file", str(work / "port"), "--cc", "10.0"]
    if scenario == "cubin_download_stall":
        sim_argv += ["--cdn-url", f"http://127.0.0.1:{cdn_port}/artifactory/"]
    sim = subprocess.Popen(sim_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    wd = None
    try:
        end = time.monotonic() + 60
        while not (work / "port").exists() and time.monotonic() < end:
            time.sleep(0.05)
        port = (work / "port").read_text().strip()
        argv = [sys.executable, "-m", "watchdog", "diagnose", "--pid", str(sim.pid)]
        argv += ["--server-url", f"http://127.0.0.1:{port}", "--no-cdn-default"]
        argv += ["--gpu-source", f"file:{work / 'gpu.jsonl'}", "--log-file", str(work / "sim.log")]
        argv += ["--cdn-host", f"127.0.0.1:{cdn_port}", "--duration", str(int(timeout))]
        argv += ["--until-hang", "--log-format", "json", *(SHORT if short else [])]
        err = work / "wd.err"
        with err.open("wb") as fh:
            wd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fh, env=ENV)
        onset = detected = None
        end = time.monotonic() + timeout
        while time.monotonic() < end and detected is None:
            if onset is None and ONSET[scenario] in read(work / "sim.log"):
                onset = time.monotonic()
            if any(d in read(err) for d in DETECTED):
                detected = time.monotonic()
            if wd.poll() is not None and detected is None:
                break
            time.sleep(0.05)
        return detected - onset if onset is not None and detected is not None else None
    finally:
        if wd is not None:
            kill_tree(wd)  # type: ignore[arg-type]
        kill_tree(sim)  # type: ignore[arg-type]
        stop_cdn()
        shutil.rmtree(work, ignore_errors=True)


# name -> (engine, scenario, onset line, watchdog flags); "{cdn}" is the stand-in CDN's port
WITNESS_SETS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "stack+socket": ("sglang", "cubin_download_stall", "fired up and ready to roll",
                     ("--cdn-host", "127.0.0.1:{cdn}")),
    "stack only": ("sglang", "cubin_download_stall", "fired up and ready to roll", ()),
    "log only": ("vllm", "cubin_download_stall", "flashinfer.jit: Fetching", ("--no-stacks",)),
    "GPU only": ("vllm", "kernel_deadlock", "Application startup complete.", ("--no-stacks",)),
}  # fmt: skip


def one_witness_set(name: str, gpu: bool, timeout: float) -> tuple[float | None, str]:
    """(onset -> first hung verdict, or first stalled when none came; what it was)."""
    engine, scenario, onset_line, flags = WITNESS_SETS[name]
    work = Path(tempfile.mkdtemp(prefix="bench-witness-"))
    cdn_port, stop_cdn = start_cdn("blackhole")
    sim_argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario,
                "--mode", "serve", "--startup-s", "1", "--workdir", str(work), "--engine", engine,
                "--gpu-file", str(work / "gpu.jsonl"), "--log-file", str(work / "sim.log"),
                "--port-file", str(work / "port"), "--cc", "10.0", "--cdn-timeout", "10",
                "--cdn-url", f"http://127.0.0.1:{cdn_port}/artifactory/"]  # fmt: skip
    sim = subprocess.Popen(sim_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    wd = None
    try:
        end = time.monotonic() + 60
        while not (work / "port").exists() and time.monotonic() < end:
            time.sleep(0.05)
        port = (work / "port").read_text().strip()
        source = f"file:{work / 'gpu.jsonl'}" if gpu else "none"
        argv = [sys.executable, "-m", "watchdog", "diagnose", "--pid", str(sim.pid),
                "--server-url", f"http://127.0.0.1:{port}", "--no-cdn-default",
                "--gpu-source", source, "--log-file", str(work / "sim.log"),
                "--duration", str(int(timeout)), "--until-hang", "--log-format", "json",
                *(f.format(cdn=cdn_port) for f in flags)]  # fmt: skip
        err = work / "wd.err"
        with err.open("wb") as fh:
            wd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fh, env=ENV)
        onset = hung = stalled = None
        end = time.monotonic() + timeout
        while time.monotonic() < end and hung is None and wd.poll() is None:
            if onset is None and onset_line in read(work / "sim.log"):
                onset = time.monotonic()
            text = read(err)
            if stalled is None and '"new": "stalled"' in text:
                stalled = time.monotonic()
            if any(d in text for d in DETECTED):
                hung = time.monotonic()
            time.sleep(0.05)
        if onset is None:
            return None, "no onset seen"
        if hung is not None:
            return hung - onset, _named(read(err))
        return (stalled - onset, "stalled, cause unproven") if stalled else (None, "nothing")
    finally:
        if wd is not None:
            kill_tree(wd)  # type: ignore[arg-type]
        kill_tree(sim)  # type: ignore[arg-type]
        stop_cdn()
        shutil.rmtree(work, ignore_errors=True)


def _named(log: str) -> str:
    import json

    for line in log.splitlines():
        if '"new": "hung"' in line or '"new": "dead"' in line:
            with contextlib.suppress(ValueError):
                verdict = json.loads(line).get("verdict") or {}
                return str(verdict.get("signature") or "hung")
    return "hung"


def witness_sets(runs: int, timeout: float) -> None:
    print(f"onset -> verdict per witness set (default thresholds, {runs} run(s) each)")
    for name in WITNESS_SETS:
        for gpu in (True, False):
            results = [one_witness_set(name, gpu, timeout) for _ in range(runs)]
            label = f"{name}, {'with' if gpu else 'without'} GPU figures"
            what = sorted({w for _, w in results})
            summary(f"{label} ({', '.join(what)})", [r for r, _ in results])


def one_recovery(timeout: float) -> tuple[float | None, float | None]:
    """(onset -> hang verdict, onset -> recovered) in supervise mode with --remediate."""
    work = Path(tempfile.mkdtemp(prefix="bench-recover-"))
    write_dist_infos(str(work / "versions"), {"vllm": "0.14.0", "flashinfer-python": "0.6.7"})
    env = {**ENV, "PYTHONPATH": f"{work / 'versions'}{os.pathsep}{REPO}"}
    from watchdog.sim.cdn import free_port

    port = free_port()
    gpu = work / "gpu.jsonl"
    argv = [sys.executable, "-m", "watchdog", "run", "--gpu-source", f"file:{gpu}",
            "--server-url", f"http://127.0.0.1:{port}", "--state-dir", str(work / "state"),
            "--incident-dir", str(work / "incidents"), "--metrics-addr", "127.0.0.1:0",
            "--no-cdn-default", "--remediate", "--cooldown-s", "0", "--log-format", "json",
            "--", sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario",
            "hang_unless_fallback", "--mode", "serve", "--port", str(port), "--startup-s", "1",
            "--gpu-file", str(gpu), "--log-file", str(work / "sim.log"),
            "--workdir", str(work)]  # fmt: skip
    err = work / "wd.err"
    with err.open("wb") as fh:
        wd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fh, env=env)
    onset = hung = recovered = None
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end and recovered is None and wd.poll() is None:
            if onset is None and ONSET["kernel_deadlock"] in read(work / "sim.log"):
                onset = time.monotonic()
            text = read(err)
            if hung is None and DETECTED[0] in text:
                hung = time.monotonic()
            if '"outcome": "recovered"' in text:
                recovered = time.monotonic()
            time.sleep(0.05)
    finally:
        kill_tree(wd)  # type: ignore[arg-type]
        shutil.rmtree(work, ignore_errors=True)
    if onset is None:
        return None, None
    return (hung - onset if hung else None), (recovered - onset if recovered else None)


def summary(name: str, values: list[float | None]) -> None:
    got = sorted(v for v in values if v is not None)
    missed = len(values) - len(got)
    if not got:
        print(f"  {name:<34} no result in {len(values)} runs")
        return
    p90 = got[min(len(got) - 1, int(round(0.9 * (len(got) - 1))))]
    print(f"  {name:<34} n={len(got):>2}  median {statistics.median(got):6.1f} s  "
          f"p90 {p90:6.1f} s  max {got[-1]:6.1f} s  min {got[0]:6.1f} s"
          + (f"  ({missed} runs saw no verdict)" if missed else ""), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="runs per hang scenario")
    ap.add_argument("--recovery-runs", type=int, default=None, help="default: --runs")
    ap.add_argument("--short", action="store_true", help="the e2e tests' short thresholds")
    ap.add_argument("--scenarios", default=",".join(ONSET), help="comma-separated")
    ap.add_argument("--timeout", type=float, default=120.0, help="per run")
    ap.add_argument("--witness-sets", action="store_true", help="per witness set, see above")
    args = ap.parse_args()
    if args.witness_sets:
        witness_sets(args.runs, max(args.timeout, 170.0))
        return
    mode = "short thresholds" if args.short else "default thresholds"
    print(f"detection latency, onset -> verdict ({mode}, {args.runs} runs each)")
    for scenario in args.scenarios.split(","):
        summary(
            scenario, [one_detection(scenario, args.short, args.timeout) for _ in range(args.runs)]
        )
    n = args.recovery_runs if args.recovery_runs is not None else args.runs
    if n:
        print(f"supervise mode, hang_unless_fallback with --remediate ({n} runs)")
        results = [one_recovery(args.timeout) for _ in range(n)]
        summary("onset -> hang verdict", [r[0] for r in results])
        summary("onset -> recovered (serving again)", [r[1] for r in results])


if __name__ == "__main__":
    main()
