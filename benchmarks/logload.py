"""The busy-server log the log benchmarks read: uvicorn access lines around the real samples.

A serving vLLM writes one uvicorn access line per request (`(APIServer pid=N) INFO:     IP:PORT
- "POST /v1/chat/completions HTTP/1.1" 200 OK`, uvicorn/protocols/http/h11_impl.py) and a stats
line every 10 s; the real excerpts in tests/data/logs/ carry the lines that matter. The file is
the samples, repeated, each copy followed by `access_per_copy` access lines (about 90 % of the
bytes, as on a busy server).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "logs"
_ACCESS = (
    "(APIServer pid=1) INFO:     172.31.0.{a}:{port} - "
    '"POST /v1/chat/completions HTTP/1.1" 200 OK\n'
)


def samples() -> bytes:
    """Every real log sample, each ending in a newline."""
    parts = [p.read_bytes() for p in sorted(DATA.glob("*.log"))]
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)


def busy_log(mib: float, access_per_copy: int = 15000) -> bytes:
    """About `mib` MiB of busy-server log."""
    sample = samples()
    access = "".join(
        _ACCESS.format(a=i % 250 + 1, port=30000 + i % 30000) for i in range(access_per_copy)
    ).encode()
    copy = sample + access
    return copy * max(1, round(mib * 1048576 / len(copy)))


def write_busy_log(path: Path, mib: float, access_per_copy: int = 15000) -> Path:
    """Write the busy log to `path` (for grep, wc and replay to read the same file)."""
    path.write_bytes(busy_log(mib, access_per_copy))
    return path
