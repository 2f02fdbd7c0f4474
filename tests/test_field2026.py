"""Causes seen in 2026 incidents and the log readings they need, each from a case written here
in the upstream format the signature cites (its comment names the source), with a near miss."""

from __future__ import annotations

import pytest

from tests.obsbuilder import Timeline, events, final, frozen_bar, procs
from tests.shipped import PATTERNS
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures


@pytest.fixture(scope="module")
def sigs() -> SignatureSet:
    return load_signatures()


def named(text: str, sigs: SignatureSet) -> list[str]:
    _, evs = read_log(text.encode(), sigs, PATTERNS)
    return [m.signature.id for m in name_signatures(evs, sigs)]


def pyspy(title: str, frames: list[tuple[str, str]], pid: int = 4242) -> str:
    """One py-spy 0.4 `dump` (benfred/py-spy src/dump.rs print_traces) of one thread."""
    body = "".join(f"    {name} ({where})\n" for name, where in frames)
    return (
        f"Process {pid}: {title}\nPython v3.12.3 (/usr/bin/python3.12)\n\n"
        f'Thread {pid} (active): "MainThread"\n{body}\n'
    )


# --- DeepEP / NVSHMEM ----------------------------------------------------------------------


def test_deepep_timeout_that_kills_a_scheduler_names_deepep(sigs: SignatureSet) -> None:
    text = (
        "[2026-05-02 10:00:00 DP3 TP3 EP3] Scheduler hit an exception: Traceback (most recent "
        "call last):\n"
        '  File "/sgl-workspace/DeepEP/deep_ep/buffer.py", line 490, in internode_dispatch\n'
        "RuntimeError: DeepEP error: timeout (dispatch CPU)\n"
        "[2026-05-02 10:00:01] SIGQUIT received. signum=None, frame=None. It usually means one "
        "child failed.\n"
    )
    assert named(text, sigs)[0] == "deepep_nvshmem_timeout"
    healthy = "[2026-05-02 10:00:00 TP0 EP0] DeepEP buffer initialized, num_nvl_bytes=1073741824\n"
    assert named(healthy, sigs) == []


# --- Xid 119 -------------------------------------------------------------------------------


def test_xid_119_gsp_timeout_names_the_gpu_firmware(sigs: SignatureSet) -> None:
    text = (
        "[Tue Apr 21 21:27:51 2026] NVRM: _issueRpcAndWait: rpcRecvPoll timedout for fn 76 "
        "sequence 4127!\n"
        "[Tue Apr 21 21:29:21 2026] NVRM: Xid (PCI:0000:0b:00): 119, pid=11431, name=python3, "
        "Timeout after 45s of waiting for RPC response from GPU3 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) sequence 4128 (0x20803039 0xb0).\n"
    )
    assert named(text, sigs) == ["gsp_rpc_timeout_xid119"]
    # Another Xid (an MMU fault) is a crash of some kernel, not a firmware timeout.
    assert named("NVRM: Xid (PCI:0000:10:00): 31, pid=1, name=python3, MMU Fault\n", sigs) == []


# --- SGLang HiCache ------------------------------------------------------------------------


WATCHDOG = (
    "[2026-06-01 13:36:14 TP5] Scheduler watchdog timeout "
    "(self.watchdog_timeout=300, self.soft=False)\n"
)


def test_hicache_pool_full_of_evictable_entries_names_the_eviction_deadlock(
    sigs: SignatureSet,
) -> None:
    snap = "[full] total=929712, available=512, evictable=921600, protected=0, session_held=0\n"
    assert named(snap + WATCHDOG, sigs)[0] == "sglang_hicache_eviction_deadlock"
    # A pool with room left: the watchdog fired for another reason.
    roomy = "[full] total=929712, available=400000, evictable=500000, protected=0\n"
    assert named(roomy + WATCHDOG, sigs)[0] == "sglang_scheduler_watchdog_timeout"


