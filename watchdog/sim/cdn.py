"""A stand-in for FlashInfer's kernel CDN (`edge.urm.nvidia.com`) on 127.0.0.1.

Modes: `blackhole` accepts connections and never answers (the stalled-download case),
`trickle` answers 200 with a large Content-Length and then one byte a second, so a client's
read timeout (FlashInfer's requests `timeout=10`, flashinfer/jit/cubin_loader.py
download_file) never fires and the download never ends, `serve` answers HEAD/GET with 200
and a small body, `refuse` has nothing listening (it only reports a free port).
`python -m watchdog.sim.cdn --port 0 --mode blackhole` prints `CDN_PORT=<n>`; tests use
`start_cdn(mode)`, which runs the server in a thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("blackhole", "trickle", "serve", "refuse")
TRICKLE_EVERY_S = 1.0
BODY = b"simulated cubin\n"


class _CubinHandler(BaseHTTPRequestHandler):
    """200 with a small body for any path."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        """Quiet: the CDN is not under test."""

    def do_HEAD(self) -> None:  # noqa: N802 (http.server naming)
        """HEAD: headers only."""
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        """GET: the body."""
        self.do_HEAD()
        self.wfile.write(BODY)


def _blackhole(port: int) -> tuple[int, Callable[[], None]]:
    """Accept and hold connections without ever reading or answering."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)
    held: list[socket.socket] = []
    stopped = threading.Event()

    def accept_loop() -> None:
        while not stopped.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept_loop, name="cdn-blackhole", daemon=True).start()

    def stop() -> None:
        stopped.set()
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        for conn in held:
            conn.close()

    return int(srv.getsockname()[1]), stop


class _TrickleHandler(BaseHTTPRequestHandler):
    """200, a Content-Length of 64 MiB, then a byte every TRICKLE_EVERY_S until stopped."""

    stopped: threading.Event

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        """Quiet: the CDN is not under test."""

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(64 << 20))
        self.end_headers()
        while not self.stopped.wait(TRICKLE_EVERY_S):
            try:
                self.wfile.write(b"\0")
                self.wfile.flush()
            except OSError:
                return


def _trickle(port: int) -> tuple[int, Callable[[], None]]:
    stopped = threading.Event()
    handler = type("Trickle", (_TrickleHandler,), {"stopped": stopped})
    return _http(port, handler, "cdn-trickle", before_stop=stopped.set)


def _serve(port: int) -> tuple[int, Callable[[], None]]:
    return _http(port, _CubinHandler, "cdn-serve")


def _http(
    port: int,
    handler: type[BaseHTTPRequestHandler],
    name: str,
    before_stop: Callable[[], None] = lambda: None,
) -> tuple[int, Callable[[], None]]:
    """An HTTP server on 127.0.0.1 in a thread; (port, stop)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name=name, daemon=True).start()

    def stop() -> None:
        before_stop()
        httpd.shutdown()
        httpd.server_close()

    return int(httpd.server_address[1]), stop


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cdn(mode: str, port: int = 0) -> tuple[int, Callable[[], None]]:
    """Start the stand-in CDN in this process; returns (port, stop)."""
    if mode == "blackhole":
        return _blackhole(port)
    if mode == "trickle":
        return _trickle(port)
    if mode == "serve":
        return _serve(port)
    if mode == "refuse":
        return (port or free_port()), lambda: None
    raise ValueError(f"unknown CDN mode {mode!r}; use one of {', '.join(MODES)}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: start, print `CDN_PORT=<n>` (and --port-file), run until SIGTERM/SIGINT."""
    p = argparse.ArgumentParser(prog="python -m watchdog.sim.cdn", description=__doc__)
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = pick)")
    p.add_argument("--mode", choices=MODES, default="blackhole")
    p.add_argument("--port-file", help="also write the port to this file")
    args = p.parse_args(argv)
    port, stop = start_cdn(args.mode, args.port)
    print(f"CDN_PORT={port}", flush=True)
    if args.port_file:
        with open(args.port_file + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(f"{port}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
