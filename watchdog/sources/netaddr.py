"""Host names as the resolver is given them, so that resolving one loads no codec.

CPython's `socket.getaddrinfo` encodes a `str` host with the "idna" codec whatever it holds
(Modules/socketmodule.c, socket_getaddrinfo, 3.11 and 3.12), which imports `encodings.idna`,
`stringprep` and `unicodedata`: 0.2 MiB of RSS for the daemon, to resolve `localhost` (NCCL RAS)
or the server's host. A `bytes` host is passed through as it is; only a name that is not ASCII
(an internationalised domain name) still needs the codec.
"""

from __future__ import annotations

import socket


def host_arg(host: str) -> str | bytes:
    """`host` for getaddrinfo: ASCII as bytes, anything else as given (the resolver's codec)."""
    return host.encode("ascii") if host.isascii() else host


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """socket.create_connection to host:port, resolved without the idna codec."""
    # create_connection hands the host to getaddrinfo, which takes bytes (typeshed says str).
    return socket.create_connection((host_arg(host), port), timeout=timeout)  # type: ignore[arg-type]
