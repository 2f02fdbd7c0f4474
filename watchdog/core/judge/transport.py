"""Which transport failed, and how: the root cause a transport's own error line names.

A collective or a KV transfer rides on a transport (NCCL's IB plugin, libibverbs and rdma-core's
mlx5 provider, UCX, NIXL, NVSHMEM's IB transports); when it fails, the engine's crash or timeout
that follows is the consequence. Each reading below copies the line its transport prints (the
source is cited at the pattern) and names the transport, the error and the peer or device where
the line says them. The class (crashed, timed out, a network signature) is decided elsewhere;
a line the server survives (NIXL transfer failures vLLM recomputes) gives no class and so no
cause. Pure: a line in, a reading out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TransportFailure:
    """A transport's error line: the transport, what failed, and what to check."""

    summary: str
    fix: str


_FABRIC_FIX = (
    "The RDMA link between two nodes failed under the transfer. Check the named device and "
    "its peer (ibstat, ibv_devinfo, the port's error counters, `mlxlink`), the GID index and "
    "MTU on RoCE, and the switch; restart the ranks or the prefill/decode pair once the link "
    "is healthy. Retry-exceeded and RNR errors are lost packets or a peer that stopped "
    "answering; protection and access errors are memory registered wrongly or freed early."
)
_CONNECT_FIX = (
    " A queue pair that cannot connect is configuration more often than a link: check "
    "NCCL_IB_GID_INDEX (show_gids), NCCL_IB_HCA and that the two NICs share a subnet."
)
_KV_FIX = (
    "The KV-transfer layer lost its peer (the other prefill or decode instance died, restarted "
    "or is unreachable). Check the peer instance and its NIXL/UCX agent, the network between "
    "them, and set kv_load_failure_policy to recompute so a failed load falls back."
)

# NVIDIA/nccl src/transport/net_ib.cc (and the ib_plugin of the net plugins): WARN("NET/IB :
# Got completion from peer %s with status=%d opcode=%d len=%u vendor err %u (%s)%s%s%s%s hca
# %s"); before 2.19 `... with error %d, opcode %d, len %d, vendor err %d (%s)`. The status is
# libibverbs' enum ibv_wc_status (12 IBV_WC_RETRY_EXC_ERR, 13 IBV_WC_RNR_RETRY_EXC_ERR, ...).
_NCCL_IB = re.compile(
    r"NET/IB ?: Got completion from peer (?P<peer>\S+) with (?:error |status=)(?P<st>\d+)"
    r"(?:.*?vendor err (?P<vend>\d+))?(?:.*?hca (?P<hca>\S+))?"
)
# NVIDIA/nccl src/misc/ibvwrap.cc wrap_ibv_modify_qp (and its siblings): `Call to ibv_modify_qp
# failed with error %s` (strerror; `errno %d` since 2.19), from ncclIbRtrQp / ncclIbRtsQp while
# NCCL's IB transport connects a queue pair to a peer (src/transport/net_ib.cc ncclIbConnect /
# ncclIbAccept): a GID index, HCA, MTU or subnet that does not match between the two nodes.
_NCCL_IBV_CALL = re.compile(r"Call to (?P<call>ibv_\w+) failed with error (?P<err>[^,]+?)\s*$")
# libibverbs/verbs.c ibv_wc_status_str for the statuses (enum ibv_wc_status order).
_WC_STATUS = {
    "1": "local length error",
    "2": "local QP operation error",
    "4": "local protection error",
    "5": "Work Request Flushed Error",
    "7": "memory window bind error",
    "8": "bad response error",
    "9": "local access error",
    "10": "remote invalid request error",
    "11": "remote access error",
    "12": "transport retry counter exceeded",
    "13": "RNR retry counter exceeded",
    "21": "response timeout error",
}
# linux-rdma/rdma-core providers/mlx5/cq.c mlx5_parse_cqe: on an error CQE other than a flush or
# a retry-exceeded one, `fprintf(fp, PFX "%s: got completion with error:\n", ctx->hostname)`
# (PFX is "mlx5: ") and dump_cqe's hex words. The verbs user (NCCL, NVSHMEM IBRC, Mooncake's
# transfer engine) then reports the failed work completion in its own words.
# The log reader strips `mlx5: HOST: ` as a collector's prefix (sources/logs/parse.py
# clean_line), so the line may come bare.
_MLX5_CQE = re.compile(r"(?:mlx5: (?P<host>\S+): |^)got completion with error:$")
# Applications print libibverbs' status text (ibv_wc_status_str) for a failed completion.
_WC_TEXT = re.compile(
    r"(?P<what>transport retry counter exceeded|RNR retry counter exceeded|local protection "
    r"error|remote access error|remote operation error|remote invalid request error)"
)
# openucx/ucx src/uct/ib/mlx5/ib_mlx5_log.c uct_ib_mlx5_completion_with_err: `%s on %s:%d/%s
# (synd 0x%x vend 0x%x hw_synd %d/%d)` (older: `Error on QP 0x%x wqe[%d]: %s (synd ...)`), the
# syndrome's text from the same switch; logged at ERROR when the endpoint has no error handling.
_UCX_SYND = re.compile(
    r"(?P<what>Transport retry count exceeded|Receive-no-ready retry count exceeded|Local "
    r"protection|Remote access|Remote QP|Remote side aborted|Local QP operation|Local length"
    r"|Bad response|Local access|Invalid request)(?: on (?P<dev>\w+:\d+)(?:/(?P<ll>\w+))?"
    r"| \(synd 0x)"
)
# ucx src/ucs/type/status.c ucs_status_string, in a UCX ERROR line (src/ucs/debug/log.c format
# `[time] [host:pid:tid] file.c:N UCX  ERROR msg`), e.g. src/ucp/core/ucp_ep.c `ep %p: error
# '%s' on %s will not be handled since no error callback is installed`.
_UCX_ERR = re.compile(
    r"UCX\s+ERROR\s.*?(?P<what>Endpoint timeout|Connection reset by remote peer|Destination is "
    r"unreachable|Endpoint is not connected|Operation rejected by remote peer|Input/output error)"
    r"(?:.*? on (?P<tl>\w+/\w+:\d+))?"
)
# ai-dynamo/nixl (2026-08) src/api/cpp/nixl_types.h nixl_status_t names, raised by the Python
# binding as `nixl<Name>Error: NIXL_ERR_*` (src/bindings/python/nixl_bindings.cpp);
# src/plugins/ucx/ucx_enums.cpp ucsToNixlStatus maps UCX's not-connected, connection-reset,
# endpoint-timeout and canceled to NIXL_ERR_REMOTE_DISCONNECT.
_NIXL = re.compile(r"\b(?P<what>NIXL_ERR_[A-Z_]+)\b")
# NIXL's UCX backend in its own log (absl LOG(ERROR), `E0301 10:00:02.000000 PID file.cpp:N]`):
# src/plugins/ucx/ucx_utils.cpp (2026-08) sendAmCallback `UCX AM send failed with status %d
# (%s)` (ucs_status_string) and the worker's connect `UCX endpoint create failed: %s`.
_NIXL_UCX = re.compile(
    r"UCX AM send failed with status -?\d+ \((?P<what>[^)]+)\)"
    r"|UCX endpoint create failed: (?P<ep>.+)"
)
# NVIDIA/nvshmem src/modules/transport/ibrc/ibrc.cpp progress_send: `ibv_poll_cq failed, status:
# %d` through NVSHMEMI_NZ_ERROR_JMP (`file:line: non-zero status: N ...`);
# src/modules/transport/ibdevx/ibdevx.cpp `Got ibdevx completion with error. hws: ... syn: %x`.
# Runtime errors of a connected transport (its set-up failures are core/judge/setupcause.py's).
_NVSHMEM_RT = re.compile(
    r"(?P<what>ibv_poll_cq failed, status: (?P<st>\d+)|Got ibdevx completion with error)"
)


