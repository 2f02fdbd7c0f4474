"""A pasted log's traceback frames joined again where a terminal wrapped them at its width
(pure: bytes in, bytes out).

A poster copies a traceback from a terminal that wrapped every line at its width, so a frame's
`File "PATH", line N, in NAME` may be split inside the path, in `line N` or before the name
(vllm-project/vllm#24430, #20226). Every reader of a whole log (`replay`: its events, its records
and its tail) reads the log after this one pass, so a frame means one thing to all of them. A
server's own log is never wrapped; the live watch reads it as written.
"""

from __future__ import annotations

import re

# A frame line whole, and a line that begins one.
_WHOLE = re.compile(rb'File "[^"\n]+", line \d+, in [\w<>.]+\s*$')
_START = re.compile(rb'File "[^\n]*')
# The rest of a function's name wrapped onto a line of its own: CPython indents the code line
# under a frame, and an exception's name that may follow a frame with no code starts upper-case.
_NAME_REST = re.compile(rb"[a-z_][\w<>.]*\s*$")


def unwrap_frames(data: bytes) -> bytes:
    """`data` with each frame line that a terminal wrapped joined to the next line, where the
    two make a whole frame (directly, or with the one space the wrap took)."""
    if b'File "' not in data:
        return data
    out: list[bytes] = []
    last = 0
    for m in _START.finditer(data):
        start, end = m.start(), m.end()
        if start < last or end >= len(data):
            continue
        head = m.group(0).rstrip(b"\r")
        after = end + 1
        stop = data.find(b"\n", after)
        tail = data[after : len(data) if stop < 0 else stop].rstrip(b"\r")
        if _WHOLE.search(head) and not _NAME_REST.match(tail):
            continue
        for joined in (head + tail, head + b" " + tail.lstrip()):
            if _WHOLE.search(joined):
                out += [data[last:start], joined]
                last = after + len(tail)  # the line's own end (`\r\n` or `\n`) stays
                break
    if not out:
        return data
    out.append(data[last:])
    return b"".join(out)
