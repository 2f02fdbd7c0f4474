"""A spin judged without DRAM figures: power against the board's limit, SM clocks, host CPU.

The shapes come from GB10 (DGX Spark) reports where neither GPM nor DCGM profiling exists:
~96 % busy at 13-27 W while deadlocked against ~45 W healthy (vllm #46097,
eugr/spark-vllm-docker #260, AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-DFlash #10).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.obsbuilder import SERVER_PID, SYNC_STACK, Timeline, frozen_bar, procs, stack, verdicts
from watchdog.config import ConfigError, build_config
from watchdog.core.judge.classify import Thresholds
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import GpuSample, ProcInfo, ProcSnapshot

GB10_LIMIT_W = 100.0  # a board limit for the ratio; the reports give draws, not the limit


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def gb10(power_w: float | None, clock: float | None = 2400.0, **kw: object) -> GpuSample:
    """GB10 as NVML/DCGM report it without DRAM figures: utilisation, power, clocks."""
    base = GpuSample(
        index=0,
        uuid="GPU-0b10",
        name="NVIDIA GB10",
        cc="12.1",
        sm=0.96,
        dram=None,
        power_w=power_w,
        sm_clock_mhz=clock,
        procs=1,
        pids=(SERVER_PID + 1,),
        method="dcgm_dev",
        power_limit_w=GB10_LIMIT_W,
        sm_clock_max_mhz=3000.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def busy_tree(tick: int) -> ProcSnapshot:
    """The server's tree, its engine burning one core (a host thread spin-waiting on sync)."""
    tree = (
        ProcInfo(SERVER_PID, 1, "python3", "vllm serve model", 10.0, None, "sleeping"),
        ProcInfo(SERVER_PID + 1, SERVER_PID, "python3", "VLLM::EngineCore", 50.0 + tick),
    )
    return ProcSnapshot(SERVER_PID, True, tree)


def run(sigs: SignatureSet, g: GpuSample, seconds: int = 40) -> list:
    tl = Timeline(gpus=(g,), procs=busy_tree(0))
    frozen_bar(tl, 1)
    for i in range(1, seconds):
        tl.tick(procs=busy_tree(i), stacks=(stack(*SYNC_STACK),) if i >= 10 else ())
    return verdicts(tl.obs, sigs)


def test_low_power_at_high_utilisation_is_a_spin_and_says_which_signals(
    sigs: SignatureSet,
) -> None:
    v = run(sigs, gb10(22.0))[-1][1]
    assert (v.state, v.signature) == ("hung", "gpu_kernel_spin")
    spin = next(e.detail for e in v.evidence if e.kind == "gpu_spin")
    assert "no DRAM figures" in spin
    assert "power 22 W of its 100 W limit (0.22 <= 0.30)" in spin
    assert "SM clock 2400 of 3000 MHz (0.80 >= 0.50" in spin
    assert f"server CPU 1.00 core(s) in pid {SERVER_PID + 1}" in spin
    assert "(source: dcgm_dev)" in spin


def test_healthy_power_at_the_same_utilisation_is_no_spin(sigs: SignatureSet) -> None:
    # ~45 W is what the same GB10 drew while generating: a long batch, not a spin.
    pairs = run(sigs, gb10(45.0))
    assert not any(v.is_hang for _, v in pairs)
    v = pairs[-1][1]
    assert v.state == "stalled" and v.signature is None
    # The stalled verdict still shows what the GPU read, and why no spin was judged.
    assert any(
        e.detail == "GPU 0: SM 0.96, no DRAM figures, power 45 W of 100 W (dcgm_dev)"
        for e in v.evidence
    ), v.evidence


def test_low_power_from_a_low_clock_is_no_spin(sigs: SignatureSet) -> None:
    pairs = run(sigs, gb10(22.0, clock=600.0))
    assert not any(v.is_hang for _, v in pairs)


def test_unknown_clock_still_judges_by_power_and_says_the_clock_was_missing(
    sigs: SignatureSet,
) -> None:
    v = run(sigs, gb10(22.0, clock=None))[-1][1]
    assert v.signature == "gpu_kernel_spin"
    assert "no SM clock figures" in next(e.detail for e in v.evidence if e.kind == "gpu_spin")


@pytest.mark.parametrize(
    "missing", [{"power_limit_w": None}, {"power_w": None}, {"power_limit_w": 0.0}]
)
def test_without_power_figures_nothing_judges_a_spin(
    sigs: SignatureSet, missing: dict[str, object]
) -> None:
    pairs = run(sigs, replace(gb10(22.0), **missing))  # type: ignore[arg-type]
    assert not any(v.is_hang for _, v in pairs)
    assert pairs[-1][1].state == "stalled"


def test_dram_figures_win_over_power_when_both_exist(sigs: SignatureSet) -> None:
    # A DRAM-busy GPU at low power is real (memory-bound) work; DRAM is the better figure.
    pairs = run(sigs, gb10(22.0, dram=0.6))
    assert not any(v.is_hang for _, v in pairs)
    # Above the no-DRAM power bound (0.30) but well below the limit: DRAM decides, a spin.
    v = run(sigs, gb10(40.0, dram=0.0))[-1][1]
    detail = next(e.detail for e in v.evidence if e.kind == "gpu_spin")
    assert "DRAM 0.00" in detail and "judged by" not in detail
    assert "power 40 W of its 100 W limit (0.40 <= 0.50: not compute-bound)" in detail
    # Near the limit it computes, whatever DRAM says (tests/test_spin_computebound.py).
    assert not any(v.is_hang for _, v in run(sigs, gb10(95.0, dram=0.0)))


def test_spin_thresholds_follow_the_config(sigs: SignatureSet) -> None:
    th = Thresholds(gpu_spin_power_ratio=0.2)
    tl = Timeline(gpus=(gb10(22.0),), procs=procs())
    frozen_bar(tl, 40)
    assert not any(v.is_hang for _, v in verdicts(tl.obs, sigs, th))


@pytest.mark.parametrize(
    "key",
    ["gpu_spin_power_ratio", "gpu_spin_clock_ratio", "gpu_spin_power_max_ratio", "gpu_spin_tensor"],
)
def test_spin_ratio_keys_refuse_values_above_one(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build_config({key: 30})
    assert getattr(build_config({key: 0.4}), key) == 0.4
