"""Helpers shared by several test modules: stand-ins, builders and constants that used to be
imported from one test module into another (which ran that module's tests' imports too)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.shipped import KNOWLEDGE
from tests.simfixtures import sim_env
from tests.tickkit import TickKit
from watchdog.config import build_config
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import GpuSample, Observation, ProcSnapshot, Verdict
from watchdog.daemon.episodes import Episode, EpisodeHook
from watchdog.outputs.export import MetricsSink
from watchdog.outputs.fleet import FleetLabels
from watchdog.preflight.checks_gpu import collect_gpus
from watchdog.remediation.deployment import decider_for
from watchdog.remediation.hook import RemediationHook
from watchdog.remediation.machine import Phase
from watchdog.remediation.settings import RemediationConfig
from watchdog.remediation.state import StateStore
from watchdog.sim.cdn import free_port
from watchdog.sim.versions import write_dist_infos
from watchdog.sources.gpu.backend import FabricInfo
from watchdog.sources.gpu.fake import FakeGpuBackend
from watchdog.sources.logs.stackdumps import StackScanner
from watchdog.sources.pyenv import COMMON

# What the daemon's wiring hands build_environment: the shipped profiles' own distributions.
ENGINE_PACKAGES = tuple(p for p in KNOWLEDGE.packages if p not in COMMON)


# -- from test_systemd_units.py -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


SYSTEMD = ROOT / "systemd"


# Where the units expect the executables; the test points them at stand-ins it controls.
EXECUTABLES = {
    "/usr/local/bin/hang-watchdog": "hang-watchdog",
    "/opt/vllm/bin/vllm": "vllm",
    "/opt/sglang/bin/sglang": "sglang",
}


needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt systemd)"
)


def unit_entries(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment; repeated keys are kept, unlike configparser."""
    entries: list[tuple[str, str, str]] = []
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(path: Path, key: str, section: str = "Service") -> list[str]:
    return [v for s, k, v in unit_entries(path) if s == section and k == key]


def stage(tmp_path: Path) -> Path:
    """Copy the units and drop-in to tmp_path with ExecStart paths pointing at stand-ins."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in EXECUTABLES.values():
        stub = bindir / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    for src in [*SYSTEMD.glob("*.service"), *SYSTEMD.glob("*.service.d/*.conf")]:
        dst = tmp_path / src.relative_to(SYSTEMD)
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        for path, name in EXECUTABLES.items():
            text = text.replace(path, str(bindir / name))
        dst.write_text(text)
    return tmp_path


def verify(*units: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    """verify exits 0 even on unknown keys (it only warns), so a clean run also has no output."""
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


# -- from test_remediation.py -------------------------------------------------------------

SIGS = load_signatures()


def hang(sig: str = "trtllm_attention_deadlock", confidence: float = 0.95) -> Verdict:
    s = SIGS.get(sig)
    assert s is not None
    return Verdict(state="hung", signature=sig, confidence=confidence, fallback=s.fallback)


def metric(sink: MetricsSink, name: str, **labels: str) -> float | None:
    for family in sink.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


class FakeDaemon(TickKit):
    """The ticks a hook sees, with the window's facts set (the vLLM version for the plan)."""

    def __init__(self, facts: dict[str, Any]) -> None:
        super().__init__(facts)


def remedy_config(values: dict[str, Any]) -> RemediationConfig:
    """The remediation's own keys of the config `values` make, as the wiring hands them down."""
    return RemediationConfig.of(build_config(values))


def episodes(started_t: float) -> EpisodeHook:
    """An episode hook (no capturer, no writer) with one episode open since `started_t`."""
    hook = EpisodeHook()
    hook.episode = Episode(started_t=started_t, started_wall=0.0)
    return hook


def obs(t: float, pid: int | None = None) -> Observation:
    procs = ProcSnapshot(alive=True, target_pid=pid) if pid else None
    return Observation(t=t, wall=time.time(), procs=procs)


def settled(hook: RemediationHook) -> bool:
    """No restart thread running: watching, verifying, or the restarter's thread ended."""
    m = hook.machine
    return m.phase is not Phase.RESTARTING or not m.attempt.job.thread.is_alive()


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


class RecordingRestarter:
    """A restarter that only records calls (used where the test is about *not* acting)."""

    name = "recording"

    env_file: str | None = None

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def restart(self, plan: Any, target_pid: int | None) -> str:
        self.calls.append((plan, target_pid))
        return "recorded"


def make_hook(
    tmp_path: Path, **cfg: Any
) -> tuple[RemediationHook, RecordingRestarter, MetricsSink]:
    config = build_config(
        {"remediate": True, "state_dir": str(tmp_path / "st"), "cooldown_s": 0.0, **cfg}
    )
    restarter, sink = RecordingRestarter(), MetricsSink(SIGS.ids, version="test")
    node = FleetLabels.resolve(config.deployment, config.node).node  # as the wiring names it
    remedy = RemediationConfig.of(config)
    hook = RemediationHook(remedy, SIGS, restarter=restarter, store=StateStore(config.state_dir),
                           metrics=sink, episodes=episodes(1.0),
                           fleet=decider_for(remedy, node))  # fmt: skip
    return hook, restarter, sink


