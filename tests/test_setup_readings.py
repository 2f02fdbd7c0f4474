# ruff: noqa: E501  (log lines are quoted whole, as the engines print them)
"""A communicator that never came up, read once (core/judge/setupcause.py setup_cause, NCCL's
error trail in core/judge/nccltrail.py) and named from that reading (core/judge/derived.py), in
`replay` and live alike; with the near misses that must stay quiet or keep their own reading."""

from __future__ import annotations

from tests.logreadings import live_verdict, replay_read
from watchdog.core.judge.cudacause import cuda_cause
from watchdog.core.judge.nccltrail import nccl_trail
from watchdog.core.judge.setupcause import setup_cause

# NCCL 2.7 on WSL2: the topology walk cannot resolve a PCI path, and the error returns through
# graph/ and init.cc (NCCLCHECK, src/include/checks.h) to the communicator's init.
TOPOLOGY = """\
host:92777:92777 [0] NCCL INFO Bootstrap : Using [0]eth0:172.27.213.95<0>
host:92777:92777 [0] NCCL INFO NET/Socket : Using [0]eth0:172.27.213.95<0>
host:92777:92889 [0] graph/xml.cc:332 NCCL WARN Could not find real path of /sys/class/pci_bus/0000:01/../../0000:01:00.0
host:92777:92889 [0] NCCL INFO graph/xml.cc:469 -> 2
host:92777:92889 [0] NCCL INFO graph/topo.cc:523 -> 2
host:92777:92889 [0] NCCL INFO init.cc:581 -> 2
host:92777:92889 [0] NCCL INFO init.cc:840 -> 2
host:92777:92889 [0] NCCL INFO group.cc:73 -> 2 [Async thread]
"""

# src/proxy.cc proxyServiceInitOp: the proxy fails a Connect for a peer during set-up.
PROXY_CONNECT = """\
node:16901:16954 [2] NCCL INFO Connected all trees
node:16901:16967 [2] misc/socket.cc:441 NCCL WARN socketFinalizeAccept: wrong type 4 != 3
node:16901:16967 [2] NCCL INFO misc/socket.cc:561 -> 3
node:16901:16967 [2] NCCL INFO transport/net_socket.cc:375 -> 3
node:16901:16967 [2] proxy.cc:1519 NCCL WARN [Proxy Service 2] Failed to execute operation Connect from rank 2, retcode 3
"""

# vLLM V1 (pynccl_wrapper.py NCCL_CHECK) in a worker that had not finished starting; the source
# line traceback prints above the exception is not the error.
WORKER_START = """\
(VllmWorker rank=0 pid=4662) ERROR 08-05 14:13:44 [multiproc_executor.py:487]   File "/usr/lib/python3/dist-packages/vllm/distributed/device_communicators/pynccl_wrapper.py", line 257, in NCCL_CHECK
(VllmWorker rank=0 pid=4662) ERROR 08-05 14:13:44 [multiproc_executor.py:487]     raise RuntimeError(f"NCCL error: {error_str}")
(VllmWorker rank=0 pid=4662) ERROR 08-05 14:13:44 [multiproc_executor.py:487] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)
(VllmWorker rank=3 pid=4665) ERROR 08-05 14:13:44 [multiproc_executor.py:487] WorkerProc failed to start.
(VllmWorker rank=3 pid=4665) ERROR 08-05 14:13:44 [multiproc_executor.py:487] Traceback (most recent call last):
"""


def test_nccls_trail_into_init_is_setup_failed_with_the_warns_words() -> None:
    r = replay_read(TOPOLOGY)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.kind == "collective_setup" and r.cause.stage == "init"
    assert r.cause.summary.startswith("NCCL system error while initialising the communicator")
    assert "Could not find real path" in r.cause.summary
    assert "init.cc:581 -> 2" in r.cause.line  # the trail's first init.cc line speaks for it
    v = live_verdict(TOPOLOGY)
    assert v.signature == "collective_setup_failed" and "Could not find real path" in v.reason


def test_the_proxy_failing_a_connect_is_setup_failed() -> None:
    r = replay_read(PROXY_CONNECT)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "init"
    assert "socketFinalizeAccept: wrong type 4 != 3" in r.cause.summary
    assert "could not Connect for rank 2" in r.cause.summary


