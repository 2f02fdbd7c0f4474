"""A compute-bound kernel is never a spin: power near the limit, or tensor cores busy, veto it.

Figures measured on an H200 (700 W limit) with NVML read directly: spinning kernels read GPM SM
1.00, DRAM 0.00 at 136-164 W (0.19-0.23 of the limit); a bf16 matmul whose operands stay in the
60 MB L2 reads SM 0.83-0.87, DRAM 0.026-0.03, tensor 0.72 at 690 W; at 3072^3 SM 0.93, DRAM
0.14; at 8192^3 SM 0.96, DRAM 0.17, tensor 0.93, 690 W.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.obsbuilder import SERVER_PID, SYNC_STACK, Timeline, frozen_bar, procs, stack, verdicts
from watchdog.core.judge.classify import Thresholds
from watchdog.core.judge.spinsignals import spin_by
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import GpuSample

LIMIT_W = 700.0
TH = Thresholds()


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def h200(sm: float, dram: float, power_w: float | None, tensor: float | None = None) -> GpuSample:
    return GpuSample(
        index=0, uuid="GPU-h200", name="NVIDIA H200", cc="9.0", sm=sm, dram=dram,
        power_w=power_w, sm_clock_mhz=1980.0, procs=1, pids=(SERVER_PID,), method="gpm",
        power_limit_w=LIMIT_W, sm_clock_max_mhz=1980.0, tensor=tensor,
    )  # fmt: skip


def run(sigs: SignatureSet, g: GpuSample, th: Thresholds = TH) -> list:
    tl = Timeline(gpus=(g,), procs=procs())
    frozen_bar(tl, 40, stacks=(stack(*SYNC_STACK),))
    return verdicts(tl.obs, sigs, th)


def spin_evidence(pairs: list) -> list[str]:
    return [e.detail for _, v in pairs for e in v.evidence if e.kind == "gpu_spin"]


# At the shipped thresholds' edge: SM at gpu_spin_sm, DRAM at gpu_spin_dram.
EDGE_SM, EDGE_DRAM = TH.gpu_spin_sm, TH.gpu_spin_dram


def test_compute_bound_figures_at_098_of_the_limit_are_no_spin(sigs: SignatureSet) -> None:
    pairs = run(sigs, h200(EDGE_SM, EDGE_DRAM, 0.98 * LIMIT_W))
    assert spin_evidence(pairs) == []
    assert not any(v.signature == "gpu_kernel_spin" for _, v in pairs)
    # The verdict still lists the GPU figures, power included: why it was not a spin.
    last = pairs[-1][1]
    assert any("power 686 W of 700 W" in e.detail for e in last.evidence if e.kind == "gpu")


def test_the_same_figures_at_02_of_the_limit_are_a_spin(sigs: SignatureSet) -> None:
    pairs = run(sigs, h200(EDGE_SM, EDGE_DRAM, 0.2 * LIMIT_W))
    v = pairs[-1][1]
    assert (v.state, v.signature) == ("hung", "gpu_kernel_spin")
    detail = spin_evidence(pairs)[-1]
    assert "power 140 W of its 700 W limit (0.20 <= 0.50: not compute-bound)" in detail


@pytest.mark.parametrize(
    ("what", "sample", "spin"),
    [
        ("flag-polling spin, 2 blocks x 1024 threads per SM", h200(1.0, 0.0, 136.0), True),
        ("the same with __nanosleep(200)", h200(1.0, 0.0, 140.0), True),
        ("the kit's clock64 spin", h200(1.0, 0.0, 164.4), True),
        ("bf16 matmul 2048^3, operands in L2", h200(0.87, 0.03, 690.0, 0.72), False),
        ("bf16 matmul 2048^3 with SM at 0.9", h200(0.9, 0.03, 690.0, 0.72), False),
        ("bf16 matmul 3072^3", h200(0.93, 0.14, 690.0), False),
        ("bf16 matmul 8192^3", h200(0.96, 0.17, 690.0, 0.93), False),
        ("bf16 GEMV (decode-like)", h200(0.87, 0.89, 625.0, 0.04), False),
        ("memcopy", h200(0.97, 0.86, 456.0), False),
    ],
)
def test_measured_h200_figures(what: str, sample: GpuSample, spin: bool) -> None:
    assert (spin_by(sample, TH) is not None) is spin, what


def test_the_power_bound_alone_decides_an_l2_resident_matmul() -> None:
    # SM and DRAM of a spin, no tensor figure (utilisation rates): only power tells.
    assert spin_by(h200(0.95, 0.02, 690.0), TH) is None
    assert spin_by(h200(0.95, 0.02, 150.0), TH) == "dram"


def test_tensor_activity_vetoes_a_spin_at_low_power(sigs: SignatureSet) -> None:
    assert spin_evidence(run(sigs, h200(0.95, 0.02, 150.0, tensor=0.72))) == []
    detail = spin_evidence(run(sigs, h200(0.95, 0.02, 150.0, tensor=0.0)))[-1]
    assert "tensor 0.00 <= 0.10" in detail


def test_without_power_figures_dram_decides_and_says_so(sigs: SignatureSet) -> None:
    g = replace(h200(1.0, 0.0, None), power_limit_w=None)
    detail = spin_evidence(run(sigs, g))[-1]
    assert "power unknown (no compute-bound check)" in detail


def test_the_power_bound_follows_the_config(sigs: SignatureSet) -> None:
    g = h200(1.0, 0.0, 0.4 * LIMIT_W)
    assert spin_evidence(run(sigs, g))
    assert spin_evidence(run(sigs, g, Thresholds(gpu_spin_power_max_ratio=0.3))) == []
    assert spin_by(h200(1.0, 0.0, 150.0, 0.3), Thresholds(gpu_spin_tensor=0.5)) == "dram"


def test_file_lines_may_carry_tensor_activity() -> None:
    from watchdog.sources.gpu.file import BadLine, parse_line

    sample, _ = parse_line('{"gpu": 0, "sm": 0.9, "dram": 0.03, "tensor": 0.72}')
    assert sample.tensor == 0.72
    assert parse_line('{"gpu": 0, "sm": 0.9, "dram": 0.03}')[0].tensor is None
    with pytest.raises(BadLine, match='"tensor" is 72'):
        parse_line('{"gpu": 0, "sm": 0.9, "dram": 0.03, "tensor": 72}')
