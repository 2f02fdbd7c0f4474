"""`hang-watchdog demo`: a simulated vLLM hangs the way the GB300 report did; watch it caught.

Needs only the installed package: no GPU, no network beyond 127.0.0.1. The simulator prints
vLLM's log formats, serves vLLM's metric names, feeds GPU samples through the `file:` source,
and (in the default scenario) blocks in FlashInfer's `download_file` on a stand-in CDN.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.config import build_config
from watchdog.outputs.emit import Emitter

ENGINES = ("vllm", "sglang", "trtllm")
VLLM_SIM_VERSION = "0.19.0"  # watchdog/engines/profiles/vllm.toml: the formats' release
ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM (trtllm-serve)"}
# scenario -> (simulator mode, extra simulator args, expected signature or None for "no hang")
SCENARIOS: dict[str, tuple[str, list[str], str | None]] = {
    "cubin_download_stall": ("bench", [], "cubin_download_stall"),
    "kernel_deadlock": (
        "bench",
        ["--fake-versions", "flashinfer-python=0.6.7"],
        "trtllm_attention_deadlock",
    ),
    "healthy": ("serve", [], None),
    "slow_loading": ("serve", ["--shard-s", "4", "--shards", "8"], None),
    "engine_dead": ("serve", ["--die-after-s", "4"], "engine_dead"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `hang-watchdog demo`."""
    p.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="cubin_download_stall",
        help="what the simulated server does (default: cubin_download_stall)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="simulate this engine (its log formats, metric names, /health and process titles)",
    )
    p.add_argument(
        "--workdir", metavar="DIR", help="keep the simulator's files and the incident here"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="give up waiting for the hang after this long (default: 60)",
    )
    p.add_argument(
        "--watch-s",
        type=float,
        default=25.0,
        metavar="SECONDS",
        help="how long to watch a scenario that should not hang (default: 25)",
    )


@dataclass
class _Sim:
    proc: subprocess.Popen[bytes]
    log_file: Path
    gpu_file: Path
    port: int | None
    engine: str = "vllm"


def run(args: argparse.Namespace) -> int:
    work = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hang-watchdog-demo-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    mode, extra, expected = SCENARIOS[args.scenario]
    if args.engine == "vllm":
        # The simulated server is the vLLM release its formats were read from: the verdict
        # and the fallback's spelling (flag or variable) then follow that version.
        extra = _with_version(extra, f"vllm={VLLM_SIM_VERSION}")
    elif args.engine == "sglang":
        # The SGLang simulator serves (`sglang serve`); its /health check waits 5 s, not 20.
        mode, extra = "serve", [*extra, "--engine", "sglang", "--health-timeout-s", "5"]
    elif args.engine == "trtllm":
        mode, extra = "serve", [*extra, "--engine", "trtllm"]
    from watchdog.sim.cdn import start_cdn

    cdn_port, stop_cdn = start_cdn("blackhole")
    say(f"[demo] stand-in kernel CDN (accepts, never answers) on 127.0.0.1:{cdn_port}")
    sim = _start_sim(work, args.scenario, mode, extra, cdn_port)
    sim.engine = args.engine
    try:
        say(
            f"[demo] simulated {ENGINE_TITLES[args.engine]} ({mode} mode, scenario "
            f"{args.scenario}) "
            f"pid {sim.proc.pid}; files in {work}"
        )
        verdict, built = _watch(sim, work, cdn_port, expected, args)
    finally:
        _stop(sim.proc)
        stop_cdn()
    return _report(verdict, built, expected, work)


def _with_version(extra: list[str], item: str) -> list[str]:
    """The simulator's arguments with `item` added to its --fake-versions."""
    if "--fake-versions" not in extra:
        return [*extra, "--fake-versions", item]
    i = extra.index("--fake-versions") + 1
    return [*extra[:i], f"{item},{extra[i]}", *extra[i + 1 :]]


def say(text: str) -> None:
    print(text, flush=True)


def _start_sim(work: Path, scenario: str, mode: str, extra: list[str], cdn_port: int) -> _Sim:
    port_file = work / "sim.port"
    port_file.unlink(missing_ok=True)
    log_file, gpu_file = work / "vllm.log", work / "gpu.jsonl"
    (work / "sim").mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario, "--mode", mode]
    argv += ["--gpu-file", str(gpu_file), "--log-file", str(log_file), "--port", "0"]
    argv += [
        "--port-file",
        str(port_file),
        "--cdn-url",
        f"http://127.0.0.1:{cdn_port}/artifactory/",
    ]
    argv += ["--workdir", str(work / "sim"), *extra]
    with open(work / "sim.stdout", "wb") as out, open(work / "sim.stderr", "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)
    _await_files(proc, [log_file, gpu_file])  # attach once they exist: no "missing file" warnings
    port = None
    if mode == "serve":
        end = time.monotonic() + 20
        while time.monotonic() < end and port is None and proc.poll() is None:
            text = port_file.read_text().strip() if port_file.exists() else ""
            port = int(text) if text.isdigit() else None
            time.sleep(0.1)
    return _Sim(proc, log_file, gpu_file, port)


def _await_files(proc: subprocess.Popen[bytes], paths: list[Path], limit_s: float = 20) -> None:
    """Wait until the simulator has created its log and GPU files (or exited)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None and not all(p.exists() for p in paths):
        time.sleep(0.05)


def _watch(
    sim: _Sim, work: Path, cdn_port: int, expected: str | None, args: argparse.Namespace
) -> tuple[Any, Any]:
    from watchdog.daemon.wiring import build

    values: dict[str, Any] = {
        "pid": sim.proc.pid,
        "log_files": [str(sim.log_file)],
        "gpu_source": f"file:{sim.gpu_file}",
        "cdn_hosts": [f"127.0.0.1:{cdn_port}"],
        "cdn_default": False,  # the demo never resolves or contacts NVIDIA's CDN
        "metrics_addr": "off",
        "incident_dir": str(work / "incidents"),
        "state_dir": str(work / "state"),
        "stack_second_after_s": 2.0,
    }
    if sim.port is not None:
        values["server_url"] = f"http://127.0.0.1:{sim.port}"
    built = build(build_config(values, origin="demo"), emitter=Emitter("text", stream=sys.stdout))
    say("[demo] watchdog attached; state changes follow\n")

    def done(v: Any) -> bool:
        ep = built.episodes.episode if built.episodes is not None else None
        return expected is not None and v.is_hang and ep is not None and ep.incident is not None

    limit = args.timeout if expected is not None else args.watch_s
    try:
        verdict = built.daemon.run(until=done, max_seconds=limit)
    finally:
        built.close()
    return verdict, built


def _report(verdict: Any, built: Any, expected: str | None, work: Path) -> int:
    say("")
    if verdict is None:
        say("[demo] the watchdog made no observation")
        return 1
    incidents = list(built.episodes.incidents) if built.episodes is not None else []
    if expected is None:
        ok = not verdict.is_hang and verdict.state not in ("stalled", "hung")
        say(
            f"[demo] final state: {verdict.state} ({verdict.reason}); "
            f"no hang reported: {'yes' if ok else 'NO'}"
        )
        return 0 if ok else 1
    # The verdict block (what, why, evidence, fix, what remediation would do) is already
    # above, printed once by the watchdog's emitter.
    for path in incidents:
        say(f"[demo] incident bundle: {path}")
        say(f"[demo]   {', '.join(sorted(p.name for p in Path(path).iterdir()))}")
    ok = verdict.signature == expected and bool(incidents)
    if not ok:
        say(f"[demo] expected {expected}, got {verdict.signature or verdict.state}")
    return 0 if ok else 1


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
