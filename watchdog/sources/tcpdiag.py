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
namespace, no privilege needed. Only the server's port is looked at, and the kernel does the
looking: the request carries an INET_DIAG_REQ_BYTECODE filter (what `ss 'sport = :8000'`
sends, iproute2 misc/ss.c ssfilter_bytecompile), so a host holding thousands of other
connections costs a walk of its socket hash in the kernel, not a message per socket here.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("hang_watchdog.sources.tcpdiag")

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
TCPDIAG_GETSOCK = 18
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
_DUMP = NLM_F_REQUEST | NLM_F_DUMP
NLMSG_DONE, NLMSG_ERROR = 3, 2
INET_DIAG_INFO = 2
INET_DIAG_REQ_BYTECODE = 1
# include/uapi/linux/inet_diag.h: struct inet_diag_bc_op {u8 code; u8 yes; u16 no;}, and
# struct inet_diag_hostcond {u8 family; u8 prefix_len; int port; __be32 addr[];}.
INET_DIAG_BC_JMP, INET_DIAG_BC_S_COND, INET_DIAG_BC_D_COND = 1, 7, 8
TCP_ESTABLISHED = 1
_NLMSG = struct.Struct("=IHHII")
_NLATTR = struct.Struct("=HH")
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then a 48-byte id
_COMPAT_REQ = struct.Struct("=BBBB")  # family, src_len, dst_len, ext; then the id
_COMPAT_TAIL = struct.Struct("=II")  # states, dbs
_EXT = 1 << (INET_DIAG_INFO - 1)
FAMILIES = (socket.AF_INET, socket.AF_INET6)
_BC_OP = struct.Struct("=BBH")
_HOSTCOND = struct.Struct("=BBxxi")  # AF_UNSPEC, prefix 0: the port alone is compared
_DIAG_MSG_LEN = 72  # struct inet_diag_msg
_INODE_AT = 68  # idiag_inode in inet_diag_msg
# struct tcp_info: 8 one-byte fields, 9 u32s, then last_data_sent, last_ack_sent,
# last_data_recv (ms); bytes_received (u64) at 128 since Linux 4.1.
_LAST_SENT_AT, _LAST_RECV_AT, _BYTES_RECEIVED_AT = 44, 52, 128
MAX_MESSAGES = 4096  # sockets read per dump: a bound, not a limit any server reaches
MIN_AGE_S = 1.0  # a request younger than this is just being served


class DiagUnavailable(OSError):
    """The kernel does not answer sock_diag here (no netlink, a seccomp filter, an old kernel)."""


class DiagRejected(DiagUnavailable):
    """The kernel answered the request with an error (a filter it does not accept)."""


@dataclass(frozen=True)
class PendingRequest:
    """One connection to the server whose last request has no answer yet."""

    peer_port: int
    waiting_s: float  # since the request's last byte arrived
    inode: int


@dataclass(frozen=True)
class TcpSocket:
    """One established TCP socket as sock_diag reports it."""

    sport: int  # local port
    dport: int  # peer port
    inode: int  # 0 once its owner closed it
    info: bytes  # struct tcp_info, as long as this kernel's


def port_filter(port: int) -> bytes:
    """Bytecode keeping the sockets whose local or peer port is `port`: the server's side of
    each connection and the clients' side of those made on this host (ss's
    `sport = :PORT or dport = :PORT`).

    Each op jumps forward `yes` bytes when its condition holds, else `no` bytes; a program
    that ends exactly at its last byte keeps the socket, one that jumps past it drops it
    (net/ipv4/inet_diag.c inet_diag_bc_run). ss compiles `A or B` as A, a JMP over B, B: A
    failing jumps to B, A holding falls onto the JMP (which always takes `no`) and past B.
    """
    cond = _HOSTCOND.pack(socket.AF_UNSPEC, 0, port)
    step = _BC_OP.size + len(cond)
    source = _BC_OP.pack(INET_DIAG_BC_S_COND, step, step + _BC_OP.size) + cond
    peer = _BC_OP.pack(INET_DIAG_BC_D_COND, step, step + _BC_OP.size) + cond
    jump = _BC_OP.pack(INET_DIAG_BC_JMP, _BC_OP.size, len(peer) + _BC_OP.size)
    return source + jump + peer


