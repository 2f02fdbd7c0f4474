"""A communicator that never came up (an NCCL error before init completed, NCCL's own error
trail, an NVSHMEM endpoint or bootstrap failure, a rendezvous or store that timed out), with
the set-up stage it failed in (pure: lines in, a Cause out)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from watchdog.core.judge.cause import Cause
from watchdog.core.judge.cudacause import NCCL_CUDA, NVSWITCH_FIX, fabric_down
from watchdog.core.judge.nccltrail import nccl_trail

# torch c10d NCCLUtils: "NCCL error in: <file>:<line>, internal error - please report this issue
# to the NCCL developers, NCCL version X" / "unhandled system error (run with NCCL_DEBUG=INFO for
# details)"; NCCL's own "ncclInternalError"/"ncclSystemError" names and `NCCL WARN` lines.
# vLLM vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK: "NCCL error: <string>".
# NCCL's CUDACHECK (src/include/checks.h): `WARN("Cuda failure '%s'", cudaGetErrorString(err))`
# and always returns ncclUnhandledCudaError: the WARN is the error, not a warning NCCL moves past.
_NCCL_ERR = re.compile(
    r"NCCL error in: \S+, (?P<what>[^,]+?)(?:,| \(|$)|NCCL error: (?P<what2>[^,(]+)"
    r"|(?P<name>nccl(?:Internal|System|Unhandled\w*|InvalidUsage|Remote)Error)"
    r"|NCCL WARN (?P<what3>Cuda failure '[^']+')"
)
# Where in the set-up: NCCL's init.cc / ncclCommInitRank, torch's getNcclComm / comm creation,
# init_process_group; NCCL's bootstrap.cc and NVSHMEM's bootstrap plugins; c10d's TCPStore and
# torch elastic's rendezvous (torch/distributed/elastic/rendezvous).
_STAGE_BOOT = re.compile(
    r"[Bb]ootstrap|rendezvous|Rendezvous|TCPStore|DistStoreError|clients joined"
    r"|retrieving ncclUniqueId|waitForInput"
)
_STAGE_INIT = re.compile(
    r"ncclCommInit|CommInitRank|init\.cc|NCCLUtils\.[ch]pp|getNcclComm|init_process_group|initialize_model_parallel"
    r"|init_distributed_environment|comm(?:unicator)? init|Init START|nvshmemi?_init|nvshmem_init"
    r"|/init/init\.cu"
    # A process that had not finished starting: vLLM's worker and engine start-up (v1
    # multiproc_executor.py `WorkerProc failed to start.`, core.py `EngineCore failed to start.`,
    # utils.py `Engine core initialization failed`, a constructor's or init_device's frame).
    r"|failed to start|initialization failed|, in __init__\s*$|, in init_device\s*$"
    r"|, in from_engine_args\s*$"
    # NCCL's proxy answering a connection's set-up messages (src/proxy.cc proxyProgressAsync:
    # `Received and initiated operation=Init|Setup|Connect res=0`): a transport being set up.
    r"|operation=(?:Init|Setup|Connect) res="
    # Ray (python/ray/exceptions.py ActorDiedError): an actor whose constructor raised, `The
    # actor died because of an error raised in its creation task, ray::NAME.__init__()`.
    r"|error raised in its creation task"
)
_INIT_DONE = re.compile(r"Init COMPLETE|init COMPLETE")
_INIT_MARK = re.compile(r"Init START|Init COMPLETE|init COMPLETE")
_NEAR = 20  # lines before an error read for the set-up it belongs to
# NVSHMEM host/bootstrap: `bootstrap ... timed out` / `nvshmemi_bootstrap... failed`; torch's
# rendezvous: `DistStoreError: Timed out after N seconds waiting for clients. 1/2 clients joined.`
# (torch/csrc/distributed/c10d/TCPStore.cpp) and elastic `RendezvousTimeoutError`.
_SETUP = re.compile(
    r"nvshmem\S*:\d+: non-zero status: \d+:? .*(?:[Bb]ootstrap|Connection timed out)"
    r"|(?i:nvshmem)\S*.*[Bb]ootstrap.*(?:timed? ?out|failed|error)"
    r"|[Bb]ootstrap.*(?i:nvshmem).*(?:timed? ?out|failed|error)"
    r"|waiting for clients\. \d+/\d+ clients joined|RendezvousTimeoutError|RendezvousClosedError"
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp broadcastUniqueNCCLID: the rank could not
    # fetch the communicator's ncclUniqueId from the store (rank 0 never published it).
    r"|is setting up NCCL communicator and retrieving ncclUniqueId from"
)
# torch/csrc/distributed/c10d/socket.cpp SocketImpl::waitForInput (C10D_WARNING): a store
# client's wait for the store's answer timed out, `waitForInput: socket SocketImpl(...) timed out
# after Nms`. At start-up that is a rank the rendezvous waits for that never arrived; a store
# serves later waits too (a KV pipe's keys, a weight-sync group), so it is set-up only with a
# start-up beside it.
_STORE_WAIT = re.compile(r"waitForInput: socket .* timed out after \d+ms")
# NVIDIA/nvshmem (3.x) src/host/transport/transport.cpp nvshmemi_setup_connections, called from
# nvshmemi_common_init (src/host/init/init.cu `nvshmem setup connections failed`) only: a
# transport's connect_endpoints failing (`connect EPS failed`) is set-up, never a runtime error.
# Under it the IB transports' own steps: ibrc.cpp ep_create / ep_connect (`ibv_modify_qp failed`,
# `ep_connect failed`), transport_ib_common.cpp (`transport create connect failed`), ibgda.cpp
# (`create DCT share err.`), each through NVSHMEMI_NZ_ERROR_JMP (`file:line: non-zero status: N`).
_NVSHMEM_CONNECT = re.compile(
    r"(?P<file>[\w.]+):\d+: non-zero status: (?P<st>-?\d+):? (?P<what>connect EPS failed"
    r"|ep_connect failed|ibv_modify_qp failed|transport create connect failed"
    r"|nvshmem setup connections failed|create DCT share err)"
    # The message on a line of its own, under its `file:N: non-zero status: N` line (the macro
    # prints both; a console or a poster may break them apart).
    r"|^\s*(?P<bare>connect EPS failed|nvshmem setup connections failed)\s*$"
)
_SETUP_FIX = (
    "The communicator between the ranks never came up, so no collective can run. Check that "
    "every rank started and reaches the others (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / "
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME on multi-homed hosts, firewalls, the rendezvous "
    "address), rerun with NCCL_DEBUG=INFO (and NVSHMEM_DEBUG=INFO) to see the step that "
    "fails, then restart every rank together."
)


def setup_stage(lines: Sequence[str], i: int) -> str:
    """The set-up stage line `i` failed in, read from it and the kept lines before it."""
    before = lines[max(0, i - _NEAR) : i + 1]
    if any(_INIT_DONE.search(x) for x in before):
        return "first collective"
    near = _near(lines, i)
    if any(_STAGE_BOOT.search(x) for x in near):
        return "bootstrap"
    if any(_STAGE_INIT.search(x) for x in near):
        return "init"
    return "first collective"


def _near(lines: Sequence[str], i: int) -> Sequence[str]:
    """The lines read with an error at `i`: its own message may run on below it, and so may the
    traceback it ends."""
    return lines[max(0, i - _NEAR) : i + 30]


def _came_up_before(lines: Sequence[str], i: int) -> bool:
    """Did the last communicator init NCCL logged before line `i` complete, further back than the
    lines read with the error? Then an error now is a collective's, not set-up's."""
    for j in range(i - 1, -1, -1):
        if m := _INIT_MARK.search(lines[j]):
            return "START" not in m[0] and j < i - _NEAR
    return False


# Every line setup_cause can read holds one of these (NCCL's and NVSHMEM's words, the IB steps
# NVSHMEM names without its own, torch's rendezvous and store): a log with none of them is read
# no further for a set-up failure (core/judge/derived.py runs on every tick).
# Lower-case literals: a substring test per line costs a third of one case-blind regex.
_SETUP_HINTS = (
    "nccl",
    "nvshmem",
    "rendezvous",
    "clients joined",
    "connect eps failed",
    "ep_connect failed",
    "ibv_modify_qp failed",
    "transport create connect failed",
    "create dct share err",
    "waitforinput",
)


def setup_hinted(text: str) -> bool:
    """Could setup_cause read anything in `text`?"""
    low = text.lower()
    return any(h in low for h in _SETUP_HINTS)


def setup_cause(lines: Sequence[str], i: int) -> Cause | None:
    """A communicator set-up failure on line `i` (an NCCL error before init completed, an
    NVSHMEM bootstrap or a rendezvous that timed out), with its stage."""
    line = lines[i]
    if (trail := nccl_trail(lines, i)) is not None:
        return Cause("collective_setup", trail.summary, _SETUP_FIX, trail.line, trail.stage)
    if m := _NVSHMEM_CONNECT.search(line):
        where = f" ({m['file']}, status {m['st']})" if m["file"] else ""
        return Cause(
            "collective_setup",
            "NVSHMEM could not connect its transport's endpoints (IB queue pairs): "
            f"{m['what'] or m['bare']}{where}",
            _SETUP_FIX,
            line,
            "init",
        )
    if _STORE_WAIT.search(line):
        near = [x for x in _near(lines, i) if not _STORE_WAIT.search(x)]
        if not any(_STAGE_INIT.search(x) or _STAGE_BOOT.search(x) for x in near):
            return None
        return Cause(
            "collective_setup",
            f"the rendezvous store never answered: {line.strip()[:160]}",
            _SETUP_FIX,
            line,
            "bootstrap",
        )
    if _SETUP.search(line):
        stage = setup_stage(lines, i)
        return Cause(
            "collective_setup",
            f"communicator set-up failed: {line.strip()[:160]}",
            _SETUP_FIX,
            line,
            stage,
        )
    m = _NCCL_ERR.search(line)
    if m is None or "{" in m[0]:  # `raise RuntimeError(f"NCCL error: {error_str}")`: source
        return None
    stage = setup_stage(lines, i)
    what = (m["what"] or m["what2"] or m["name"] or m["what3"] or "NCCL error").strip()
    fix = _SETUP_FIX
    # NCCL's CUDA failure under the error names what CUDA said.
    if cuda := next(filter(None, map(NCCL_CUDA.search, lines[i : i + 4])), None):
        if cuda["text"] not in what:
            what += f" (CUDA {cuda['n'] + ' ' if cuda['n'] else ''}'{cuda['text']}')"
        if fabric_down(cuda["text"]):
            fix = NVSWITCH_FIX
    if stage == "first collective" and (
        _came_up_before(lines, i) or not any(_STAGE_INIT.search(x) for x in lines[: i + 1])
    ):
        # No sign of set-up around it: a collective's failure, the set-up stage unknown.
        return Cause("collective", f"NCCL {what} in a collective", fix, line)
    return Cause(
        "collective_setup",
        f"NCCL {what} while setting up the communicator",
        fix,
        line,
        stage,
    )