# -- from test_remediation_e2e.py ---------------------------------------------------------


class Watchdog:
    """One `hang-watchdog run` process supervising the simulator."""

    def __init__(
        self,
        tmp: Path,
        scenario: str,
        versions: dict[str, str],
        *extra: str,
        sim_args: tuple[str, ...] = (),
    ) -> None:
        self.tmp, self.port = tmp, free_port()
        fake = tmp / "versions"
        write_dist_infos(str(fake), versions)  # the sim's interpreter reports these versions
        env = sim_env()
        env["PYTHONPATH"] = f"{fake}{os.pathsep}{env['PYTHONPATH']}"
        gpu = tmp / "gpu.jsonl"
        argv = [sys.executable, "-m", "watchdog", "run", "--gpu-source", f"file:{gpu}",
                "--server-url", f"http://127.0.0.1:{self.port}", "--state-dir", str(tmp / "state"),
                "--incident-dir", str(tmp / "incidents"), "--metrics-addr", "127.0.0.1:0",
                "--no-cdn-default", "--tick-s", "0.5", "--stall-after-s", "3",
                "--suspect-after-s", "2", "--stack-second-after-s", "1", "--gpu-spin-for-s", "2",
                "--stop-grace-s", "5", "--cooldown-s", "0", "--recover-within-s", "60", *extra,
                "--", sys.executable, "-m", "watchdog.sim.vllm_sim", "--scenario", scenario,
                "--mode", "serve", "--port", str(self.port), "--startup-s", "1",
                "--gpu-file", str(gpu), "--stats-interval", "1", "--workdir", str(tmp),
                *sim_args]  # fmt: skip
        self.err = tmp / f"watchdog-{time.monotonic_ns()}.err"
        with open(self.err, "wb") as fh:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=fh)

    def text(self) -> str:
        return self.err.read_bytes().decode("utf-8", "replace")

    def wait_for(self, regex: str, timeout: float = 90.0) -> re.Match[str]:
        end = time.monotonic() + timeout
        while True:
            match = re.search(regex, self.text())
            if match:
                return match
            if time.monotonic() > end or self.proc.poll() is not None:
                raise AssertionError(
                    f"no {regex!r} (rc={self.proc.poll()}); tail:\n{self.text()[-3000:]}"
                )
            time.sleep(0.2)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        port = self.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics").group(1)
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
        out = {}
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def starts(self) -> list[str]:
        return re.findall(r"INFO: started (.*) \(pid \d+\)", self.text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def remediation_record(tmp: Path) -> dict[str, Any]:
    records = [
        json.loads(p.read_text()).get("remediation")
        for p in sorted((tmp / "incidents").glob("*/incident.json"))
    ]
    found = [r for r in records if r]
    assert found, "no incident bundle records a remediation"
    return found[-1]


# -- from test_engines.py -----------------------------------------------------------------

GOOD = """
schema = 1
[[engine]]
name = "acme"
title = "Acme Serve"
[engine.detect]
cmdline = ['acme-serve']
[[engine.role]]
role = "worker"
title = '^acme::gpu(?P<rank>\\d+)$'
[engine.metrics]
path = "/stats"
sample = [
  { name = "acme_steps_total", field = "iterations", type = "counter" },
  { name = "acme_queue", field = "waiting", type = "gauge" },
]
[engine.health]
path = "/ping"
answers = { 500 = "dead" }
[[engine.log.rule]]
kind = "stats"
needle = "acme step "
pattern = 'acme step (?P<iteration>\\d+) queue=(?P<waiting>\\d+)'
types = { iteration = "int", waiting = "int" }
set = { stepped = true }
"""


# -- from test_journal.py -----------------------------------------------------------------

# The stand-in records its argv, prints what $STANDIN_OUT holds, then follows (sleeps) or exits.
STANDIN = """#!{python}
import json, os, sys, time
with open(os.environ["STANDIN_ARGV"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.stdout.buffer.write(open(os.environ["STANDIN_OUT"], "rb").read())
sys.stdout.flush()
if os.environ.get("STANDIN_EXIT"):
    sys.stderr.write("Failed to open journal: Permission denied\\n")
    sys.exit(int(os.environ["STANDIN_EXIT"]))
time.sleep(60)
"""


def install_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """Put a stand-in `journalctl` first on PATH; it records each argv in argv.jsonl."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "journalctl"
    script.write_text(source.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_ARGV", str(tmp_path / "argv.jsonl"))


# -- from test_kubernetes.py --------------------------------------------------------------

VERSIONS = ["1.29.0", "1.37.0"]


KV = [sys.executable, "-m", "kubernetes_validate"]


# -- from test_fleet_rules.py -------------------------------------------------------------

FLEET_DASHBOARD = ROOT / "grafana" / "hang-watchdog-fleet-dashboard.json"


def fleet_dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) of the fleet dashboard, with its variable as Grafana expands All."""
    import json

    dash = json.loads(FLEET_DASHBOARD.read_text())
    return [
        (p["title"], t["expr"].replace("$deployment", ".+"))
        for p in dash["panels"]
        for t in p.get("targets", [])
    ]


# -- from test_logscan.py -----------------------------------------------------------------

DATA = Path(__file__).parent / "data" / "logs"


NOISE = [
    b'(APIServer pid=1) INFO:     172.31.0.7:37016 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
    # a key split by a colour code only matches once the escape is removed
    b"\x1b[1;31mERROR\x1b[0m 11-30 08:00:01 [core.py:9] Engine\x1b[0mDeadError: engine gone\n",
    # NULs inside a key (the splitter drops them before anything else looks)
    b"(APIServer pid=2) ERROR EngineDead\x00Error: x\n",
    b"INFO 04-09 02:05:52 [loader.py:447] Loading weights took 33.15 seconds\r\n",
    b"Processed prompts:  50%|# | 1/2 [00:01<00:01, 1.00it/s]\r",
    b"Processed prompts: 100%|##| 2/2 [00:02<00:00, 1.00it/s]2026-11-30 08:08:29,185 - INFO - "
    b"cubin_loader.py:90 - flashinfer.jit: Fetching a.cubin from https://edge.example/a\n",
    b"\n\n\r\n",
    b"\xff\xfe invalid utf-8 then EngineDeadError \xc3\n",
    b"x" * 70000 + b" EngineDeadError beyond the truncation point\n",
    b"EngineDeadError at the start of an over-long line " + b"y" * 70000 + b"\n",
    b"NCCL INFO Channel 00/32 :    0   1   2   3   4   5   6   7\n" * 3,
]


# Stack dumps inside the log (watchdog/sources/logs/stackdumps.py): a py-spy dump and a traceback,
# interleaved with ordinary lines.
STACKS = (
    b"Process 4242: python -m sglang.launch_server\n"
    b"Python v3.12.3 (/usr/bin/python3.12)\n\n"
    b'Thread 4242 (idle): "MainThread"\n'
    b"    wait (threading.py:355)\n"
    b"    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
    b'(APIServer pid=1) INFO:     172.31.0.7:37016 - "GET /health HTTP/1.1" 200 OK\n'
    b"Traceback (most recent call last):\n"
    b'  File "/app/serve.py", line 10, in <module>\n'
    b"    main()\n"
    b"RuntimeError: NCCL communicator was aborted\n"
    b"INFO 12-01 10:00:00 [core.py:1] unrelated\n" * 5
)


# A worker's traceback, then a busy API server's access lines (another stream) past the stack
# scanner's span, then a frame line of the worker's stream that comes too late to join it.
SPAN = (
    b"(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1] Traceback (most recent call last):\n"
    b'(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1]   File "/v/a.py", line 9, in step\n'
    + NOISE[0]
    * (StackScanner().max_span + 5)
    + b'(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1]   File "/v/b.py", line 3, in late\n'
    b"(Worker_TP0 pid=10) ERROR 01-12 02:58:31 [x.py:1] RuntimeError: late\n"
)


def workload(seed: int) -> bytes:
    """Every sample plus the noise, shuffled in, ending without a newline."""
    rng = random.Random(seed)
    parts = [p.read_bytes() for p in sorted(DATA.glob("*.log"))] + NOISE * 3 + [STACKS] * 3
    parts += [SPAN] * 2
    rng.shuffle(parts)
    return b"".join(parts) + b"Capturing CUDA graphs:  40%|####  | 27/67 [00:01<00:02]"


# -- from test_preflight.py ---------------------------------------------------------------


def gpus(*ccs: str, fabric: dict[int, FabricInfo | None] | None = None) -> FakeGpuBackend:
    script = {i: [GpuSample(index=i, name=f"NVIDIA GPU {cc}", cc=cc)] for i, cc in enumerate(ccs)}
    return FakeGpuBackend(script, driver="580.82.07", fabric=fabric)


def inventory(*ccs: str, fabric: dict[int, FabricInfo | None] | None = None):  # noqa: ANN201
    return collect_gpus(gpus(*ccs, fabric=fabric), 5.0)


# -- from test_pyenv.py -------------------------------------------------------------------


def write_dist(site: Path, name: str, version: str) -> None:
    """A minimal installed distribution: <name>-<version>.dist-info/METADATA."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


# -- from test_e2e_supervise.py -----------------------------------------------------------

SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]


SIM = [sys.executable, "-m", "watchdog.sim.vllm_sim"]


def workdir(tmp_path: Path) -> Path:
    """A scratch directory for a supervised sim (it must exist before the sim starts)."""
    path = tmp_path / "simwork"
    path.mkdir(exist_ok=True)
    return path