@dataclass(frozen=True)
class DumpMode:
    """One way of asking for the sockets, tried in order until the kernel accepts one."""

    name: str
    compat: bool  # TCPDIAG_GETSOCK: one walk of the socket hash for IPv4 and IPv6 alike
    filtered: bool  # the port filter runs in the kernel


# The legacy TCPDIAG_GETSOCK request dumps both families in one walk (inet_diag_dump_compat
# asks for AF_UNSPEC), where SOCK_DIAG_BY_FAMILY walks the whole established hash once per
# family: 262,144 buckets on a 23 GiB host (the boot log's "TCP established hash table
# entries"), about 0.9 ms each even when it is empty. ss sends it too (iproute2 misc/ss.c
# tcpdiag_send). The last mode is what every kernel since 3.3 answers.
DUMP_MODES = (
    DumpMode("one filtered dump (TCPDIAG_GETSOCK)", compat=True, filtered=True),
    DumpMode("a filtered dump per family (SOCK_DIAG_BY_FAMILY)", compat=False, filtered=True),
    DumpMode("the whole table, per family, filtered here", compat=False, filtered=False),
)


class PortDiag:
    """Reads the established TCP sockets of one port, filtered by the kernel when it accepts
    the filter; when it answers a request with an error, the next of DUMP_MODES (said once)."""

    def __init__(self, port: int, *, bytecode: bytes | None = None, mode: int = 0) -> None:
        self.port = port
        self._bytecode = port_filter(port) if bytecode is None else bytecode
        self._mode = mode

    @property
    def mode(self) -> DumpMode:
        return DUMP_MODES[self._mode]

    def sockets(self) -> list[TcpSocket]:
        """IPv4 and IPv6 sockets whose local or peer port is the port; DiagUnavailable when
        netlink fails, or when no way of asking is accepted."""
        while True:
            mode = self.mode
            try:
                found = _dump(mode.compat, self._bytecode if mode.filtered else None)
            except DiagRejected as e:
                if self._mode + 1 >= len(DUMP_MODES):
                    raise
                self._mode += 1
                log.warning(
                    "sock_diag: the kernel refused %s (%s); asking for %s from now on",
                    mode.name,
                    e,
                    self.mode.name,
                )
                continue
            if mode.filtered:
                return found
            return [s for s in found if self.port in (s.sport, s.dport)]

    def unanswered(
        self, *, exclude_peers: Iterable[int] = (), min_age_s: float = MIN_AGE_S
    ) -> list[PendingRequest]:
        """See `unanswered`."""
        return pending(self.sockets(), self.port, exclude_peers=exclude_peers, min_age_s=min_age_s)


def unanswered(
    port: int, *, exclude_peers: Iterable[int] = (), min_age_s: float = MIN_AGE_S
) -> list[PendingRequest]:
    """Connections to local `port` (IPv4 and IPv6) whose last received data is newer than
    their last sent data, waiting at least `min_age_s`; DiagUnavailable when netlink fails."""
    return PortDiag(port).unanswered(exclude_peers=exclude_peers, min_age_s=min_age_s)


def bytes_received(s: TcpSocket) -> int | None:
    """tcpi_bytes_received of the socket's tcp_info, None on a kernel before 4.1."""
    if len(s.info) < _BYTES_RECEIVED_AT + 8:
        return None
    return int(struct.unpack_from("=Q", s.info, _BYTES_RECEIVED_AT)[0])


def pending(
    sockets: Iterable[TcpSocket],
    port: int,
    *,
    exclude_peers: Iterable[int] = (),
    min_age_s: float = MIN_AGE_S,
) -> list[PendingRequest]:
    """The server-side sockets of `port` holding a request with no answer yet."""
    skip = set(exclude_peers)
    out: list[PendingRequest] = []
    for s in sockets:
        info = s.info
        if s.sport != port or s.dport in skip or len(info) < _LAST_RECV_AT + 4:
            continue
        (last_sent,) = struct.unpack_from("=I", info, _LAST_SENT_AT)
        (last_recv,) = struct.unpack_from("=I", info, _LAST_RECV_AT)
        got = bytes_received(s)
        received = 1 if got is None else got
        # Times are "ms ago": a request received after the last send has the smaller age.
        if received and last_recv <= last_sent and last_recv >= min_age_s * 1000:
            out.append(PendingRequest(s.dport, last_recv / 1000.0, s.inode))
    return out


