"""End to end with the simulator as TensorRT-LLM's `trtllm-serve` (`--engine trtllm`): its log
formats, `trtllm_` metrics on /prometheus/metrics, /health and its MPI worker, watched by a real
`hang-watchdog` with real py-spy and sockets. The simulated API server runs as a `trtllm-serve`
console script, so the watchdog is never told the engine: it detects it from the command line.

Run under the shared lock: `flock /tmp/e2e.lock python3 -m pytest -q tests/test_e2e_trtllm.py`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, run_watchdog, state_events, watch_sources
from watchdog.sim.config import SimConfig

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory

pytestmark = pytest.mark.slow

SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]
SHORT += ["--gpu-spin-for-s", "4", "--no-cdn-default"]  # no --engine: detected
TRT = ["--engine", "trtllm", "--mode", "serve"]
ITER = re.compile(
    r"^\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] \[TRT-LLM\] \[I\] iter = \d+, global_rank = 0"
)


def test_trtllm_serves_its_endpoints_and_worker(sim_factory: Callable[..., SimHandle]) -> None:
    sim = sim_factory("healthy", mode="serve", extra_args=TRT)
    sim.wait_for_line(ITER.pattern)
    base = f"http://127.0.0.1:{sim.port}"
    assert httpx.get(f"{base}/health", timeout=10, trust_env=False).status_code == 200
    stats = httpx.get(f"{base}/metrics", timeout=10, trust_env=False).json()  # JSON, not text
    assert stats[0]["numActiveRequests"] == 4 and stats[0]["iter"] > 0
    text = httpx.get(f"{base}/prometheus/metrics", timeout=10, trust_env=False).text
    assert 'trtllm_generation_tokens_total{engine_type="trtllm"' in text
    assert "trtllm_num_requests_running" in text
    sim.child_pid("mpi4py.futures.server")  # the MPI pool worker that runs the executor
    # The API server's argv as pip's console script gives it: python .../trtllm-serve serve MODEL
    argv = psutil.Process(sim.pid).cmdline()
    assert Path(argv[1]).name == "trtllm-serve", argv
    assert argv[2:6] == ["serve", SimConfig.model, "--backend", "pytorch"], argv


def test_trtllm_is_detected_from_its_command_line(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    """No --engine: pending work comes from the trtllm_ gauges on /prometheus/metrics, which
    only the detected trtllm profile names (an unknown engine reads no metrics at all)."""
    sim = sim_factory("healthy", mode="serve", extra_args=TRT)
    sim.wait_for_line(ITER.pattern)
    done = run_watchdog(
        "diagnose", *watch_sources(sim), *SHORT, "--json", "--duration", "6", cwd=tmp_path
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["state"] == "serving", verdict
    assert "requests running or waiting (/metrics)" in verdict["reason"], verdict["reason"]


def test_trtllm_cubin_stall_named_with_its_fix(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """The first batch fetches FlashInfer's TRTLLM-gen cubins and never returns."""
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*TRT, "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    args = [*watch_sources(sim), "--cdn-host", f"127.0.0.1:{cdn}", *SHORT, "--json"]
    done = run_watchdog("diagnose", *args, "--duration", "25", cwd=tmp_path)
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["signature"] == "cubin_download_stall", verdict
    assert {"stacks", "conns"} <= {e["source"] for e in verdict["evidence"]}, verdict["evidence"]
    assert any("download_file" in e["detail"] for e in verdict["evidence"])
    assert "TLLM_FMHA_LIBS=-flashinfer_trtllm_gen" in verdict["fix"] + " ".join(verdict["commands"])
    assert "--attention-config" not in " ".join(verdict["commands"])  # not vLLM's spelling


def test_trtllm_kernel_spin_is_hung_and_its_hang_detector_is_read(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    """A spinning kernel: named before TensorRT-LLM's own HangDetector (here 12 s) fires; its
    `Hang detected after` line and the worker's self-SIGKILL then show in the log."""
    sim = sim_factory(
        "kernel_deadlock", mode="serve", extra_args=[*TRT, "--cc", "9.0", "--hang-detector-s", "12"]
    )
    done = run_watchdog(
        "diagnose", *watch_sources(sim), *SHORT, "--json", "--duration", "60", "--until-hang",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["state"] == "hung" and verdict["signature"] == "gpu_kernel_spin", verdict
    assert "HangDetector" in verdict["fix"], verdict["fix"]  # TensorRT-LLM's fix text
    line = sim.wait_for_line(r"\[TRT-LLM\] \[E\] Hang detected after (\d+) seconds\.", 60)
    assert line.group(1) == "12"
    sim.wait_for_line(r"HangDetector: self-SIGKILL", 20)
    # The log as the operator would paste it: replay names TensorRT-LLM's own verdict.
    replay = run_watchdog("replay", str(sim.log_file), "--json", cwd=tmp_path)
    matches = [m["signature"] for m in json.loads(replay.stdout)["matches"]]
    assert "trtllm_hang_detector_fired" in matches, replay.stdout[-2000:]
    base = f"http://127.0.0.1:{sim.port}"
    end = httpx.get(f"{base}/health", timeout=10, trust_env=False)
    assert end.status_code == 503 and b"LLM is unavailable" in end.content


def test_trtllm_slow_loading_healthy_and_idle_never_alerted(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    for scenario, extra, duration in (
        ("slow_loading", ["--shards", "3", "--shard-s", "5"], "25"),
        ("healthy", [], "15"),
        ("healthy", ["--load", "0"], "15"),
    ):
        sim = sim_factory(scenario, mode="serve", extra_args=[*TRT, *extra])
        done = run_watchdog(
            "diagnose", *watch_sources(sim), *SHORT, "--log-format", "json", "--duration", duration,
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, f"{scenario}: {done.stdout}\n{done.stderr[-3000:]}"
        seen = [s.get("new") for s in state_events(done.stderr)]
        assert not {"hung", "stalled", "dead"} & set(seen), (scenario, extra, seen)
        sim.stop()


def test_demo_engine_trtllm_names_the_stall_and_its_fix(tmp_path: Path) -> None:
    done = run_watchdog("demo", "--engine", "trtllm", "--workdir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    assert "simulated TensorRT-LLM" in done.stdout
    assert "HUNG  cubin_download_stall (confidence" in done.stdout
    assert "TLLM_FMHA_LIBS=-flashinfer_trtllm_gen" in done.stdout, done.stdout[-3000:]
