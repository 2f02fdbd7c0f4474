"""Leases: a known long operation that shows progress of its own is compiling or crawling,
never a hang; the same operation silent for its bound is the hang (wedged)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.obsbuilder import Timeline, events, frozen_bar, gpu, procs, verdicts
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import Connection

START = (
    "(EngineCore pid=282) 2026-05-30 07:15:45,192 - INFO - autotuner.py:615 - "
    "flashinfer.jit: [Autotuner]: Autotuning process starts ..."
)
FETCH = (
    "2026-05-30 07:15:45,192 - INFO - cubin_loader.py:88 - flashinfer.jit: Fetching cubin "
    "fmha.cubin from https://edge.urm.nvidia.com/artifactory/fmha.cubin"
)


def bar(n: int, total: int = 100) -> str:
    """FlashInfer's autotune bar (vllm-project/vllm#58031's format)."""
    pct = n * 100 // total
    return (
        f"[AutoTuner]: Tuning flashinfer::trtllm_fp4_block_scale_moe: {pct:3d}%|#####     | "
        f"{n}/{total} [01:46<00:11, 11.41s/profile]"
    )


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def _autotune(sigs: SignatureSet, progress_s: int, silent_s: int) -> list:
    """An autotune at boot printing a bar every 10 s for `progress_s`, then nothing."""
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs())
    tl.tick(logs=events([START], sigs))
    for i in range(progress_s // 5):
        tl.tick(logs=events([bar(i // 2 + 1)], sigs) if i % 2 == 0 else ())
    tl.ticks(silent_s // 5)
    return verdicts(tl.obs, sigs)


def test_autotune_printing_progress_for_ten_minutes_is_never_a_hang(sigs: SignatureSet) -> None:
    pairs = _autotune(sigs, progress_s=660, silent_s=0)
    states = {v.state for _, v in pairs}
    assert not any(v.is_hang or v.state == "stalled" or v.suspicious for _, v in pairs), states
    assert states <= {"starting", "compiling", "crawling", "serving"}, states
    last = pairs[-1][1]
    # The window (600 s) no longer holds the start line: the lease reads its open time from
    # the oldest progress line it holds, so past the bound it may still read as compiling.
    assert last.state in ("compiling", "crawling")
    assert "kernel autotuning" in last.reason and "its bound: 600 s" in last.reason


def test_autotune_with_no_progress_for_its_bound_is_the_hang_naming_it(
    sigs: SignatureSet,
) -> None:
    pairs = _autotune(sigs, progress_s=60, silent_s=400)
    onset = pairs[13][0].t  # the last bar
    held = [v for o, v in pairs if o.t - onset < 290]
    assert not any(v.state == "stalled" or v.is_hang for v in held), {v.state for v in held}
    last = pairs[-1][1]
    assert last.state in ("stalled", "hung")
    assert "wedged: kernel autotuning showed no progress of its own" in last.reason
    assert any(e.kind == "wedged" for e in last.evidence)


def _download(sigs: SignatureSet, trickle_s: int, silent_s: int, per_tick: int = 60_000) -> list:
    """Serving, a request pending, FlashInfer fetching a cubin: its socket receives `per_tick`
    bytes a 5 s tick (12 KB/s by default) for `trickle_s`, then nothing."""
    tl = Timeline(step=5.0, gpus=(gpu(0.0, 0.0),), procs=procs())
    frozen_bar(tl, 1, first_logs=events([FETCH], sigs))
    sock = Connection(283, "edge.urm.nvidia.com", "203.0.113.7", 443, "ESTABLISHED", 0.0, 0)
    received = 0
    for i in range((trickle_s + silent_s) // 5):
        if i * 5 < trickle_s:
            received += per_tick
        tl.tick(conns=(replace(sock, age_s=5.0 * i, bytes_received=received),))
    return verdicts(tl.obs, sigs)


def test_download_receiving_bytes_slowly_is_crawling_with_its_rate(sigs: SignatureSet) -> None:
    pairs = _download(sigs, trickle_s=200, silent_s=0)
    assert not any(v.is_hang or v.state == "stalled" for _, v in pairs)
    last = pairs[-1][1]
    assert last.state == "crawling"
    assert "FlashInfer cubin/artifact fetch" in last.reason
    assert "receiving 12000 B/s" in last.reason and "ETA" in last.reason


def test_a_socket_trickling_a_byte_a_second_is_a_wedge_not_a_crawl(sigs: SignatureSet) -> None:
    """Below the operation's min_bytes_per_s (10 KB/s: a 1 MB cubin would outlast its bound)
    bytes are no progress: a CDN that trickles (a read that never times out) is the stall."""
    pairs = _download(sigs, trickle_s=300, silent_s=0, per_tick=5)
    assert not any(v.state == "crawling" for _, v in pairs)
    start = pairs[0][0].t
    hang = next(((o, v) for o, v in pairs if v.is_hang), None)
    assert hang is not None, [(v.state, v.reason) for _, v in pairs][-3:]
    assert hang[1].signature == "cubin_download_stall" and hang[0].t - start <= 60


def test_download_socket_with_no_byte_for_its_bound_is_cubin_download_stall(
    sigs: SignatureSet,
) -> None:
    pairs = _download(sigs, trickle_s=30, silent_s=120)
    last_byte = pairs[6][0].t
    early = [v for o, v in pairs if o.t - last_byte < 55]
    assert not any(v.is_hang for v in early), [(v.state, v.reason) for v in early]
    hang = next(v for _, v in pairs if v.is_hang)
    assert hang.signature == "cubin_download_stall"


CAPTURE = (
    "Capturing batches (bs=43 avail_mem=20.18 GB): {pct}%|#####     | {n}/67 "
    "[00:00<00:00, 131.27it/s]"
)
READY = "[2026-05-30 07:15:45] The server is fired up and ready to roll!"


VLLM_CAPTURE = "Capturing CUDA graphs: {pct}%|#####     | {n}/67 [00:00<00:00, 217.58it/s]"


@pytest.mark.parametrize("ends_with", ["bar_at_total", "ready_milestone", "vllm_bar_at_total"])
def test_a_finished_startup_step_holds_off_no_later_stall(
    sigs: SignatureSet, ends_with: str
) -> None:
    """SGLang's graph-capture bar opens its lease by progress alone (its start line can be out
    of the window); the bar at 67/67, or the ready milestone, ends it. A cubin stall of the
    first batch after it must be named as without the capture, not held for its quiet bound."""
    tl = Timeline(gpus=(gpu(0.0, 0.0),), procs=procs())
    lines = [CAPTURE.format(pct=50, n=33)]
    lines += [CAPTURE.format(pct=100, n=67)] if ends_with == "bar_at_total" else [READY]
    if ends_with == "vllm_bar_at_total":  # its bar matches the operation's start line too
        lines = [VLLM_CAPTURE.format(pct=50, n=33), VLLM_CAPTURE.format(pct=100, n=67)]
    # In the same tick as the first batch's bar: no progress after it to move past the capture.
    onset = frozen_bar(tl, 40, cdn=True, first_logs=events(lines, sigs))
    pairs = verdicts(tl.obs, sigs)
    assert not any("CUDA-graph capture" in v.reason for _, v in pairs[1:])
    stalled = next((o.t for o, v in pairs if v.state in ("stalled", "hung")), None)
    assert stalled is not None and stalled - onset <= 20, [(v.state, v.reason) for _, v in pairs][
        -2:
    ]
