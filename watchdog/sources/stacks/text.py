"""py-spy's text dump, rendered from its JSON dump, so one py-spy run per rank serves both.

The incident bundle keeps each rank's dump as text (for people) and JSON (for rules). Running
py-spy twice per rank doubled a capture's cost; the text is rendered here in the layout of
py-spy 0.4's `print_traces` (benfred/py-spy src/dump.rs): `Process PID: CMDLINE`, a blank
line, then per thread (in reverse of the JSON's order) `Thread TID (STATUS): "NAME"` and its
frames `    NAME (FILE:LINE)`, or `    NAME (FILE)` when the line is 0 (native frames), with
`--locals` under a frame. STATUS and TID follow src/stack_trace.rs `status_str` and
`format_threadid`. py-spy's `Python vX.Y.Z (EXE)` line is left out: the JSON does not carry
the version.
"""

from __future__ import annotations

from typing import Any


def render_text(pid: int, cmdline: str, threads: list[dict[str, Any]]) -> str:
    """The text `py-spy dump --pid PID` prints for the threads of `py-spy dump --json`."""
    out = [f"Process {pid}: {cmdline}", ""]
    for t in reversed(threads):
        name = t.get("thread_name")
        head = f"Thread {_thread_id(t)} ({_status(t)})"
        out.append(f'{head}: "{name}"' if name is not None else head)
        for f in t.get("frames") or ():
            if isinstance(f, dict):
                out += _frame(f)
    return "\n".join(out) + "\n"


def _status(t: dict[str, Any]) -> str:
    if not t.get("active"):
        return "idle"
    return "active+gil" if t.get("owns_gil") else "active"


def _thread_id(t: dict[str, Any]) -> str:
    tid = t.get("os_thread_id")
    if isinstance(tid, int):
        return str(tid)
    raw = t.get("thread_id")
    return f"0x{raw:X}" if isinstance(raw, int) else "0"  # Rust {:#X}: 0x, upper-case digits


def _frame(f: dict[str, Any]) -> list[str]:
    where = f.get("short_filename") or f.get("filename") or ""
    line = f.get("line")
    out = [f"    {f.get('name')} ({where}:{line})" if line else f"    {f.get('name')} ({where})"]
    shown_args = shown_locals = False
    for local in f.get("locals") or ():
        if not isinstance(local, dict):
            continue
        if local.get("arg") and not shown_args:
            out.append("        Arguments:")
            shown_args = True
        elif not local.get("arg") and not shown_locals:
            out.append("        Locals:")
            shown_locals = True
        repr_ = local.get("repr")
        out.append(f"            {local.get('name')}: {repr_ if repr_ is not None else '?'}")
    return out
