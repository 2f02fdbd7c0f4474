# ruff: noqa: E501  (log lines are quoted whole, as the libraries print them)
"""Transport and JIT-lock readings, each from cases written in the upstream library's own format
(the signature or core/judge/transport.py cites the source line), with near misses that must
stay quiet: RDMA / UCX / NIXL / NVSHMEM transport errors, DeepEP's timeouts, JIT build locks in
a stack dump, and torch.distributed's object collectives."""

from __future__ import annotations

import pytest

from tests.logreadings import SIGS, live_verdict, replay_read
from tests.obsbuilder import Timeline, final, frozen_bar, gpu
from watchdog.core.judge.ranks import attribute
from watchdog.core.judge.rootcause import Cause
from watchdog.core.judge.transport import transport_reading
from watchdog.core.model import Frame, ProcInfo, StackSample, ThreadStack


def replay(text: str) -> tuple[tuple[str, ...], str | None, Cause | None]:
    """(signatures named, generic class, root cause) as `replay` reads the log."""
    r = replay_read(text)
    return r.names, r.cls, r.cause


def live(text: str) -> str:
    """The live verdict's state and reason after the lines (a log-only watch)."""
    v = live_verdict(text)
    return f"{v.state}|{v.reason}"


def pyspy(frames: list[tuple[str, str]], title: str = "python3", pid: int = 4242) -> str:
    """One py-spy 0.4 `dump` (benfred/py-spy src/dump.rs print_traces) of one thread."""
    body = "".join(f"    {name} ({where})\n" for name, where in frames)
    return (
        f"Process {pid}: {title}\nPython v3.12.3 (/usr/bin/python3.12)\n\n"
        f'Thread {pid} (idle): "MainThread"\n{body}\n'
    )


# 1. Transports ------------------------------------------------------------------------------

# NVIDIA/nccl src/transport/net_ib.cc (2.19+): the completion error, then net.cc's unwind.
NCCL_IB = """\
node-2:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/0/GDRDMA
node-2:1234:5690 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.2.3<53412> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.1.2.2 remoteGids::ffff:10.1.2.3 hca mlx5_1
node-2:1234:5690 [3] NCCL INFO transport/net.cc:1298 -> 6
"""


def test_an_nccl_ib_completion_error_names_the_peer_device_and_status() -> None:
    names, _, cause = replay(NCCL_IB)
    assert names[0] == "collective_network_error"
    assert cause is not None and cause.kind == "transport"
    assert "peer 10.1.2.3<53412>" in cause.summary and "mlx5_1" in cause.summary
    assert "transport retry counter exceeded" in cause.summary and "vendor err 129" in cause.summary


# NCCL src/misc/ibvwrap.cc while net_ib.cc connects a queue pair during communicator init, then
# torch c10d's NCCLUtils error.
NCCL_QP_CONNECT = """\
node-1:100:200 [0] NCCL INFO comm 0x55 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init START
node-1:100:200 [0] misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error Invalid argument
node-1:100:200 [0] NCCL INFO transport/net_ib.cc:1034 -> 2
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
"""


def test_an_nccl_queue_pair_that_cannot_connect_at_init_names_the_call_under_setup() -> None:
    names, _, cause = replay(NCCL_QP_CONNECT)
    assert names[0] == "collective_setup_failed"
    assert cause is not None and cause.kind == "transport"
    assert cause.summary.endswith("ibv_modify_qp failed: Invalid argument")
    assert "NCCL_IB_GID_INDEX" in cause.fix


# NVIDIA/nvshmem src/modules/transport/ibrc/ibrc.cpp progress_send, through NVSHMEMI_NZ_ERROR_JMP.
NVSHMEM_RUNTIME = """\
[2026-03-01 10:00:00 DP0 TP0 EP0] Decode batch. #running-req: 8, #token: 9000, token usage: 0.10, gen throughput (token/s): 1000.00, #queue-req: 0
/opt/nvshmem/src/modules/transport/ibrc/ibrc.cpp:1072: non-zero status: 12 ibv_poll_cq failed, status: 12
/opt/nvshmem/src/modules/transport/ibrc/ibrc.cpp:1188: non-zero status: 7 progress_send failed, outstanding_count: 0
"""


