"""State changes and verdicts on stderr: one line each, readable or JSON."""

from __future__ import annotations

import io
import json

from watchdog.core.model import Evidence, Verdict
from watchdog.outputs.emit import Emitter

HUNG = Verdict(
    state="hung",
    signature="cubin_download_stall",
    title="FlashInfer is stuck fetching kernel cubins",
    confidence=0.8,
    evidence=(Evidence("conns", "cdn_socket", "pid 7 -> edge (1.2.3.4:443) ESTABLISHED"),),
    fix="Install flashinfer-cubin.\nOr disable TRTLLM attention.",
    commands=("vllm serve M --attention-config.use_trtllm_attention=0",),
)


def test_text_lines_are_one_line_per_event_with_cause_evidence_and_fix() -> None:
    out = io.StringIO()
    Emitter("text", stream=out, wall=lambda: 0.0).state_change("serving", HUNG)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines  # the state change, then the verdict
    assert "serving -> hung: cubin_download_stall" in lines[0]
    verdict = lines[1]
    assert "hang-watchdog verdict: hung: cubin_download_stall (0.80)" in verdict
    assert "[conns] pid 7 -> edge" in verdict and "fix: Install flashinfer-cubin. Or" in verdict
    assert "use_trtllm_attention=0" in verdict


def test_json_lines_are_objects_carrying_the_verdict() -> None:
    out = io.StringIO()
    Emitter("json", stream=out, wall=lambda: 0.0).state_change(None, HUNG)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["state", "verdict"]
    assert events[0]["new"] == "hung" and events[0]["old"] is None
    assert events[1]["verdict"]["signature"] == "cubin_download_stall"
    assert events[1]["verdict"]["evidence"][0]["source"] == "conns"


def test_a_closed_stderr_does_not_stop_the_watchdog() -> None:
    out = io.StringIO()
    out.close()
    Emitter("text", stream=out).event("state", "still running")  # must not raise