def test_hicache_prefetch_all_reduce_names_the_tp_divergence(sigs: SignatureSet) -> None:
    dump = pyspy(
        "sglang::scheduler_TP0",
        [
            ("all_reduce", "torch/distributed/distributed_c10d.py:3075"),
            ("_all_reduce_attn_groups", "sglang/srt/mem_cache/hiradix_cache.py:196"),
            ("can_terminate_prefetch", "sglang/srt/mem_cache/hiradix_cache.py:1350"),
            ("check_prefetch_progress", "sglang/srt/mem_cache/hiradix_cache.py:1373"),
            ("_get_new_batch_prefill_raw", "sglang/srt/managers/scheduler.py:2679"),
        ],
    )
    assert named(dump, sigs)[0] == "sglang_hicache_prefetch_divergence"
    peer = pyspy(
        "sglang::scheduler_TP1",
        [
            ("broadcast", "torch/distributed/distributed_c10d.py:2974"),
            ("broadcast_pyobj", "sglang/srt/utils/common.py:1437"),
            ("recv_requests", "sglang/srt/managers/scheduler.py:1201"),
        ],
    )
    assert "sglang_hicache_prefetch_divergence" not in named(peer, sigs)


# --- CUDA lazy loading ---------------------------------------------------------------------


def test_stack_in_cuModuleLoadData_names_the_lazy_module_load(sigs: SignatureSet) -> None:
    dump = pyspy(
        "sglang::scheduler_TP2",
        [
            ("cuModuleLoadData", "libcuda.so.1"),
            ("cudart::contextState::loadCubin", "libcudart.so.12"),
            ("verify", "sglang/srt/speculative/eagle_worker.py:701"),
        ],
    )
    assert named(dump, sigs) == ["cuda_lazy_module_load_stall"]
    launch = pyspy("sglang::scheduler_TP2", [("cuLaunchKernel", "libcuda.so.1")])
    assert "cuda_lazy_module_load_stall" not in named(launch, sigs)


# --- the API server's event loop -----------------------------------------------------------


def test_two_dumps_of_the_loop_in_preprocessing_name_the_blocked_event_loop(
    sigs: SignatureSet,
) -> None:
    frames = [
        ("result", "concurrent/futures/_base.py:451"),
        ("load_mm_data", "sglang/srt/multimodal/processors/base_processor.py:390"),
        ("process_mm_data_async", "sglang/srt/multimodal/processors/qwen_vl.py:220"),
    ]
    one = pyspy("sglang::http_server", frames, pid=77)
    assert "api_event_loop_blocked" not in named(one, sigs)  # one dump is no stall
    assert named(one + one, sigs)[0] == "api_event_loop_blocked"


# --- KV connector --------------------------------------------------------------------------


def test_workers_waiting_on_a_kv_connector_load_with_requests_stuck(sigs: SignatureSet) -> None:
    stats = "".join(
        f"INFO 03-02 10:0{i}:00 [loggers.py:111] Engine 000: Avg prompt throughput: 0.0 tokens/s,"
        " Avg generation throughput: 0.0 tokens/s, Running: 4 reqs, Waiting: 2 reqs\n"
        for i in range(3)
    )
    dump = pyspy(
        "VLLM::Worker_TP0",
        [
            ("wait_for_layer_load", "lmcache/integration/vllm/lmcache_connector_v1.py:610"),
            ("wait_for_layer_load", "vllm/distributed/kv_transfer/kv_connector/v1/base.py:240"),
            ("forward", "vllm/attention/layer.py:300"),
        ],
        pid=90,
    )
    assert named(stats + dump + dump, sigs)[0] == "kv_connector_load_stall"
    # The same dumps while the engine generates: the load is merely slow.
    moving = stats.replace("Avg generation throughput: 0.0", "Avg generation throughput: 88.0")
    assert "kv_connector_load_stall" not in named(moving + dump + dump, sigs)


# --- under a GPU-sharing layer (live: a stall at startup) ----------------------------------