def own_ports(sockets: Iterable[TcpSocket], port: int) -> set[int]:
    """Local ports of this process's own connections to `port` (the scrape's, the canary's):
    the client sockets among `sockets` whose inode is one of this process's descriptors."""
    mine = [s for s in sockets if s.dport == port and s.inode]
    if not mine:
        return set()
    inodes = _own_socket_inodes()
    return {s.sport for s in mine if s.inode in inodes}


def _own_socket_inodes() -> set[int]:
    """Inodes of this process's sockets: /proc/self/fd links read `socket:[INODE]` (proc(5))."""
    out: set[int] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _dump(compat: bool, bytecode: bytes | None) -> list[TcpSocket]:
    """Established TCP sockets of both families, through one netlink socket."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError) as e:  # AF_NETLINK is Linux-only
        raise DiagUnavailable(f"netlink sock_diag unavailable: {e}") from e
    requests = (
        [_compat_request(bytecode)]
        if compat
        else [_request(f, bytecode, seq) for seq, f in enumerate(FAMILIES, start=1)]
    )
    with sock:
        sock.settimeout(1.0)
        out: list[TcpSocket] = []
        for req in requests:
            try:
                sock.send(req)
                out += _read(sock)
            except DiagRejected:
                raise
            except OSError as e:
                raise DiagUnavailable(f"netlink sock_diag dump failed: {e}") from e
        return out


def _filter_attr(bytecode: bytes | None) -> bytes:
    if bytecode is None:
        return b""
    return _NLATTR.pack(_NLATTR.size + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode


def _request(family: int, bytecode: bytes | None, seq: int) -> bytes:
    """One SOCK_DIAG_BY_FAMILY dump request (struct inet_diag_req_v2) of one family."""
    req = _REQ.pack(family, socket.IPPROTO_TCP, _EXT, 0, 1 << TCP_ESTABLISHED) + bytes(48)
    req += _filter_attr(bytecode)
    return _NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, _DUMP, seq, 0) + req


def _compat_request(bytecode: bytes | None) -> bytes:
    """One TCPDIAG_GETSOCK dump request (struct inet_diag_req): both families at once."""
    req = _COMPAT_REQ.pack(socket.AF_UNSPEC, 0, 0, _EXT) + bytes(48)
    req += _COMPAT_TAIL.pack(1 << TCP_ESTABLISHED, 0) + _filter_attr(bytecode)
    return _NLMSG.pack(_NLMSG.size + len(req), TCPDIAG_GETSOCK, _DUMP, 1, 0) + req


def _read(sock: socket.socket) -> list[TcpSocket]:
    out: list[TcpSocket] = []
    seen = 0
    while seen < MAX_MESSAGES:
        data = sock.recv(1 << 16)
        if not data:
            return out
        off = 0
        while off + _NLMSG.size <= len(data):
            length, kind = _NLMSG.unpack_from(data, off)[:2]
            if length < _NLMSG.size or kind == NLMSG_DONE:
                return out
            if kind == NLMSG_ERROR:
                raise DiagRejected(_error_text(data[off + _NLMSG.size : off + length]))
            parsed = _message(data[off + _NLMSG.size : off + length])
            if parsed is not None:
                out.append(parsed)
            seen += 1
            off += (length + 3) & ~3
    return out


def _error_text(body: bytes) -> str:
    """struct nlmsgerr's error (a negative errno), named: `... EINVAL (Invalid argument)`."""
    if len(body) < 4:
        return "netlink sock_diag answered an error"
    code = -struct.unpack_from("=i", body)[0]
    name = errno.errorcode.get(code, str(code))
    return f"netlink sock_diag answered {name} ({os.strerror(code)})"


def _message(body: bytes) -> TcpSocket | None:
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
            return TcpSocket(sport, dport, inode, body[at + 4 : at + alen])
        at += (alen + 3) & ~3
    return None