def test_a_set_up_failure_before_the_workers_death_is_named_first_live_and_in_replay() -> None:
    r = replay_read(WORKER_START)
    assert r.names[:2] == ("collective_setup_failed", "engine_worker_failed")
    assert r.cause is not None and r.cause.stage == "init"
    assert "unhandled system error" in r.cause.summary and "{" not in r.cause.summary
    v = live_verdict(WORKER_START)
    assert v.signature == "collective_setup_failed"
    assert any("engine_worker_failed" in e.detail for e in v.evidence)  # the consequence


def test_a_warn_alone_and_a_trail_below_init_are_no_setup_failure() -> None:
    # NCCL's libibverbs fallback warns, then the socket transport carries the init to the end.
    fallback = """\
host:1:1 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
host:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
host:1:1 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE
"""
    assert replay_read(fallback).names == () and replay_read(fallback).cls is None
    # A trail that stops in transport code (an IB completion error once connected) is the
    # network's reading, not set-up.
    lines = [
        "h:1:2 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.3<1234> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.2 remoteGidsfe80::1 hca mlx5_1",
        "h:1:2 [0] NCCL INFO transport/net.cc:1302 -> 6",
        "h:1:2 [0] NCCL INFO proxy.cc:694 -> 6",
    ]
    assert all(nccl_trail(lines, i) is None for i in range(len(lines)))
    assert replay_read("\n".join(lines) + "\n").names[:1] == ("collective_network_error",)


def test_a_trail_that_returns_in_progress_is_no_failure() -> None:
    # ncclInProgress (7): a non-blocking init still running, not an error.
    lines = ["h:1:2 [0] NCCL WARN waiting", "h:1:2 [0] NCCL INFO init.cc:1400 -> 7"]
    assert nccl_trail(lines, 1) is None


def test_a_fork_that_prints_the_trail_at_warn_with_paths_is_read_the_same() -> None:
    # Alibaba's ACCL prints NCCLCHECK's trail at WARN, with the source path; the trail's own
    # lines are not the WARN that says what failed.
    text = """\
(Actor pid=16101) [host][16101:17880][0][transport.cc:120] NCCL WARN Could not connect to peer 3: Connection refused
(Actor pid=16101) [host][16101:17880][0][init.cc:1815] NCCL WARN init.cc:1815 -> 5
(Actor pid=16101) [host][16101:17880][0][group.cc:74] NCCL INFO /ACCL-P/src/group.cc:74 -> 5 [Async thread]
"""
    r = replay_read(text)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and "invalid usage" in r.cause.summary
    assert "Could not connect to peer 3" in r.cause.summary


def test_nvshmems_status_and_message_on_separate_lines_are_setup() -> None:
    text = """\
/opt/nvshmem/src/modules/transport/ibgda/ibgda.cpp:3005: non-zero status: 7 ibgda_rc_init2rtr failed on RC #0.
/opt/nvshmem/src/host/transport/transport.cpp:400: non-zero status: 7
connect EPS failed
/opt/nvshmem/src/host/init/init.cu:1001: non-zero status: 7
nvshmem setup connections failed
"""
    r = replay_read(text)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "init"
    assert "connect EPS failed" in r.cause.summary


def test_a_rank_that_cannot_fetch_the_unique_id_from_the_store_is_setup_at_bootstrap() -> None:
    # torch ProcessGroupNCCL.cpp broadcastUniqueNCCLID: rank 0 never published the id.
    text = (
        "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
        "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got "
        "error: Socket Timeout\n"
    )
    r = replay_read(text)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "bootstrap"


# torch's NCCL error with no frame of its own (a fabric that was not up: CUDA 802), and NCCL's
# own INFO lines of the same start-up around it. Those lines are kept for the set-up reader
# (core/knowledge/context.py): without them the error reads as a collective's.
FABRIC = """\
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3
ncclUnhandledCudaError: Call to CUDA function failed.
Cuda failure 802 'system not yet initialized'
host:162637:162637 [6] NCCL INFO Bootstrap : Using eth0:172.17.0.14<0>
host:162635:162635 [4] NCCL INFO cudaDriverVersion 12020
"""