def test_an_nvshmem_ib_error_once_connected_is_a_network_error_replay_and_live() -> None:
    names, _, cause = replay(NVSHMEM_RUNTIME)
    assert names[0] == "collective_network_error"
    assert cause is not None and cause.summary == (
        "NVSHMEM's IB transport: transport retry counter exceeded"
    )
    verdict = live(NVSHMEM_RUNTIME)
    assert verdict.startswith("hung|The network under a collective failed")
    assert "root cause: NVSHMEM's IB transport: transport retry counter exceeded" in verdict


# NVSHMEM's init path (src/host/init/init.cu nvshmemi_common_init -> src/host/transport/
# transport.cpp nvshmemi_setup_connections -> the transport's connect_endpoints).
IBGDA_DCT = """\
/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.0/nvshmem/src/modules/transport/ibgda/ibgda.cpp:2234: NULL value Unable to create ah.
/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.0/nvshmem/src/modules/transport/ibgda/ibgda.cpp:2966: non-zero status: 7 create DCT share err.
/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.0/nvshmem/src/host/transport/transport.cpp:420: non-zero status: 7 connect EPS failed
/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.0/nvshmem/src/host/init/init.cu:1047: non-zero status: 7 nvshmem setup connections failed
"""
IBRC_RTR = """\
[2026-03-01 10:00:00 TP0] Init torch distributed begin.
[2026-03-01 10:00:01 TP0] NVSHMEM bootstrap done, 16 PEs
/opt/nvshmem/src/modules/transport/ibrc/ibrc.cpp:401: non-zero status: 110 ibv_modify_qp failed
/opt/nvshmem/src/modules/transport/ibrc/ibrc.cpp:1429: non-zero status: 7 ep_connect failed
/opt/nvshmem/src/host/transport/transport.cpp:434: non-zero status: 7 connect EPS failed
"""


@pytest.mark.parametrize("text", [IBGDA_DCT, IBRC_RTR], ids=["ibgda_dct", "ibrc_rtr"])
def test_an_nvshmem_transport_that_cannot_connect_is_setup_failed_at_init(text: str) -> None:
    # nvshmemi_setup_connections runs only on NVSHMEM's init path: the root cause names the
    # set-up stage, and the signature is named from that one reading (core/judge/derived.py).
    names, _, cause = replay(text)
    assert names == ("collective_setup_failed",)
    assert cause is not None and cause.kind == "collective_setup" and cause.stage == "init"
    assert "NVSHMEM could not connect" in cause.summary
    seen = live(text)
    assert "communicator never came up" in seen and "(stage: init)" in seen


# A vLLM decode worker whose NIXL read raises out of get_finished (the worker dies, the engine
# core follows); UCX src/ucp/core/ucp_ep.c logs the endpoint's error first.
KV_DEATH = """\
(VllmWorker rank=0 pid=3111) [1733300000.123456] [dec-0:3111:a]        ucp_ep.c:1508 UCX  ERROR ep 0x7f1eac0b5108: error 'Endpoint timeout' on rc_mlx5/mlx5_0:1 will not be handled since no error callback is installed
(VllmWorker rank=0 pid=3111) ERROR 03-01 10:00:01 [multiproc_executor.py:671] WorkerProc hit an exception.
(VllmWorker rank=0 pid=3111) ERROR 03-01 10:00:01 [multiproc_executor.py:671] Traceback (most recent call last):
(VllmWorker rank=0 pid=3111) ERROR 03-01 10:00:01 [multiproc_executor.py:671]   File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py", line 1650, in get_finished
(VllmWorker rank=0 pid=3111) ERROR 03-01 10:00:01 [multiproc_executor.py:671] nixl._bindings.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT
(EngineCore_DP0 pid=3000) ERROR 03-01 10:00:01 [core.py:844] EngineCore encountered a fatal error.
"""


