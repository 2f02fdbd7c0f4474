"""End to end: the first large batch after warm-up hangs, on every engine's simulator.

SGLang and TensorRT-LLM write their gauges after a batch returns, so the hung first batch leaves
them at the warm-up's 0, and SGLang's /health (a one-token generation) never answers 200 again.
The watchdog must still see the pending work from its other witnesses (the CDN socket, the
failing health check, the stacks, a spinning GPU) and name a proven cause at stall_after_s,
whether the GPU source has figures, is absent (`--gpu-source none`) or is down. Real processes,
real py-spy, real sockets on 127.0.0.1; default thresholds, so the timing is the shipped one.

Run under the shared lock: `flock /tmp/e2e.lock python3 -m pytest -q tests/test_e2e_first_batch.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, run_watchdog, state_events

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory

pytestmark = pytest.mark.slow

ENGINE_ARGS = {
    "sglang": ["--engine", "sglang", "--health-timeout-s", "20"],
    "trtllm": ["--engine", "trtllm"],
    "vllm": [],
}
GOAL_S = 20.0  # onset to verdict, with the default stall_after_s (15 s) and stack capture


def _gpu_flags(sim: SimHandle, gpu: str, tmp_path: Path) -> list[str]:
    if gpu == "figures":
        return ["--gpu-source", f"file:{sim.gpu_file}"]
    if gpu == "down":  # a source that never answers (NVML blocked behind a GPU in trouble)
        return ["--gpu-source", f"file:{tmp_path / 'no-such-gpu-file.jsonl'}"]
    return ["--gpu-source", "none"]


def _sources(sim: SimHandle, gpu: str, tmp_path: Path) -> list[str]:
    return [
        "--pid", str(sim.pid), *_gpu_flags(sim, gpu, tmp_path), "--log-file", str(sim.log_file),
        "--server-url", f"http://127.0.0.1:{sim.port}", "--no-cdn-default",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "gpu"),
    [
        ("sglang", "figures"),
        ("sglang", "none"),
        ("sglang", "down"),
        ("trtllm", "none"),
        ("vllm", "none"),
    ],
)
def test_first_batch_cubin_stall_is_named_within_20_s_whatever_the_gpu_source(
    tmp_path: Path,
    sim_factory: Callable[..., SimHandle],
    cdn_factory: Callable[[str], int],
    engine: str,
    gpu: str,
) -> None:
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*ENGINE_ARGS[engine], "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    args = [*_sources(sim, gpu, tmp_path), "--cdn-host", f"127.0.0.1:{cdn}", "--json"]
    done = run_watchdog("diagnose", *args, "--duration", "60", "--until-hang", cwd=tmp_path)
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["signature"] == "cubin_download_stall", verdict
    took = verdict["seconds_since_progress"]
    print(f"{engine} gpu={gpu}: cubin_download_stall {took:.1f} s after onset")
    assert took <= GOAL_S, verdict
    assert verdict["witnesses"], verdict  # which witnesses said work was pending
    if engine == "sglang":
        # The gauges are frozen at the warm-up's 0: the pending work came from elsewhere.
        assert not any("/metrics" in w for w in verdict["witnesses"]), verdict["witnesses"]


@pytest.mark.parametrize(
    ("engine", "gpu", "want"),
    [
        ("sglang", "figures", "gpu_kernel_spin"),
        ("sglang", "none", None),
        ("trtllm", "figures", "gpu_kernel_spin"),
    ],
)
def test_first_batch_kernel_hang_is_a_spin_with_gpu_figures_and_stalled_without(
    tmp_path: Path,
    sim_factory: Callable[..., SimHandle],
    engine: str,
    gpu: str,
    want: str | None,
) -> None:
    # CC 10.0: not the SM103 TRTLLM-gen deadlock, the generic kernel that never returns.
    sim = sim_factory(
        "kernel_deadlock", mode="serve", extra_args=[*ENGINE_ARGS[engine], "--cc", "10.0"]
    )
    args = [*_sources(sim, gpu, tmp_path), "--json", "--log-format", "json"]
    if want is None:  # no proof of a cause: the blind limit, shortened so the test is short
        args += ["--blind-stall-after-s", "30"]
    done = run_watchdog("diagnose", *args, "--duration", "45", "--until-hang", cwd=tmp_path)
    verdict = json.loads(done.stdout)
    if want is not None:
        assert (done.returncode, verdict["signature"]) == (1, want), verdict
        assert verdict["seconds_since_progress"] <= GOAL_S, verdict
        return
    states = [e.get("new") for e in state_events(done.stderr)]
    assert "stalled" in states, (states, verdict)
    assert not {"hung", "dead"} & set(states), states


def test_a_download_that_ends_in_a_crash_names_the_cause_and_the_death(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """The CDN answers nothing: FlashInfer's four tries (2 s timeout here, 5/10/20 s backoff),
    `Max retries reached`, and the SGLang scheduler raises; the launcher takes the tree down."""
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=[*ENGINE_ARGS["sglang"], "--cdn-timeout", "2",
                    "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )  # fmt: skip
    args = [*_sources(sim, "none", tmp_path), "--cdn-host", f"127.0.0.1:{cdn}", "--json"]
    args += ["--log-format", "json", "--incident-dir", str(tmp_path / "incidents")]
    done = run_watchdog("diagnose", *args, "--duration", "75", cwd=tmp_path, timeout=150)
    verdict = json.loads(done.stdout)
    assert (
        "Max retries reached" in sim.log_text() and "Scheduler hit an exception" in sim.log_text()
    )
    assert (verdict["state"], verdict["signature"]) == ("dead", "cubin_download_stall"), verdict
    assert verdict["fallback"] == "disable_trtllm_attention"
    death = [e["detail"] for e in verdict["evidence"] if e["kind"] == "consequence"]
    assert death and "sglang_scheduler_crashed" in death[0], verdict["evidence"]
    named = {(e.get("verdict") or {}).get("signature") for e in state_events(done.stderr)} - {None}
    assert named == {"cubin_download_stall"}, named  # never the consequence instead


# The fallback each engine spells for disable_trtllm_attention, and the versions the server has.
FALLBACKS = {
    "sglang": ({"sglang": "0.5.23", "flashinfer-python": "0.6.7"},
               "--attention-backend flashinfer"),
    "vllm": ({"vllm": "0.14.0", "flashinfer-python": "0.6.7"},
             "--attention-config.use_trtllm_attention=0"),
    "trtllm": ({"tensorrt-llm": "1.3.0", "flashinfer-python": "0.6.7"}, ""),
}  # fmt: skip


@pytest.mark.parametrize("engine", sorted(FALLBACKS))
def test_supervise_restarts_a_first_batch_cubin_stall_with_the_fallback_and_sees_it_serve(
    tmp_path: Path, cdn_factory: Callable[[str], int], engine: str
) -> None:
    from tests.fakes import Watchdog, remediation_record

    versions, flag = FALLBACKS[engine]
    cdn = cdn_factory("blackhole")
    wd = Watchdog(
        tmp_path,
        "cubin_download_stall",
        versions,
        "--remediate",
        "--cdn-host",
        f"127.0.0.1:{cdn}",
        sim_args=(*ENGINE_ARGS[engine], "--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"),
    )
    try:
        wd.wait_for(r"remediation: recovered", timeout=150)
        starts = wd.starts()
        assert len(starts) == 2, starts
        plan = remediation_record(tmp_path)["plan"]
        assert plan["signature"] == "cubin_download_stall", plan
        if flag:
            assert starts[1].endswith(flag), starts
        else:  # TensorRT-LLM: fmha/registry.py reads TLLM_FMHA_LIBS from the environment
            assert plan["env"] == {"TLLM_FMHA_LIBS": "-flashinfer_trtllm_gen"}, plan
    finally:
        wd.stop()
