"""Every process descended from one the watchdog started, found by a mark in its environment.

A process group misses a descendant that called setsid() (py-spy's helpers, a server's own
daemons), and the parent chain misses one orphaned by a double fork (re-parented to PID 1).
The environment is inherited across both, so the watchdog puts HANG_WATCHDOG_TREE=<tag> in the
environment of what it starts and, when it stops it, also signals every process whose
/proc/PID/environ (the environment it was exec'ed with) holds that tag. A process that execs
with a cleared environment (`env -i`) still escapes; the process group and the parent chain
are signalled as well.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

TAG_VAR = "HANG_WATCHDOG_TREE"


def new_tag() -> str:
    """A tag no other process tree has: this watchdog's pid and 48 random bits."""
    # os.urandom, not `secrets`: secrets imports hashlib, whose _hashlib maps OpenSSL's
    # libcrypto (about 3.5 MiB RSS) into a daemon that hashes nothing.
    return f"{os.getpid()}.{os.urandom(6).hex()}"


def tagged(tag: str, proc_dir: str = "/proc") -> list[psutil.Process]:
    """The live processes (not this one) whose environment holds TAG_VAR=`tag`."""
    needle = f"\0{TAG_VAR}={tag}\0".encode()
    me = os.getpid()
    out: list[psutil.Process] = []
    try:
        entries = [e.name for e in os.scandir(proc_dir) if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        pid = int(name)
        if pid == me:
            continue
        try:
            with open(f"{proc_dir}/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone, or another user's
            continue
        if needle in b"\0" + env + (b"" if env.endswith(b"\0") else b"\0"):
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid))
    return out


def signal_tagged(tag: str, sig: signal.Signals) -> list[psutil.Process]:
    """Send `sig` to every tagged process; the processes signalled."""
    procs = tagged(tag)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil refuses a pid that was reused meanwhile
    return procs