def test_a_kv_transfer_error_that_kills_the_engine_names_the_transport() -> None:
    names, _, cause = replay(KV_DEATH)
    assert names and "collective_network_error" not in names  # a KV transfer, no collective
    assert cause is not None and cause.kind == "transport"
    assert cause.summary == "UCX: Endpoint timeout on rc_mlx5/mlx5_0:1"
    assert "kv_load_failure_policy" in cause.fix
    assert live(KV_DEATH).endswith("root cause: UCX: Endpoint timeout on rc_mlx5/mlx5_0:1")


# SGLang's Mooncake transfer engine: rdma-core providers/mlx5/cq.c dumps the error CQE, the
# engine's worker_pool.cpp reports libibverbs' status text, and the transfer thread dies.
MOONCAKE = """\
mlx5: prefill-3: got completion with error:
00000000 00000000 00000000 00000000
00000000 00000000 00000000 00000000
00000010 00000000 00000000 00000000
00000000 00008116 1000013a 000019d2
E0301 10:00:02.000000 4242 worker_pool.cpp:244] Worker: Process failed for slice (opcode: 1, source_addr: 0x7f00, length: 65536, dest_addr: 0x7e00, local_nic: mlx5_1, peer_nic: 10.0.0.5:15001@mlx5_1, dest_rpc: 10.0.0.5:15001, retry_cnt: 0): transport retry counter exceeded
Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/mooncake/conn.py", line 400, in transfer_worker
RuntimeError: KV transfer failed
"""


def test_an_rdma_completion_error_under_a_kv_crash_is_the_crash_with_rdma_as_cause() -> None:
    names, cls, cause = replay(MOONCAKE)
    assert names == () and cls == "crashed"
    assert cause is not None and cause.kind == "transport"
    assert cause.summary == (
        "RDMA (libibverbs): a work completion failed: transport retry counter exceeded "
        "(rdma-core's mlx5 provider dumped the CQE)"
    )
    assert cause.line == "got completion with error:"  # the first line of the failure
    # The dump alone still names RDMA.
    alone = MOONCAKE.split("E0301")[0] + "RuntimeError: KV transfer failed\n"
    got = replay("Traceback (most recent call last):\n" + alone)[2]
    assert got is not None and got.summary.startswith("RDMA (rdma-core's mlx5 provider")


# NIXL's UCX backend (ai-dynamo/nixl src/plugins/ucx/ucx_utils.cpp sendAmCallback) under an
# SGLang decode instance that then gives up on the transfer (srt/disaggregation/decode.py).
KV_TIMEOUT = """\
[2026-03-01 10:00:00 TP0] Decode batch. #running-req: 8, #token: 9000, token usage: 0.10, gen throughput (token/s): 1000.00, #queue-req: 0
E0301 10:00:02.000000 4242 ucx_utils.cpp:212] UCX AM send failed with status -80 (Endpoint timeout)
[2026-03-01 10:05:00 TP0] Decode request abc failed: fail to receive KV Cache transfer done signal
"""


def test_a_kv_transfer_error_before_a_timeout_is_the_timeout_with_the_transport_as_cause() -> None:
    names, cls, cause = replay(KV_TIMEOUT)
    assert names == () and cls == "timed_out"
    assert cause is not None and cause.summary == "NIXL's UCX backend: Endpoint timeout"


# vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py _log_failure: one transfer
# failed; kv_load_failure_policy recomputes or fails that request and the engine serves on.
NIXL_SURVIVED = """\
(APIServer pid=1) INFO 03-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 200.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%
(EngineCore_DP0 pid=3000) ERROR 03-01 10:00:05 [nixl_connector.py:1800] NIXL transfer failure: handshake with engine 0414ddf8 failed
(EngineCore_DP0 pid=3000) ERROR 03-01 10:00:05 [nixl_connector.py:1800] Traceback (most recent call last):
(EngineCore_DP0 pid=3000) ERROR 03-01 10:00:05 [nixl_connector.py:1800]   File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py", line 1600, in _read_blocks
(EngineCore_DP0 pid=3000) ERROR 03-01 10:00:05 [nixl_connector.py:1800] nixl._bindings.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT
(APIServer pid=1) INFO 03-01 10:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 200.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%
"""
# UCX's WARN level (src/ucs/debug/log.c) for a connection it retries; the transfers go on.
UCX_WARN = """\
(VllmWorker rank=0 pid=3111) [1733300000.123456] [dec-0:3111:a]    ucp_worker.c:1888 UCX  WARN  failed to connect to rc_mlx5/mlx5_0:1, retrying on another lane
(APIServer pid=1) INFO 03-01 10:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 200.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%
"""
# NCCL src/transport/net_ib.cc finds no IB device and falls back to sockets (net_socket.cc).
NCCL_FALLBACK = """\
node-1:100:100 [0] NCCL INFO NET/IB : No device found.
node-1:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
node-1:100:100 [0] NCCL INFO Using network Socket
node-1:100:100 [0] NCCL INFO comm 0x5581 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x1f - Init COMPLETE
"""


@pytest.mark.parametrize(
    "text",
    [NIXL_SURVIVED, UCX_WARN, NCCL_FALLBACK],
    ids=["nixl_recomputed", "ucx_warn", "nccl_socket_fallback"],
)
def test_transport_trouble_the_server_goes_on_through_stays_quiet(text: str) -> None:
    assert replay(text) == ((), None, None)
    assert live(text).split("|")[0] not in ("hung", "dead", "stalled")


@pytest.mark.parametrize(
    ("line", "summary"),
    [
        # NCCL before 2.19: `with error %d, opcode %d, len %d, vendor err %d`.
        (
            "NCCL WARN NET/IB : Got completion from peer 10.0.0.7<4567> with error 5, opcode 0, len 0, vendor err 249 (Recv)",
            "NCCL's IB transport: a work completion from peer 10.0.0.7<4567> failed: Work Request Flushed Error, vendor err 249",
        ),
        # UCX ib_mlx5_log.c, the current and the older format.
        (
            "[a670n1:162239:0:162239] ib_mlx5_log.c:177  Local protection on mlx5_0:1/IB (synd 0x4 vend 0x51 hw_synd 0/2)",
            "UCX (mlx5): Local protection on mlx5_0:1/IB",
        ),
        (
            "[1701292112.8] [n1:16:0] ib_mlx5_log.c:139 UCX  ERROR Error on QP 0x169 wqe[3]: Transport retry count exceeded (synd 0x15 vend 0x81) opcode SEND",
            "UCX (mlx5): Transport retry count exceeded",
        ),
        ("nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND", "NIXL: NIXL_ERR_BACKEND"),
        # NCCL src/misc/ibvwrap.cc, from ncclIbRtrQp while connecting to a peer.
        (
            "node-1:100:200 [0] misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error Invalid argument",
            "NCCL's IB transport could not connect a queue pair: ibv_modify_qp failed: Invalid argument",
        ),
        # ai-dynamo/nixl src/plugins/ucx/ucx_utils.cpp sendAmCallback, through absl's LOG(ERROR).
        (
            "E0301 10:00:02.000000 4242 ucx_utils.cpp:212] UCX AM send failed with status -80 (Endpoint timeout)",
            "NIXL's UCX backend: Endpoint timeout",
        ),
        (
            "/opt/nvshmem/src/modules/transport/ibdevx/ibdevx.cpp:968: Got ibdevx completion with error. hws: 0 ves: 81, syn: 15",
            "NVSHMEM's IB transport: Got ibdevx completion with error",
        ),
    ],
)
def test_each_transport_line_names_its_transport_and_error(line: str, summary: str) -> None:
    got = transport_reading(line)
    assert got is not None and got.summary == summary


@pytest.mark.parametrize(
    "line",
    [
        "UCX  WARN  unable to read from rc_mlx5/mlx5_0:1, retrying",
        "node-1:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
        "Remote access token refreshed for user alice",
        "INFO the KV transfer completed in 3.2 ms",
    ],
)
def test_lines_that_are_no_transport_failure_read_as_none(line: str) -> None:
    assert transport_reading(line) is None


