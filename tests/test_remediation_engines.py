"""Fallbacks spelled per engine: SGLang's server arguments, not vLLM's, reach an SGLang server."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import Verdict
from watchdog.engines.loader import load_engines
from watchdog.remediation.plan import PlanError, make_plan
from watchdog.remediation.restarters import env_file_text


def verdict(sig: str, fallback: str) -> Verdict:
    return Verdict(state="hung", signature=sig, fallback=fallback)


def test_sglang_attention_fallback_is_its_attention_backend_flag() -> None:
    sigs, engines = load_signatures(), load_engines()
    plan = make_plan(
        verdict("cubin_download_stall", "disable_trtllm_attention"),
        sigs,
        {"vllm": "0.19.0"},
        {},
        engine=engines.get("sglang"),
    )
    assert plan is not None and plan.args == ("--attention-backend", "flashinfer")
    assert not plan.env and "SGLang spelling" in plan.how
    text = env_file_text(plan.args, plan.env, plan.active)
    assert "--attention-backend flashinfer" in text  # the EnvironmentFile systemd/k8s read


def test_sglang_nvls_fallback_and_vllm_unchanged() -> None:
    sigs, engines = load_signatures(), load_engines()
    plan = make_plan(
        verdict("nvls_multicast_failure", "disable_nvls"),
        sigs,
        {},
        {},
        engine=engines.get("sglang"),
    )
    assert plan is not None
    assert plan.args == ("--enforce-disable-flashinfer-allreduce-fusion",)
    assert dict(plan.env) == {"NCCL_NVLS_ENABLE": "0"}
    vllm = make_plan(
        verdict("cubin_download_stall", "disable_trtllm_attention"),
        sigs,
        {"vllm": "0.19.0"},
        {},
        engine=engines.get("vllm"),
    )
    assert vllm is not None and vllm.args == ("--attention-config.use_trtllm_attention=0",)


def test_engine_without_a_spelling_is_a_clear_plan_error(tmp_path: Path) -> None:
    # An operator profile for a made-up engine that spells no fallback.
    profile = tmp_path / "engines.toml"
    profile.write_text(
        'schema = 1\n[[engine]]\nname = "madeup"\ntitle = "Made-Up Serve"\n'
        "[engine.detect]\ncmdline = ['madeup-serve']\n"
    )
    sigs, engines = load_signatures(), load_engines([profile])
    with pytest.raises(PlanError, match=r"no spelling for Made-Up Serve.*engine\.fallback"):
        make_plan(
            verdict("cubin_download_stall", "disable_trtllm_attention"),
            sigs,
            {},
            {},
            engine=engines.get("madeup"),
        )


def test_trtllm_attention_fallback_is_its_fmha_library_list() -> None:
    """TensorRT-LLM: TLLM_FMHA_LIBS drops FlashInfer's TRTLLM-gen FMHA (fmha/registry.py)."""
    plan = make_plan(
        verdict("cubin_download_stall", "disable_trtllm_attention"),
        load_signatures(),
        {},
        {},
        engine=load_engines().get("trtllm"),
    )
    assert plan is not None and plan.args == ()
    assert dict(plan.env) == {"TLLM_FMHA_LIBS": "-flashinfer_trtllm_gen"}
    assert "TLLM_FMHA_LIBS=-flashinfer_trtllm_gen" in env_file_text(plan.args, plan.env, ())
