"""A pasted traceback's frames joined where a terminal wrapped them (sources/logs/unwrap.py), and
what `replay` then reads from them."""

from __future__ import annotations

import pytest

from tests.shipped import PATTERNS
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.sources.logs.unwrap import unwrap_frames

SITE = "/srv/venv/lib/python3.11/site-packages/vllm/engine"


@pytest.mark.parametrize(
    ("wrapped", "whole"),
    [
        # Inside the path.
        (
            f'  File "{SITE}/async_\nllm_engine.py", line 521, in run_engine_loop\n',
            f'  File "{SITE}/async_llm_engine.py", line 521, in run_engine_loop\n',
        ),
        # Inside `line N`, and inside the function's name (its rest unindented, lower-case).
        (
            f'  File "{SITE}/async_llm_engine.py", li\nne 521, in run_engi\nne_loop\n',
            f'  File "{SITE}/async_llm_engine.py", line 521, in run_engi\nne_loop\n',
        ),
        (
            f'  File "{SITE}/async_llm_engine.py", line 521, in run_engi\nne_loop\n',
            f'  File "{SITE}/async_llm_engine.py", line 521, in run_engine_loop\n',
        ),
        # Before the name, the wrap taking the space.
        (
            f'  File "{SITE}/async_llm_engine.py", line 521, in\nrun_engine_loop\r\n',
            f'  File "{SITE}/async_llm_engine.py", line 521, in run_engine_loop\r\n',
        ),
    ],
)
def test_a_wrapped_frame_is_joined(wrapped: str, whole: str) -> None:
    assert unwrap_frames(wrapped.encode()) == whole.encode()


@pytest.mark.parametrize(
    "text",
    [
        # A whole frame and its indented code line.
        f'  File "{SITE}/core.py", line 7, in step\n    out = self.run()\n',
        # A frame with no source line, then the exception's name (upper-case).
        '  File "<string>", line 1, in <module>\nKeyboardInterrupt\n',
        # A frame cut where the excerpt stops, and a log line after it.
        f'  File "{SITE}/co\nINFO 12-05 00:10:00 [loggers.py:259] Engine 000: Avg prompt\n',
        "no frame at all\n",
    ],
)
def test_lines_that_are_no_wrapped_frame_are_left_as_they_are(text: str) -> None:
    assert unwrap_frames(text.encode()) == text.encode()


def test_the_engine_loops_wrapped_frame_names_the_death() -> None:
    # vLLM 0.4's engine loop frame, wrapped inside its name: the engine-death reading of the
    # loop's frame holds once the frame is whole again.
    sigs: SignatureSet = load_signatures()
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/async_llm_engine.py", line 40, in _raise_ex\nception_on_finish\n'
        "    task.result()\n"
        f'  File "{SITE}/async_llm_engine.py", line 521, in run_engi\nne_loop\n'
        "    has_requests_in_progress = await asyncio.wait_for(\n"
    ).encode()
    _, events = read_log(text, sigs, PATTERNS)
    assert [m.signature.id for m in name_signatures(events, sigs)] == ["engine_dead"]