# 2. DeepEP's own timeouts -------------------------------------------------------------------

LOADED = "[2026-03-01 10:00:00 DP0 TP0 EP0] Load weight end. type=DeepseekV3ForCausalLM\n"


@pytest.mark.parametrize(
    "line",
    [
        # deepseek-ai/DeepEP csrc/kernels/legacy/internode.cu, the kernels that wait on NVSHMEM.
        "DeepEP dispatch RDMA sender timeout, channel: 3, RDMA: 1, nvl: 2, dst RDMA lane: 0, head: 10, tail: 12",
        "DeepEP combine forwarder (RDMA check) timeout, channel: 1, RDMA: 0, nvl: 3, dst RDMA: 1, head: 4, tail: 9",
        "DeepEP RDMA sender coordinator timeout, channel: 2, IB: 1, nvl 0, dst IB: 0, tail: 3, remaining: 7",
    ],
)
def test_deepep_internode_timeouts_name_the_nvshmem_timeout(line: str) -> None:
    assert replay(LOADED + line + "\n")[0][0] == "deepep_nvshmem_timeout"


def test_deepep_intranode_timeout_is_a_timeout_not_the_nvshmem_signature() -> None:
    # csrc/kernels/legacy/utils.cuh barrier_block: NVLink only, then trap().
    text = LOADED + (
        "DeepEP timeout check failed: rank = 3, thread = 0, value = 1024)\n"
        "DeepEP timeout check failed: rank = 3, thread = 1, value = 1024)\n"
    )
    names, cls, _ = replay(text)
    assert names == () and cls == "timed_out"


def test_deepep_low_latency_warning_that_masks_the_rank_stays_quiet() -> None:
    # internode_ll.cu: with a mask buffer the rank is masked and the kernel goes on.
    text = LOADED + (
        "Warning: DeepEP timeout for dispatch receive, rank 2, local_expert_idx 5, src_rank 9\n"
        "[2026-03-01 10:00:03 DP0 TP0 EP0] Decode batch. #running-req: 8, #token: 9000, token usage: 0.10, gen throughput (token/s): 1000.00, #queue-req: 0\n"
    )
    assert replay(text) == ((), None, None)


# 3. JIT build locks in a stack dump ---------------------------------------------------------

SITE = "/usr/lib/python3.12/site-packages"
# torch/utils/cpp_extension.py _jit_compile: the loser of FileBaton.try_acquire waits.
BATON = [
    ("wait", f"{SITE}/torch/utils/file_baton.py:42"),
    ("_jit_compile", f"{SITE}/torch/utils/cpp_extension.py:2100"),
    ("load", f"{SITE}/torch/utils/cpp_extension.py:1380"),
    ("_load_op", "/app/myops/__init__.py:20"),
]
# apache/tvm-ffi python/tvm_ffi/cpp/extension.py build_inline under tvm_ffi/utils/lockfile.py.
TVM_FFI = [
    ("blocking_acquire", f"{SITE}/tvm_ffi/utils/lockfile.py:90"),
    ("__enter__", f"{SITE}/tvm_ffi/utils/lockfile.py:45"),
    ("build_inline", f"{SITE}/tvm_ffi/cpp/extension.py:500"),
    ("load_inline", f"{SITE}/tvm_ffi/cpp/extension.py:600"),
]


@pytest.mark.parametrize("frames", [BATON, TVM_FFI], ids=["torch_file_baton", "tvm_ffi_lockfile"])
def test_a_rank_waiting_on_a_jit_build_lock_names_jit_compile_stuck(
    frames: list[tuple[str, str]],
) -> None:
    assert replay(pyspy(frames))[0] == ("jit_compile_stuck",)


