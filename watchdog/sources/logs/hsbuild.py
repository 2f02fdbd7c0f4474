"""The log prefilter's Hyperscan database, compiled in a child process for a long-running daemon.

Compiling the shipped keys (about 180 literals) in the daemon's own process costs it for good:
the compiler's working memory (about 15 MiB, freed into glibc's heap, which keeps it) and the
compiler's code (about 3 MiB of `_hs_ext`'s pages, read in once and counted in RSS ever after);
the database itself is about 240 KB. A child Python compiles it and writes it out with
`hyperscan.dumpb` (hs_serialize_database); the daemon reads it back with `hyperscan.loadb`
(hs_deserialize_database) and allocates its scratch, so only the scanner's pages are the
daemon's. The child takes about 0.1 s, once, at start. Where it cannot run (no interpreter path,
a timeout, an error), the caller compiles in its own process, as before.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("hang_watchdog.logs")

CHILD_TIMEOUT_S = 60.0  # a compile of a few hundred literals takes well under a second

# Reads hex-encoded keys, one a line, and writes the serialized block-mode database; the
# expressions are the keys escaped, as prefilter._compile builds them.
_CHILD = """
import re, sys
import hyperscan as hs
keys = [bytes.fromhex(line) for line in sys.stdin.read().split()]
exprs = [re.escape(k) for k in keys]
db = hs.Database(mode=hs.HS_MODE_BLOCK)
db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs))
sys.stdout.buffer.write(hs.dumpb(db))
"""


def compile_apart(hs: Any, keys: Sequence[bytes]) -> Any | None:
    """A block-mode database of `keys`, compiled by a child Python and loaded here with its
    scratch; None when the child could not make one (the caller then compiles in-process)."""
    if not sys.executable or not keys:
        return None
    try:
        done = subprocess.run(  # argv, never a shell
            [sys.executable, "-c", _CHILD],
            input="\n".join(k.hex() for k in keys).encode(),
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("prefilter: compiling in a child failed (%s); compiling here", exc)
        return None
    if done.returncode != 0 or not done.stdout:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        log.debug("prefilter: the compiling child exited %d (%s); compiling here",
                  done.returncode, tail[0])  # fmt: skip
        return None
    try:
        db = hs.loadb(done.stdout, mode=hs.HS_MODE_BLOCK)
        db.scratch = hs.Scratch(db)
    except hs.error as exc:  # another Hyperscan in the child's path, say
        log.debug("prefilter: the child's database does not load (%s); compiling here", exc)
        return None
    return db
