"""Stack dumps found in the log (`stack` LogEvents) as StackSamples for the stack rules (pure).

Each event carries its dump typed (`LogEvent.stack`, built by sources/logs/stackdumps.py);
timelines recorded before that hold it as dicts in `fields["threads"]`, still read here.

A dump from the log counts as one dump: its threads are never `unchanged`. A thread is
`unchanged` only when the previous dump of the same process in the log holds the same thread
with the same frames, the rule the watchdog's own py-spy pairs follow (sources/stacks/capture.py).

A traceback that ends in an exception shows where code failed, not where a thread waits, so it
is no stack evidence (a recovered error must not look like a parked thread). The exceptions a
hung process is stopped with are: KeyboardInterrupt (Ctrl-C, vllm #5484 "On 2nd Ctrl-C, still
hangs but dumps this") and SystemExit show where it was waiting, and count.

A dump the log then serves past (a later stats line with throughput, or one that reports a step
it ran) shows threads that moved on, so it is dropped: a py-spy dump taken while a registration
or a graph replay was in flight, followed by healthy batches, is no hang.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from watchdog.core.model import Frame, LogEvent, StackSample, ThreadStack
from watchdog.core.state.events import serving_progress


def _threads(ev: LogEvent) -> tuple[ThreadStack, ...]:
    """The dump's threads: typed on the event, or (a timeline recorded before the event had
    `stack`) the dict form that such a timeline stores in `fields["threads"]`."""
    if ev.stack is not None:
        return ev.stack.threads
    return _recorded_threads(ev.fields.get("threads"))


def _recorded_threads(raw: Any) -> tuple[ThreadStack, ...]:
    out = []
    for t in raw if isinstance(raw, list) else ():
        if not isinstance(t, dict):
            continue
        frames = tuple(
            Frame(
                name=str(f.get("name") or ""),
                filename=str(f.get("filename") or ""),
                line=int(f.get("line") or 0),
            )
            for f in t.get("frames") or ()
            if isinstance(f, dict)
        )
        out.append(
            ThreadStack(
                thread_id=int(t.get("thread_id") or 0),
                name=str(t.get("name") or ""),
                frames=frames,
                active=bool(t.get("active")),
            )
        )
    return tuple(out)


_WAITED = ("KeyboardInterrupt", "SystemExit")


def _raised(ev: LogEvent) -> bool:
    """A traceback of an exception raised by the code itself (not an interrupt of a wait)."""
    exc = ev.fields.get("exception")
    if ev.fields.get("format") != "traceback" or not exc:
        return False
    return not str(exc).split(":", 1)[0].rsplit(".", 1)[-1].startswith(_WAITED)


def _key(ev: LogEvent) -> tuple[Any, ...]:
    f = ev.fields
    return (f.get("pid"), f.get("title"), f.get("stream"), f.get("format"))


def log_stacks(events: Iterable[LogEvent]) -> tuple[StackSample, ...]:
    """The newest dump of each process in `events`, threads marked unchanged across two dumps."""
    latest: dict[tuple[Any, ...], tuple[ThreadStack, ...]] = {}
    previous: dict[tuple[Any, ...], tuple[ThreadStack, ...]] = {}
    titles: dict[tuple[Any, ...], tuple[int, str]] = {}
    for ev in events:
        if serving_progress(ev):  # the dumps so far were served past (core/state/events.py)
            latest.clear()
            previous.clear()
            titles.clear()
            continue
        if ev.kind != "stack" or _raised(ev):
            continue
        key = _key(ev)
        if key in latest:
            previous[key] = latest[key]
        latest[key] = _threads(ev)
        pid = ev.fields.get("pid")
        titles[key] = (int(pid) if isinstance(pid, int) else 0, str(ev.fields.get("title") or ""))
    out = []
    for key, threads in latest.items():
        before = {(t.thread_id, t.name, t.frames) for t in previous.get(key, ())}
        marked = tuple(
            ThreadStack(
                t.thread_id,
                t.name,
                t.frames,
                t.active,
                unchanged=(t.thread_id, t.name, t.frames) in before,
            )
            for t in threads
        )
        pid, title = titles[key]
        out.append(StackSample(pid=pid, title=f"{title} (from the log)".strip(), threads=marked))
    return tuple(out)