def test_startup_stall_under_hami_core_names_the_sharing_layer(sigs: SignatureSet) -> None:
    hami = events(["[HAMI-core Msg(958:140235494377280:libvgpu.c:836)]: Initializing....."], sigs)
    tl = Timeline(procs=procs())
    frozen_bar(tl, 240, first_logs=hami)
    assert final(tl.obs, sigs).signature == "gpu_sharing_layer_startup_stall"
    tl2 = Timeline(procs=procs())
    frozen_bar(tl2, 240)
    assert final(tl2.obs, sigs).signature != "gpu_sharing_layer_startup_stall"


# --- readings -------------------------------------------------------------------------------


def test_a_worker_killed_by_its_own_nccl_watchdog_is_a_collective_hang(sigs: SignatureSet) -> None:
    text = (
        "(VllmWorker TP1 pid=4321) [rank1]:[E302 10:11:12.000000000 ProcessGroupNCCL.cpp:632] "
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, "
        "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600031 "
        "milliseconds before timing out.\n"
        "(VllmWorker TP1 pid=4321) [rank1]:[F302 10:11:12.000000000 ProcessGroupNCCL.cpp:1614] "
        "[PG ID 2 PG GUID 3 Rank 1] Terminating the process after attempting to dump debug info, "
        "due to collective timeout or exception.\n"
        "(EngineCore_DP0 pid=4300) ERROR 03-02 10:11:14 [multiproc_executor.py:150] Worker proc "
        "VllmWorker-1 died unexpectedly, shutting down executor.\n"
    )
    got = named(text, sigs)
    assert got[0] == "collective_hang" and "engine_worker_failed" in got
    # A worker that died first, then the peers' watchdog: the death is the cause.
    died_first = text.split("\n")[2] + "\n" + text.split("\n")[0] + "\n"
    assert named(died_first, sigs)[0] == "engine_worker_failed"


def test_gloo_timeout_before_workerproc_failed_to_start_is_the_network(sigs: SignatureSet) -> None:
    text = (
        "(Worker pid=411) [E302 10:21:12.000000000 ProcessGroupGloo.cpp:144] "
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "600000ms for recv operation to complete\n"
        "(EngineCore_DP0 pid=311) ERROR 03-02 10:21:13 [core.py:700] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=311) ERROR 03-02 10:21:13 [core.py:700] Exception: WorkerProc "
        "failed to start.\n"
    )
    assert named(text, sigs)[0] == "collective_network_error"


def test_v0_no_memory_for_cache_blocks_is_a_crash(sigs: SignatureSet, tmp_path) -> None:
    from watchdog.commands.replayclass import log_classes

    text = (
        b"INFO 08-29 20:49:14 llm_engine.py:196] # GPU blocks: 0, # CPU blocks: 512\n"
        b"ValueError: No available memory for the cache blocks. Try increasing "
        b"`gpu_memory_utilization` when initializing the engine.\n"
    )
    _, evs = read_log(text, sigs, PATTERNS)
    cv = log_classes(evs, text, sigs)
    assert cv is not None and cv.primary.cls.id == "crashed"


def test_another_engines_cubin_download_line_names_the_cdn_stall(sigs: SignatureSet) -> None:
    line = events(
        [
            "2026-03-02T10:00:00.000Z INFO vllm_rs::kernels: Downloading cubin: "
            "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-"
            "local/4f3c/fmha/trtllm-gen/fmhaSm100Kernel.cubin"
        ],
        sigs,
    )
    assert line, "the line must reach the classifier"
    tl = Timeline(procs=procs())
    frozen_bar(tl, 240, first_logs=line)
    assert final(tl.obs, sigs).signature == "cubin_download_stall"
    done = line[0].line.replace("Downloading cubin:", "Downloaded cubin:")
    tl2 = Timeline(procs=procs())
    frozen_bar(tl2, 240, first_logs=events([done], sigs))
    assert final(tl2.obs, sigs).signature != "cubin_download_stall"
