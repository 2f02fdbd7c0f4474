"""Preflight through the engine profile: SGLang's attention backend and the cubin path it takes."""

from __future__ import annotations

from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import GpuSample
from watchdog.engines.loader import load_engines
from watchdog.preflight.checks_engine import check_attention_path
from watchdog.preflight.checks_gpu import collect_gpus
from watchdog.preflight.checks_versions import check_known_bad, check_versions
from watchdog.sources.gpu.fake import FakeGpuBackend


def inventory(*ccs: str):  # noqa: ANN201
    script = {i: [GpuSample(index=i, name=f"NVIDIA GPU {cc}", cc=cc)] for i, cc in enumerate(ccs)}
    return collect_gpus(FakeGpuBackend(script, driver="580.82.07"), 5.0)


SGL = load_engines().get("sglang")
FI = {"flashinfer-python": "0.6.7", "flashinfer-cubin": None, "sglang": "0.5.23"}


def test_sglang_default_backend_on_sm103_fetches_cubins() -> None:
    assert SGL is not None
    result = check_attention_path(SGL, ["--model-path", "m"], inventory("10.3"), FI)
    assert result is not None and result.status == "WARN"
    assert "picks TRTLLM-gen on compute capability 10.3" in result.reason
    assert any("--attention-backend flashinfer" in f for f in result.fixes)


def test_sglang_other_backend_or_cubin_package_passes() -> None:
    assert SGL is not None
    for args in (["--attention-backend", "triton"], ["--attention-backend=flashinfer"]):
        result = check_attention_path(SGL, args, inventory("10.3"), FI)
        assert result is not None and result.status == "PASS", args
        assert "no TRTLLM-gen cubins" in result.reason
    with_pkg = check_attention_path(SGL, [], inventory("10.3"), {**FI, "flashinfer-cubin": "0.6.7"})
    assert (
        with_pkg is not None and with_pkg.status == "PASS" and "flashinfer-cubin" in with_pkg.reason
    )
    hopper = check_attention_path(SGL, [], inventory("9.0"), FI)
    assert hopper is not None and hopper.status == "PASS"


def test_sglang_known_bad_follows_its_backend_flag() -> None:
    assert SGL is not None
    known_bad, inv = load_signatures().known_bad, inventory("10.3")
    on = check_known_bad(known_bad, FI, inv, SGL.trtllm_attention([]))
    off = check_known_bad(
        known_bad, FI, inv, SGL.trtllm_attention(["--attention-backend", "flashinfer"])
    )
    assert any(r.status == "FAIL" for r in on)
    assert not any(r.status == "FAIL" for r in off)


def test_versions_check_names_the_engine_package() -> None:
    r = check_versions({"sglang": None, "vllm": None}, None, "/usr/bin/python3",
                       package="sglang", title="SGLang")  # fmt: skip
    assert r.status == "WARN" and "SGLang is not installed" in r.reason
    ok = check_versions(FI, None, "/usr/bin/python3", package="sglang", title="SGLang")
    assert ok.status == "PASS"
