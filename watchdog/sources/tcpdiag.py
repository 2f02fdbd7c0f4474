"""Requests the server accepted and has not answered, read from its sockets by the kernel.

An engine's own gauges can lag the work: vLLM 0.32 publishes `vllm:num_requests_running` from
the scheduler stats of the last step that *finished* (vllm/v1/engine/core.py step:
`update_from_output` after `execute_model`), so a step that never returns leaves them at the
previous step's value, 0 after an idle spell. The server's TCP sockets do not lag: on an
HTTP/1.1 connection, data received more recently than anything sent is a request still
waiting for its answer, and an answer being streamed keeps the last send fresh.

The kernel keeps both times per socket (`tcpi_last_data_recv`, `tcpi_last_data_sent` in
`struct tcp_info`, include/uapi/linux/tcp.h); a NETLINK_SOCK_DIAG dump with INET_DIAG_INFO
(linux/inet_diag.h, what `ss -ti` reads) returns them for every socket of the network
namespace, no privilege needed. Only the server's listening port is looked at.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then a 48-byte id
_DIAG_MSG_LEN = 72  # struct inet_diag_msg
_INODE_AT = 68  # idiag_inode in inet_diag_msg
# struct tcp_info: 8 one-byte fields, 9 u32s, then last_data_sent, last_ack_sent,
# last_data_recv (ms); bytes_received (u64) at 128 since Linux 4.1.
_LAST_SENT_AT, _LAST_RECV_AT, _BYTES_RECEIVED_AT = 44, 52, 128
MAX_MESSAGES = 4096  # sockets read per dump: a bound, not a limit any server reaches
MIN_AGE_S = 1.0  # a request younger than this is just being served


class DiagUnavailable(OSError):
    """The kernel does not answer sock_diag here (no netlink, a seccomp filter, an old kernel)."""


@dataclass(frozen=True)
class PendingRequest:
    """One connection to the server whose last request has no answer yet."""

    peer_port: int
    waiting_s: float  # since the request's last byte arrived
    inode: int


def unanswered(
    port: int, *, exclude_peers: Iterable[int] = (), min_age_s: float = MIN_AGE_S
) -> list[PendingRequest]:
    """Connections to local `port` (IPv4 and IPv6) whose last received data is newer than
    their last sent data, waiting at least `min_age_s`; DiagUnavailable when netlink fails."""
    skip = set(exclude_peers)
    out: list[PendingRequest] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for sport, dport, inode, info in _dump(family):
            if sport != port or dport in skip or len(info) < _LAST_RECV_AT + 4:
                continue
            (last_sent,) = struct.unpack_from("=I", info, _LAST_SENT_AT)
            (last_recv,) = struct.unpack_from("=I", info, _LAST_RECV_AT)
            received = (
                struct.unpack_from("=Q", info, _BYTES_RECEIVED_AT)[0]
                if len(info) >= _BYTES_RECEIVED_AT + 8
                else 1
            )
            # Times are "ms ago": a request received after the last send has the smaller age.
            if received and last_recv <= last_sent and last_recv >= min_age_s * 1000:
                out.append(PendingRequest(dport, last_recv / 1000.0, inode))
    return out


def _dump(family: int) -> list[tuple[int, int, int, bytes]]:
    """(local port, peer port, inode, tcp_info) of every established TCP socket of `family`."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError) as e:  # AF_NETLINK is Linux-only
        raise DiagUnavailable(f"netlink sock_diag unavailable: {e}") from e
    with sock:
        sock.settimeout(1.0)
        ext = 1 << (INET_DIAG_INFO - 1)
        req = _REQ.pack(family, socket.IPPROTO_TCP, ext, 0, 1 << TCP_ESTABLISHED) + bytes(48)
        flags = NLM_F_REQUEST | NLM_F_DUMP
        try:
            sock.send(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, flags, 1, 0) + req)
            return _read(sock)
        except OSError as e:
            raise DiagUnavailable(f"netlink sock_diag dump failed: {e}") from e


def _read(sock: socket.socket) -> list[tuple[int, int, int, bytes]]:
    out: list[tuple[int, int, int, bytes]] = []
    while len(out) < MAX_MESSAGES:
        data = sock.recv(1 << 16)
        if not data:
            return out
        off = 0
        while off + _NLMSG.size <= len(data):
            length, kind = _NLMSG.unpack_from(data, off)[:2]
            if length < _NLMSG.size or kind == NLMSG_DONE:
                return out
            if kind == NLMSG_ERROR:
                raise DiagUnavailable("netlink sock_diag answered an error")
            body = data[off + _NLMSG.size : off + length]
            parsed = _message(body)
            if parsed is not None:
                out.append(parsed)
            off += (length + 3) & ~3
    return out


def _message(body: bytes) -> tuple[int, int, int, bytes] | None:
    """One inet_diag_msg and its INET_DIAG_INFO attribute; None when malformed."""
    if len(body) < _DIAG_MSG_LEN:
        return None
    sport, dport = struct.unpack_from(">HH", body, 4)
    (inode,) = struct.unpack_from("=I", body, _INODE_AT)
    at = _DIAG_MSG_LEN
    while at + 4 <= len(body):
        alen, atype = struct.unpack_from("=HH", body, at)
        if alen < 4:
            return None
        if atype == INET_DIAG_INFO:
            return sport, dport, inode, body[at + 4 : at + alen]
        at += (alen + 3) & ~3
    return None
