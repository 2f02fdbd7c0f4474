"""The text dump rendered from py-spy's JSON is what py-spy itself prints for the same process.

A real process with two threads blocked in known frames is dumped by the real py-spy twice,
as text and as JSON; the rendering of the JSON must equal the text (py-spy's `Python vX.Y.Z`
line aside: the JSON does not carry the version), and the log's stack scanner must read the
rendering back to the same frames.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from watchdog.sources.logs.stackdumps import scan_lines
from watchdog.sources.stacks.capture import resolve_pyspy
from watchdog.sources.stacks.text import render_text

PYSPY = resolve_pyspy(None)
BLOCKED = """
import threading, time
def wait_here():
    time.sleep(600)
def worker_loop():
    wait_here()
threading.Thread(target=worker_loop, name="rank-worker", daemon=True).start()
print("ready", flush=True)
worker_loop()
"""


@pytest.mark.skipif(PYSPY is None, reason="py-spy is a test dependency")
def test_rendered_text_equals_pyspy_text_for_the_same_process() -> None:
    assert PYSPY is not None
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # both threads inside wait_here
        dump = [PYSPY, "dump", "--pid", str(proc.pid)]
        text = subprocess.run(dump, capture_output=True, text=True, timeout=30, check=True)
        raw = subprocess.run([*dump, "--json"], capture_output=True, text=True, timeout=30)
    finally:
        proc.kill()
        proc.wait()
    import json

    threads = json.loads(raw.stdout)
    cmdline = " ".join([sys.executable, "-c", BLOCKED])
    rendered = render_text(proc.pid, cmdline, threads)
    expected = [ln for ln in text.stdout.splitlines() if not ln.startswith("Python v")]
    assert rendered.splitlines() == expected
    (dump_event,) = scan_lines(rendered.splitlines())
    assert dump_event.stack is not None
    names = {t.name: [f.name for f in t.frames] for t in dump_event.stack.threads}
    assert names["rank-worker"][:2] == ["wait_here", "worker_loop"]
    assert names["MainThread"][:2] == ["wait_here", "worker_loop"]


def test_rendering_follows_pyspy_for_native_frames_locals_and_unnamed_threads() -> None:
    threads = [
        {
            "thread_id": 140000000000000,
            "thread_name": None,
            "os_thread_id": None,
            "active": True,
            "owns_gil": True,
            "frames": [
                {"name": "ncclAllReduce", "filename": "libnccl.so.2", "line": 0, "locals": None},
                {
                    "name": "step",
                    "filename": "/app/model.py",
                    "short_filename": "model.py",
                    "line": 12,
                    "locals": [
                        {"name": "self", "arg": True, "repr": "<Model>"},
                        {"name": "n", "arg": False, "repr": None},
                    ],
                },
            ],
        },
        {"os_thread_id": 7, "thread_name": "MainThread", "active": True, "frames": []},
    ]
    assert render_text(7, "python serve.py", threads).splitlines() == [
        "Process 7: python serve.py",
        "",
        'Thread 7 (active): "MainThread"',
        "Thread 0x7F544A44C000 (active+gil)",
        "    ncclAllReduce (libnccl.so.2)",
        "    step (model.py:12)",
        "        Arguments:",
        "            self: <Model>",
        "        Locals:",
        "            n: ?",
    ]
