"""What a /health answer means depends on the engine: a vLLM 503 is a dead engine, an SGLang
503 is its one-token generation check getting no answer (a stall's evidence), and SGLang's
warm-up 503 is neither."""

from __future__ import annotations

import pytest

from tests.obsbuilder import Timeline, final, gpu, procs
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import ServerSample


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def sglang(tokens: float, status: int, meaning: str | None, running: float = 0) -> ServerSample:
    # SGLang's scheduler gauges freeze at their last values in a hang (often 0 after warm-up).
    return ServerSample(
        up=True,
        health_status=status,
        health_meaning=meaning,
        prompt_tokens=tokens,
        generation_tokens=tokens,
        running=running,
        waiting=0,
    )


def test_sglang_503_after_serving_is_a_stall_not_engine_death(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    for i in range(10):
        tl.tick(server=sglang(100.0 * i, 200, "ok", running=2))
    tl.ticks(40, server=sglang(900.0, 503, "not_generating"))
    v = final(tl.obs, sigs)
    assert v.state == "stalled" and v.signature != "engine_dead"
    assert "one-token generation" in v.reason


def test_sglang_warmup_503_is_not_a_stall(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.ticks(40, server=sglang(0.0, 503, "not_generating"))
    v = final(tl.obs, sigs)
    assert v.state not in ("stalled", "hung", "dead")


def test_sglang_idle_after_draining_is_idle(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    for i in range(10):
        tl.tick(server=sglang(100.0 * i, 200, "ok", running=4))
    tl.ticks(60, server=sglang(900.0, 200, "ok"))
    assert final(tl.obs, sigs).state == "idle"


def test_vllm_503_stays_engine_dead(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.ticks(5, server=ServerSample(up=True, health_status=200, iterations=5.0))
    tl.ticks(5, server=ServerSample(up=True, health_status=503, health_meaning="dead"))
    v = final(tl.obs, sigs)
    assert v.state == "dead" and v.signature == "engine_dead"


def test_verdict_speaks_the_engines_fix_and_names_missing_evidence(sigs: SignatureSet) -> None:
    import dataclasses

    from tests.obsbuilder import DOWNLOAD_STACK, stack

    def run(engine: str) -> str:
        tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=dataclasses.replace(procs(), engine=engine))
        tl.ticks(3, server=sglang(0.0, 200, "ok", running=2))
        tl.ticks(30, server=sglang(0.0, 200, "ok", running=2), stacks=(stack(*DOWNLOAD_STACK),))
        v = final(tl.obs, sigs)
        assert v.signature == "cubin_download_stall"
        return v.fix + " ".join(v.commands)

    assert "--attention-backend flashinfer" in run("sglang")
    assert "use_trtllm_attention=0" in run("vllm")
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=dataclasses.replace(procs(), engine="unknown"))
    tl.ticks(3, server=sglang(0.0, 200, "ok", running=2))
    tl.ticks(30, server=sglang(0.0, 200, "ok", running=2))
    v = final(tl.obs, sigs)
    assert v.state == "stalled" and "engine not recognised" in v.reason
