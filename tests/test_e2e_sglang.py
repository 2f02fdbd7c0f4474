"""End to end with the simulator in SGLang mode (`--engine sglang`): its formats, metric names,
/health and process titles, watched by a real `hang-watchdog` with real py-spy and sockets.

Run under the shared lock: `flock /tmp/e2e.lock python3 -m pytest -q tests/test_e2e_sglang.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, run_watchdog, state_events, watch_sources

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory

pytestmark = pytest.mark.slow

SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]
SHORT += ["--gpu-spin-for-s", "4", "--no-cdn-default"]
SGL = ["--engine", "sglang", "--mode", "serve", "--stats-interval", "1", "--health-timeout-s", "5"]


def test_sglang_cubin_stall_named_from_stack_and_socket(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """SGLang hides FlashInfer's `Fetching` lines: the stall is named from stack and socket."""
    cdn = cdn_factory("blackhole")
    # The server's environment has sglang 0.5.23 installed (its dist-info on its sys.path).
    site = tmp_path / "site" / "sglang-0.5.23.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*SGL, "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
        env={"PYTHONPATH": str(site.parent)},
    )
    args = [*watch_sources(sim), "--cdn-host", f"127.0.0.1:{cdn}", *SHORT, "--json"]
    # No --until-hang: the socket names the stall first, the py-spy dumps confirm it a tick later.
    done = run_watchdog("diagnose", *args, "--duration", "25", cwd=tmp_path)
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["signature"] == "cubin_download_stall", verdict
    assert verdict["engine"] == "sglang 0.5.23"  # read from the server's own metadata
    sources_seen = {e["source"] for e in verdict["evidence"]}
    assert {"stacks", "conns"} <= sources_seen, verdict["evidence"]
    assert any("download_file" in e["detail"] for e in verdict["evidence"])
    assert "--attention-backend flashinfer" in verdict["fix"] + " ".join(verdict["commands"])
    assert "Fetching" not in sim.log_text()  # FlashInfer's logger is at ERROR under SGLang


def test_sglang_kernel_deadlock_and_roles(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    sim = sim_factory("kernel_deadlock", mode="serve", extra_args=[*SGL, "--cc", "10.0"])
    done = run_watchdog(
        "diagnose", *watch_sources(sim), *SHORT, "--json", "--duration", "60", "--until-hang",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["signature"] == "gpu_kernel_spin", verdict
    assert "engine_dead" not in done.stdout  # SGLang's /health 503 is not a dead engine


def test_sglang_slow_loading_and_idle_are_never_alerted(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    slow = sim_factory(
        "slow_loading", mode="serve", extra_args=[*SGL, "--shards", "3", "--shard-s", "5"]
    )
    done = run_watchdog(
        "diagnose", *watch_sources(slow), *SHORT, "--log-format", "json", "--duration", "25",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    bad = [s for s in state_events(done.stderr) if s.get("new") in ("hung", "stalled", "dead")]
    assert bad == []
    idle = sim_factory("healthy", mode="serve", extra_args=[*SGL, "--load", "0"])
    done = run_watchdog(
        "diagnose", *watch_sources(idle), *SHORT, "--log-format", "json", "--duration", "20",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    seen = [s.get("new") for s in state_events(done.stderr)]
    assert "idle" in seen and not {"hung", "stalled", "dead"} & set(seen), seen


def test_sglang_remediation_restarts_with_its_attention_backend_and_recovers(
    tmp_path: Path,
) -> None:
    """Supervise mode: TRTLLM attention deadlock on GB300 + FlashInfer 0.6.7, under SGLang:
    the restart appends `--attention-backend flashinfer` and the server makes progress again."""
    from tests.fakes import Watchdog, remediation_record

    versions = {"sglang": "0.5.23", "flashinfer-python": "0.6.7"}
    wd = Watchdog(
        tmp_path,
        "hang_unless_fallback",
        versions,
        "--remediate",
        sim_args=("--engine", "sglang", "--health-timeout-s", "5"),
    )
    try:
        wd.wait_for(r"remediation: recovered", timeout=150)
        starts = wd.starts()
        assert len(starts) == 2 and starts[1].endswith("--attention-backend flashinfer"), starts
        assert "--attention-config" not in starts[1]
        plan = remediation_record(tmp_path)["plan"]
        assert plan["args"] == ["--attention-backend", "flashinfer"], plan
        assert "SGLang spelling" in plan["how"]
    finally:
        wd.stop()


def test_demo_engine_sglang_names_the_stall_and_its_fallback(tmp_path: Path) -> None:
    done = run_watchdog("demo", "--engine", "sglang", "--workdir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    assert "simulated SGLang" in done.stdout
    assert "HUNG  cubin_download_stall (confidence" in done.stdout
    assert "--attention-backend flashinfer (SGLang spelling" in done.stdout, done.stdout[-3000:]