def test_an_nccl_error_among_nccls_own_start_up_lines_is_setup_live_and_in_replay() -> None:
    r = replay_read(FABRIC)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.kind == "collective_setup"
    # NCCL's CUDA failure under it names the cause: CUDA 802, the NVSwitch fabric not up.
    assert "CUDA 802 'system not yet initialized'" in r.cause.summary
    assert "nvidia-fabricmanager" in r.cause.fix
    torch = cuda_cause("RuntimeError: CUDA error: system not yet initialized")
    assert torch is not None and "cudaErrorSystemNotReady" in torch.summary
    assert "nvidia-fabricmanager" in torch.fix
    v = live_verdict(FABRIC)
    assert v.signature == "collective_setup_failed"
    # The same error after the communicator came up is a collective's, not set-up.
    done = (
        "host:1:1 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        + FABRIC.splitlines()[0]
        + "\n"
    )
    r = replay_read(done)
    assert r.names == () and r.cls == "crashed"
    assert r.cause is not None and r.cause.kind == "collective"


def test_an_nccl_error_in_a_ray_actors_constructor_is_setup_at_init() -> None:
    # A vLLM engine as a Ray actor (python/ray/exceptions.py ActorDiedError): its constructor
    # raised the NCCL error, so the communicator never came up.
    text = """\
(AsyncVLLMInferenceEngine pid=31037) RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details) [repeated 4x across cluster]
(AsyncVLLMInferenceEngine pid=31036) Exception raised in creation task: The actor died because of an error raised in its creation task, ray::AsyncVLLMInferenceEngine.__init__() (pid=31036, ip=10.0.0.2)
"""
    r = replay_read(text)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "init"


def test_nccls_cuda_check_failing_while_a_transport_is_set_up_is_setup() -> None:
    # CUDACHECK (src/include/checks.h) WARNs `Cuda failure '...'` and returns
    # ncclUnhandledCudaError; the proxy's Init and Setup answers say a transport was being set up.
    text = """\
node:4168:5290 [1] NCCL INFO Received and initiated operation=Init res=0
node:4168:5290 [1] NCCL INFO Received and initiated operation=Setup res=0
node:4167:5269 [0] transport/p2p.cc:275 NCCL WARN Cuda failure 'invalid argument'
"""
    r = replay_read(text)
    assert r.names == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "init"
    assert "Cuda failure 'invalid argument'" in r.cause.summary
    # Once the communicator came up and the server served, the same error is a collective's.
    late = (
        "node:1:1 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init START\n"
        "node:1:1 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "INFO 03-02 10:00:00 [loggers.py:111] Engine 000: Avg prompt throughput: 12.0 tokens/s, "
        "Avg generation throughput: 30.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n"
        + text.splitlines()[-1]
        + "\n"
    )
    r = replay_read(late)
    assert "collective_setup_failed" not in r.names and r.cls == "crashed"
    assert r.cause is not None and r.cause.kind == "collective"
    # The reader's own lines: an init that completed further back than the lines it reads with
    # the error makes it a collective's; just before it, the error is at the first collective.
    done = "node:1:1 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE"
    error = text.splitlines()[-1]
    start = done.replace("COMPLETE", "START")
    far = [start, done] + ["node:1:1 [0] NCCL INFO Connected all rings"] * 30 + [error]
    got = setup_cause(far, len(far) - 1)
    assert got is not None and got.kind == "collective"
    near = [start, done, error]
    got = setup_cause(near, 2)
    assert got is not None and got.kind == "collective_setup" and got.stage == "first collective"


def test_a_store_wait_that_timed_out_is_setup_only_at_start_up() -> None:
    # torch c10d socket.cpp SocketImpl::waitForInput: the store never answered a rank.
    wait = (
        "[rank1]:[W623 15:37:01.824135523 socket.cpp:485] [c10d] waitForInput: socket "
        "SocketImpl(fd=100, addr=[node-0]:43590, remote=[node-0]:20000) timed out after 1800000ms\n"
    )
    startup = (
        "[2025-06-23 15:37:01 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2546, in run_scheduler_process\n'
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank)\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 312, in __init__\n'
        "    self.tp_worker = TpWorkerClass(\n"
    )
    r = replay_read(wait + startup)
    assert r.names[:1] == ("collective_setup_failed",)
    assert r.cause is not None and r.cause.stage == "bootstrap"
    # A KV pipe waiting on the same store while serving (vLLM's PyNccl pipe): not set-up.
    serving = (
        "(VllmWorkerProcess pid=50536) ERROR 04-11 00:33:04 [pynccl_pipe.py:265] wait timeout "
        "after 300000ms, keys: /send_to/1/40\n"
    )
    r = replay_read(wait + serving)
    assert "collective_setup_failed" not in r.names
    assert r.cause is None or r.cause.kind != "collective_setup"
