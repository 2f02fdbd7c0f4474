"""Naming signatures from a log alone: the 32 real samples, crash logs named, healthy ones not."""

from __future__ import annotations

import pytest

from tests.logsamples import NAMED
from tests.obsbuilder import LOGS, events, sample_lines
from watchdog.core.judge.logverdict import log_stall, name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures

HEALTHY = [
    "f_vllm43295_apiserver_engine000.log",
    "f_tt3359_docker_timestamp_prefix.log",
    "f_vllm18916_noprefix_v1_docker_pipe.log",
    "f_club3090_93_specdecode_and_access_log.log",
    "g_vllm16050_processed_prompts_slowing.log",
    "g_vllm7117_benchmark_throughput_h100.log",
    "h_club3090_142_aot_compile_cache_with_shm_warning.log",
    "h_vllm19794_torch_compile_and_cudagraph_capture.log",
    "h_vllm27521_piecewise_cudagraph_capture_tqdm.log",
    "h_vllm44985_safetensors_weight_loading.log",
    "a_fi4985_cubin_fetch_lock.log",
]
SAMPLES = sorted(
    p.name for p in LOGS.glob("*.log") if p.name[0] in "abcdefghi"
)  # the shared reference set (j_* were added for the log parser)


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def _named(name: str, sigs: SignatureSet) -> list[str]:
    return [
        m.signature.id for m in name_signatures(events(sample_lines(f"logs/{name}"), sigs), sigs)
    ]


def test_all_32_reference_samples_are_here() -> None:
    assert len(SAMPLES) == 32
    assert set(NAMED) | set(HEALTHY) <= set(SAMPLES)


@pytest.mark.parametrize(("name", "sig"), sorted(NAMED.items()))
def test_log_identifiable_samples_are_named(sigs: SignatureSet, name: str, sig: str) -> None:
    found = name_signatures(events(sample_lines(f"logs/{name}"), sigs), sigs)
    assert found, f"{name} named nothing"
    best = found[0]
    assert best.signature.id == sig
    assert best.lines and all(isinstance(line, str) and line for line in best.lines)
    assert best.confidence >= best.signature.min_confidence or best.decisive


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_samples_name_nothing(sigs: SignatureSet, name: str) -> None:
    assert _named(name, sigs) == []


def test_every_sample_is_classified_without_error(sigs: SignatureSet) -> None:
    for name in SAMPLES:
        for match in name_signatures(events(sample_lines(f"logs/{name}"), sigs), sigs):
            assert match.signature.id in sigs.ids
            assert 0.0 < match.confidence <= 1.0


def test_log_shows_a_stall_when_the_last_stats_line_is_pending_at_zero(sigs: SignatureSet) -> None:
    stalled = events(sample_lines("logs/d_vllm48752_throughput_zero_then_shm_broadcast.log"), sigs)
    assert log_stall(stalled) is not None and "3 request(s)" in (log_stall(stalled) or "")
    healthy = events(sample_lines("logs/f_vllm43295_apiserver_engine000.log"), sigs)
    assert log_stall(healthy) is None
    assert log_stall(events(sample_lines("classify/idle_stats.log"), sigs)) is None


def test_shm_broadcast_alone_needs_the_stall_to_name_collective_hang(sigs: SignatureSet) -> None:
    evs = events(sample_lines("logs/d_vllm48752_throughput_zero_then_shm_broadcast.log"), sigs)
    shm_only = [e for e in evs if e.kind != "stats"]
    assert _ids(name_signatures(shm_only, sigs)) == []
    match = name_signatures(evs, sigs)[0]
    assert match.signature.id == "collective_hang" and match.stall and not match.decisive


def test_signatures_that_need_gpu_evidence_are_never_named_from_a_log(sigs: SignatureSet) -> None:
    for name in SAMPLES:
        ids = _named(name, sigs)
        assert "trtllm_attention_deadlock" not in ids and "gpu_kernel_spin" not in ids


def test_matched_lines_are_capped(sigs: SignatureSet) -> None:
    evs = events(sample_lines("logs/b_kserve4657_nvcc_not_found.log"), sigs)
    (match,) = name_signatures(evs, sigs, max_lines=1)
    assert len(match.lines) == 1 and "nvcc" in match.lines[0]


def _ids(matches: list) -> list[str]:
    return [m.signature.id for m in matches]


def test_failing_cubin_fetches_name_cubin_download_stall(sigs: SignatureSet) -> None:
    # The headline signature from its log lines (built from FlashInfer 0.6.7's formats:
    # tests/data/classify/README.md); a healthy fetch (a_fi4985) names nothing, above.
    found = name_signatures(events(sample_lines("classify/cubin_download_v067.log"), sigs), sigs)
    assert found and found[0].signature.id == "cubin_download_stall"
    assert any("attempt" in line for line in found[0].lines)
