"""py-spy target: blocked in `download_file` on a loopback socket that never answers.

Mimics FlashInfer's cubin fetch (flashinfer/jit/cubin_loader.py download_file) without any
network: the listener never accepts or sends, so `recv` waits forever. A second thread
("climber") keeps changing its stack so tests can tell a stuck thread from a moving one.
Prints "ready" once blocked.
"""

from __future__ import annotations

import socket
import sys
import threading
import time


def climb(depth: int) -> None:
    """Recurse slowly so this thread's stack differs between two dumps."""
    time.sleep(0.02)
    if depth < 400:
        climb(depth + 1)


def climber() -> None:
    while True:
        climb(0)


def download_file(sock: socket.socket) -> bytes:
    """Named like flashinfer.jit.cubin_loader.download_file; waits for bytes that never come."""
    print("ready", flush=True)
    return sock.recv(1)


def main() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=None)
    threading.Thread(target=climber, name="climber", daemon=True).start()
    download_file(client)
    sys.exit(1)


if __name__ == "__main__":
    main()
