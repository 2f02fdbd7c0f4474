"""A stand-in NCCL RAS service on 127.0.0.1, built from NCCL v2.29.7-1's src/ras/client_support.cc
(commit b91894bd).

It speaks the client protocol (CLIENT PROTOCOL / SERVER PROTOCOL 2, TIMEOUT -> OK, SET FORMAT
json -> OK, STATUS -> report, then close) and writes the JSON report with the same fields and
layout as jsonWriteHeader / jsonStartCommunicator / jsonWriteRankData / jsonWriteMissingRank /
jsonWriteFooter. Modes: healthy, unresponsive (one rank missing, not answering), dead (one rank
considered dead), behind (one rank stopped one collective early), trickle (one byte every 0.2 s).
Hostile peers, for the fault tests: silent (accepts, never answers), garbage (answers bytes that
are no protocol), truncated (the report cut in the middle), deep (a report nested 100 000
deep), huge_size (`"size": 1e400`), slow (one byte a second). `mode` may be changed while it
runs: the next connection gets the new one.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # NCCL_NUM_FUNCTIONS = 5


def _rank(rank: int, host: str, allreduce: int) -> str:
    counts = ",\n".join(
        f'            "{op}": {allreduce if op == "AllReduce" else 0}' for op in OPS
    )
    return (
        "        {\n"
        f'          "rank": {rank},\n'
        f'          "host": "{host}",\n'
        f'          "pid": {4000 + rank},\n'
        f'          "cuda_dev": {rank % 8},\n'
        f'          "nvml_dev": {rank % 8},\n'
        '          "status": {\n'
        '            "init_state": 0,\n'
        '            "async_error": 0,\n'
        '            "finalize_called": false,\n'
        '            "destroy_flag": false,\n'
        '            "abort_flag": false\n'
        "          },\n"
        '          "collective_counts": {\n'
        f"{counts}\n"
        "          }\n"
        "        }"
    )


def _missing(rank: int, host: str, *, dead: bool) -> str:
    return (
        "        {\n"
        f'          "rank": {rank},\n'
        f'          "host": "{host}",\n'
        f'          "pid": {4000 + rank},\n'
        f'          "cuda_dev": {rank % 8},\n'
        f'          "nvml_dev": {rank % 8},\n'
        '          "status": {\n'
        f'            "unresponsive": {"false" if dead else "true"},\n'
        f'            "considered_dead": {"true" if dead else "false"}\n'
        "          }\n"
        "        }"
    )


def report(mode: str, size: int = 16) -> str:
    """One communicator of `size` ranks on two hosts; rank 11 is the odd one out."""

    def host(r: int) -> str:
        return "10.0.0.1" if r < size // 2 else "10.0.0.2"

    odd = 11 % size
    present = [r for r in range(size) if not (mode in ("unresponsive", "dead") and r == odd)]
    counts = {r: 1234 if (mode == "behind" and r == odd) else 1235 for r in present}
    missing = [] if len(present) == size else [_missing(odd, host(odd), dead=mode == "dead")]
    ranks = ",\n".join(_rank(r, host(r), counts[r]) for r in present)
    return (
        "{\n"
        '  "nccl_version": "2.28.9",\n'
        '  "cuda_runtime_version": 12090,\n'
        '  "cuda_driver_version": 12090,\n'
        '  "timestamp": "2026-12-01 12:00:00",\n'
        '  "communicators_count": 1,\n'
        '  "communicators": [\n'
        "    {\n"
        '      "hash": "0x5e7a9c1f2b3d4e5f",\n'
        '      "secondary_hash": "0x1a2b:0x3c4d",\n'
        f'      "size": {size},\n'
        f'      "ranks_count": {len(present)},\n'
        f'      "missing_ranks_count": {size - len(present)},\n'
        '      "ranks": [\n'
        f"{ranks}\n"
        "      ],\n"
        '      "missing_ranks": [\n' + (",\n".join(missing) + "\n" if missing else "") + "      ]\n"
        "    }\n"
        "  ],\n"
        '  "ras": {\n'
        '    "collection_time_sec": 0.012,\n'
        f'    "timeouts_count": {0 if mode == "healthy" else 1}\n'
        "  }\n"
        "}\n"
    )


class RasStandIn:
    """Listens on 127.0.0.1; records every command it received."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.commands: list[str] = []
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(8)
        self.addr = f"127.0.0.1:{self._srv.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        if self.mode == "silent":
            self._stop.wait(60)
            conn.close()
            return
        if self.mode == "garbage":
            with conn:
                conn.recv(64)
                conn.sendall(bytes(range(256)) * 8 + b"\n")
            return
        with conn, conn.makefile("rb") as lines:
            for raw in lines:
                cmd = raw.decode().strip()
                self.commands.append(cmd)
                reply = self._reply(cmd)
                if reply is None:
                    return
                self._send(conn, reply)
                if cmd.upper() == "STATUS":
                    return  # NCCL closes the client socket after the report

    def _reply(self, cmd: str) -> str | None:
        upper = cmd.upper()
        if upper.startswith("CLIENT PROTOCOL "):
            return "SERVER PROTOCOL 2\n"
        if upper.startswith("TIMEOUT ") or upper.startswith("SET FORMAT "):
            return "OK\n"
        if upper == "STATUS":
            if self.mode == "truncated":
                full = report("healthy")
                return full[: len(full) // 2]
            if self.mode == "deep":
                return "[" * 100_000 + "]" * 100_000
            if self.mode == "huge_size":
                return report("healthy").replace('"size": 16', '"size": 1e400')
            return report(self.mode)
        return f"ERROR: Unknown command {cmd}\n"

    def _send(self, conn: socket.socket, text: str) -> None:
        data = text.encode()
        slow = {"trickle": 0.2, "slow": 1.0}.get(self.mode)
        if slow is None or not text.startswith("{"):
            conn.sendall(data)
            return
        for i in range(len(data)):
            if self._stop.is_set():
                return
            try:
                conn.sendall(data[i : i + 1])
            except OSError:
                return
            time.sleep(slow)

    def stop(self) -> None:
        self._stop.set()
        self._srv.close()


def absent_addr() -> str:
    """A loopback address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


Factory = Callable[[str], RasStandIn]