def _live_stall_with(frames: list[tuple[str, str]]) -> tuple[str, str | None]:
    """A stalled server (a frozen bar) whose py-spy dumps show `frames`, unchanged."""
    stack = tuple(Frame(n, w.rsplit(":", 1)[0], int(w.rsplit(":", 1)[1])) for n, w in frames)
    sample = StackSample(4242, "t", (ThreadStack(1, "MainThread", stack, unchanged=True),))
    tl = Timeline(gpus=(gpu(0.0, 0.0),))
    frozen_bar(tl, 40, stacks=(sample,))
    v = final(tl.obs, SIGS)
    return v.state, v.signature


def test_live_a_stall_with_a_rank_on_a_jit_build_lock_names_jit_compile_stuck() -> None:
    assert _live_stall_with(BATON) == ("hung", "jit_compile_stuck")
    assert _live_stall_with(TVM_FFI) == ("hung", "jit_compile_stuck")
    assert _live_stall_with([BATON[0], ("stage_files", "/app/sweep/stage.py:30")])[1] != (
        "jit_compile_stuck"
    )


def test_a_file_baton_outside_a_jit_load_is_not_a_jit_build() -> None:
    frames = [BATON[0], ("stage_files", "/app/sweep/stage.py:30")]
    assert replay(pyspy(frames))[0] == ()


def test_a_file_baton_wait_the_build_then_finishes_stays_quiet() -> None:
    # torch prints `Loading extension module NAME...` once the build is there; then the server
    # loads and serves: the wait in the dump was a build in progress.
    text = pyspy(BATON) + (
        "Loading extension module myops...\n"
        "INFO 03-01 10:00:04 [gpu_model_runner.py:1800] Model loading took 14.9 GiB and 20.5 seconds\n"
        "INFO 03-01 10:01:00 [api_server.py:1000] Starting vLLM API server on http://0.0.0.0:8000\n"
        "INFO 03-01 10:01:01 [launcher.py:28] Available routes are:\n"
        "(APIServer pid=1) INFO 03-01 10:01:10 [loggers.py:123] Engine 000: Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 200.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%\n"
    )
    assert replay(text) == ((), None, None)


# 4. torch.distributed object collectives held unchanged --------------------------------------

C10D = f"{SITE}/torch/distributed"
STALL = "".join(
    f"(APIServer pid=1) INFO 03-01 10:0{i}:10 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 4 reqs, Waiting: 2 reqs, GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%\n"
    for i in range(3)
)


def _object_collective(name: str) -> list[tuple[str, str]]:
    return [
        (name, f"{C10D}/distributed_c10d.py:3000"),
        ("wrapper", f"{C10D}/c10d_logger.py:81"),
        ("sync_state", "/app/engine/sync.py:50"),
    ]


@pytest.mark.parametrize("name", ["all_gather_object", "broadcast_object_list"])
def test_an_object_collective_unchanged_in_two_dumps_of_a_stall_is_a_collective_hang(
    name: str,
) -> None:
    frames = _object_collective(name)
    assert replay(STALL + pyspy(frames) + pyspy(frames))[0] == ("collective_hang",)
    # One dump is one moment: not yet a hang in a collective.
    assert "collective_hang" not in replay(STALL + pyspy(frames))[0]


def test_a_rank_in_an_object_collective_waits_and_the_busy_rank_is_the_cause() -> None:
    obj = tuple(Frame(n, w.rsplit(":", 1)[0], 1) for n, w in _object_collective("gather_object"))
    busy = (Frame("forward", "/x/vllm/model_executor/models/llama.py", 300),)
    procs_ = [
        ProcInfo(100 + r, 10, "python", f"VLLM::Worker_TP{r}", role="worker", rank=r)
        for r in range(3)
    ]
    stacks = [
        StackSample(100 + r, "t", (ThreadStack(1, "MainThread", f, active=True, unchanged=True),))
        for r, f in enumerate((obj, busy, obj))
    ]
    attr = attribute(procs_, stacks, kb=SIGS.ranks)
    assert attr.cause_rank == 1 and attr.waiting_ranks == (0, 2)
    assert next(v for v in attr.views if v.rank == 0).activity == "collective"