def _nccl_ib(line: str) -> TransportFailure | None:
    if c := _NCCL_IBV_CALL.search(line):
        return TransportFailure(
            f"NCCL's IB transport could not connect a queue pair: {c['call']} failed: {c['err']}",
            _FABRIC_FIX + _CONNECT_FIX,
        )
    m = _NCCL_IB.search(line)
    if m is None:
        return None
    st = _WC_STATUS.get(m["st"], f"status {m['st']}")
    where = f" on {m['hca']}" if m["hca"] else ""
    vend = f", vendor err {m['vend']}" if m["vend"] else ""
    return TransportFailure(
        f"NCCL's IB transport: a work completion from peer {m['peer']} failed{where}: {st}{vend}",
        _FABRIC_FIX,
    )


def _verbs(line: str) -> TransportFailure | None:
    if m := _MLX5_CQE.search(line):
        return TransportFailure(
            "RDMA (rdma-core's mlx5 provider"
            + (f" on {m['host']}" if m["host"] else "")
            + "): an error completion; the queue pair went to the error state",
            _FABRIC_FIX,
        )
    if m := _UCX_SYND.search(line):
        dev = f" on {m['dev']}" + (f"/{m['ll']}" if m["ll"] else "") if m["dev"] else ""
        return TransportFailure(f"UCX (mlx5): {m['what']}{dev}", _FABRIC_FIX)
    if m := _NVSHMEM_RT.search(line):
        what = _WC_STATUS.get(m["st"] or "", m["what"]) if m["st"] else m["what"]
        return TransportFailure(f"NVSHMEM's IB transport: {what}", _FABRIC_FIX)
    return None


def _kv(line: str) -> TransportFailure | None:
    if m := _UCX_ERR.search(line):
        on = f" on {m['tl']}" if m["tl"] else ""
        return TransportFailure(f"UCX: {m['what']}{on}", _KV_FIX)
    if m := _NIXL_UCX.search(line):
        what = m["what"] or f"endpoint create failed: {m['ep'].strip()[:120]}"
        return TransportFailure(f"NIXL's UCX backend: {what}", _KV_FIX)
    if m := _NIXL.search(line):
        return TransportFailure(f"NIXL: {m['what']}", _KV_FIX)
    if m := _WC_TEXT.search(line):
        return TransportFailure(
            f"RDMA (libibverbs): a work completion failed: {m['what']}", _FABRIC_FIX
        )
    return None


def transport_reading(line: str) -> TransportFailure | None:
    """The transport failure `line` reports, or None."""
    return _nccl_ib(line) or _verbs(line) or _kv(line)


# How far below rdma-core's CQE dump (four lines of hex words) the verbs user's own report of
# the failed completion may come.
_CQE_REPORT_WITHIN = 8


def transport_reading_at(lines: Sequence[str], i: int) -> TransportFailure | None:
    """The transport failure line `i` reports; rdma-core's error-CQE dump says no status, so
    the verbs user's own report just below it (NCCL's, Mooncake's status text) names it."""
    got = transport_reading(lines[i])
    if got is None or _MLX5_CQE.search(lines[i]) is None:
        return got
    for below in lines[i + 1 : i + 1 + _CQE_REPORT_WITHIN]:
        told = transport_reading(below)
        if told is not None and _MLX5_CQE.search(below) is None:
            return TransportFailure(
                f"{told.summary} (rdma-core's mlx5 provider dumped the CQE)", told.fix
            )
    return got
