"""Where a log stops: operations started and never finished, `replay --stuck`, and the live
classifier's use of the same evidence during a stall. Logs are real excerpts from
tests/data/corpus/ (cut short where the test needs a log that ends earlier)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.obsbuilder import Timeline, final, frozen_bar, gpu
from tests.shipped import PATTERNS
from tests.simfixtures import sim_env
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.core.model import LogEvent
from watchdog.core.state.openops import keep_with_ops, open_operations, stuck_cause
from watchdog.sources.logs.parse import parse_line

CORPUS = Path(__file__).parent / "data" / "corpus"
OPS = load_ops()


def text(name: str) -> list[str]:
    return (CORPUS / name).read_text(encoding="utf-8").splitlines()


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=sim_env(),
    )


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


# A log that ends inside a cubin fetch: FlashInfer PR #4985's `Fetching ... from URL` then
# `Acquired lock`, nothing after (flashinfer/jit/cubin_loader.py logs success on completion).
FETCH = "s_a_fi4985_cubin_fetch_lock.log"
# A log that ends inside a collective setup: vllm #8447 rank 0 `Init START`, no `Init COMPLETE`.
NCCL = "n12_vllm8447_two_nodes_init_start_no_complete.log"
# FlashInfer's old JIT format (ktrun #13): `Loading JIT ops: X` ... `Finished loading JIT ops: X`.
JIT = "s_j_ktrun13_flashinfer_jit_old_format.log"


def events(lines: list[str], sigs: SignatureSet) -> tuple[LogEvent, ...]:
    """What the live log source hands the classifier: signature lines plus operation lines."""
    keep = keep_with_ops(sigs.log_keep_pattern(), OPS)
    return tuple(e for e in (parse_line(x, "test", keep, PATTERNS) for x in lines) if e is not None)


def jit_cut(tmp_path: Path) -> Path:
    """The same real log cut before its `Finished loading JIT ops`: a compile with no result."""
    lines = text(JIT)
    cut = next(i for i, line in enumerate(lines) if "Finished loading JIT ops" in line)
    path = tmp_path / "jit_cut.log"
    path.write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    return path


def test_cubin_fetch_left_open_points_to_the_download_stall() -> None:
    (op,) = open_operations(text(FETCH), OPS)
    assert op.op.id == "cubin_fetch" and op.signature == "cubin_download_stall"
    assert "edge.urm.nvidia.com" in op.line or "Fetching" in op.line
    assert not op.progress_after
    assert stuck_cause([op]) is op


def test_nccl_init_left_open_names_its_process_and_rank() -> None:
    (op,) = open_operations(text(NCCL), OPS)
    assert op.op.id == "nccl_init" and op.signature == "collective_hang"
    assert op.who == "VM-160-69-tencentos:561:561 [0]"
    assert "Init START" in op.line


def test_jit_compile_that_finished_leaves_nothing_open(tmp_path: Path) -> None:
    assert [o.op.id for o in open_operations(text(JIT), OPS)] == []
    (op,) = open_operations(jit_cut(tmp_path).read_text().splitlines(), OPS)
    assert op.op.id == "jit_compile" and op.signature == "jit_compile_stuck"
    assert op.since is not None and op.open_s is not None and op.open_s >= 0


def test_an_init_that_completed_is_not_open() -> None:
    assert open_operations(text("n10_nccl1936_init_complete_healthy.log"), OPS) == []


def test_progress_after_an_open_operation_means_it_is_not_what_blocks() -> None:
    # The cubin fetch, then the server serving (vllm #43295's healthy stats lines).
    lines = text(FETCH) + text("s_f_vllm43295_apiserver_engine000.log")
    (op,) = [o for o in open_operations(lines, OPS) if o.op.id == "cubin_fetch"]
    assert op.progress_after
    assert stuck_cause([op]) is None


def test_open_for_uses_the_logs_own_clock() -> None:
    # vllm #16303 startup: torch.compile's cache-directory line at 02:06:09, its
    # `torch.compile takes 16.61 s in total` at 02:06:25: closed. Cut after the start only.
    lines = text("n06_vllm16303_startup_then_0pct.log")
    start = next(i for i, x in enumerate(lines) if "Using cache directory" in x)
    # torch.compile runs inside vLLM's KV-cache profile run (gpu_worker.py profile_run), which
    # opened at `Model loading took`: both are open there.
    profile, op = open_operations(lines[: start + 2], OPS)
    assert profile.op.id == "kv_cache_profile" and "Model loading took" in profile.line
    assert op.op.id == "torch_compile" and op.since == "04-09 02:06:09"
    assert op.open_s == 0.0  # the next line carries the same second
    assert open_operations(lines, OPS) == []


def test_replay_reports_the_open_operation_without_naming_a_hang() -> None:
    done = replay(CORPUS / NCCL)
    assert done.returncode == 0, done.stderr
    who = "VM-160-69-tencentos:561:561"
    assert f"open operation: NCCL communicator init started by {who}" in done.stdout
    assert "points to collective_hang: the cause if the server is stuck now" in done.stdout


@pytest.mark.parametrize(
    ("name", "signature"),
    [(FETCH, "cubin_download_stall"), (NCCL, "collective_hang")],
)
def test_replay_stuck_turns_the_open_operation_into_the_verdict(name: str, signature: str) -> None:
    done = replay(CORPUS / name, "--stuck", "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["stuck_verdict"] == signature and out["matches"] == []
    text_out = replay(CORPUS / name, "--stuck").stdout
    assert f"{signature} (--stuck: the log ends inside it)" in text_out


def test_replay_stuck_on_a_compile_with_no_result(tmp_path: Path) -> None:
    done = replay(jit_cut(tmp_path), "--stuck")
    assert done.returncode == 1, done.stderr
    assert "jit_compile_stuck (--stuck: the log ends inside it)" in done.stdout


@pytest.mark.parametrize("name", [JIT, "n10_nccl1936_init_complete_healthy.log"])
def test_replay_stuck_after_the_operation_finished_names_nothing(name: str) -> None:
    done = replay(CORPUS / name, "--stuck")
    assert done.returncode == 0, done.stderr
    assert "open operation:" not in done.stdout
    assert "--stuck: nothing to name" in done.stdout


def test_live_stall_inside_an_unfinished_nccl_init_names_collective_hang(
    sigs: SignatureSet,
) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 40, first_logs=events(text(NCCL), sigs))
    v = final(tl.obs, sigs)
    assert v.state == "hung" and v.signature == "collective_hang"
    assert any(e.kind == "open_operation" and "Init START" in e.detail for e in v.evidence)


def test_live_stall_after_the_init_completed_stays_stalled(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    done = text("n10_nccl1936_init_complete_healthy.log")
    frozen_bar(tl, 40, first_logs=events(done, sigs))
    v = final(tl.obs, sigs)
    assert v.state == "stalled" and v.signature is None


def test_live_open_operation_without_a_stall_is_no_verdict(sigs: SignatureSet) -> None:
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    tl.tick(logs=events(text(NCCL), sigs))
    tl.ticks(40)
    v = final(tl.obs, sigs)
    assert not v.is_hang  # nothing pending: an idle server with an old init line


def test_stuck_with_a_bundle_is_a_usage_error() -> None:
    bundle = Path(__file__).parent / "data" / "replay" / "trtllm_bundle"
    done = replay(bundle, "--stuck")
    assert done.returncode == 2
    assert "--stuck applies to a plain server log" in done.stderr


# tensorrt_llm/_torch/autotuner.py logs `[Autotuner] Autotuning process starts ...` and
# `[Autotuner] Autotuning process ends`; its per-rank logger prefixes `[RANK n]` and mpirun
# `n: ` (TensorRT-LLM PR #13998 log). No thread holds a rank stuck in autotuning, so these
# lines are built from those two formats.
def _tune(rank: int, t: str, what: str) -> str:
    return (
        f"{rank}: [05/12/2026-05:01:{t}] [TRT-LLM] [I] [_torch  ] [RANK {rank}] [Autotuner] {what}"
    )


def test_one_rank_still_autotuning_after_its_peers_is_behind() -> None:
    lines = [
        _tune(0, "16", "Autotuning process starts ..."),
        _tune(1, "16", "Autotuning process starts ..."),
        _tune(0, "40", "Autotuning process ends"),
    ]
    (op,) = open_operations(lines, OPS)
    assert op.who == "RANK 1" and op.peers_done == ("RANK 0",)
    assert op.signature == "rank_divergence"
    assert op.open_s == 24.0
    assert "RANK 0 finished it: this one is behind" in op.describe()


def test_autotuning_in_progress_on_every_rank_points_nowhere() -> None:
    lines = [_tune(r, "16", "Autotuning process starts ...") for r in (0, 1)]
    ops = open_operations(lines, OPS)
    assert {o.who for o in ops} == {"RANK 0", "RANK 1"}
    assert all(o.signature is None for o in ops)
    assert stuck_cause(ops) is None


def test_api_200s_after_an_open_fetch_are_no_progress() -> None:
    # spark-vllm-docker #379: the API answers `POST /v1/messages ... 200 OK` while the engine
    # is stuck; such lines after the fetch must not clear it.
    api = [x for x in text("s_d_svd379_shm_broadcast_with_api_traffic.log") if "200 OK" in x]
    assert api
    (op,) = open_operations(text(FETCH) + api, OPS)
    assert not op.progress_after and stuck_cause([op]) is op
