"""State changes and verdicts on stderr: a short line and one verdict block, or JSON."""

from __future__ import annotations

import io
import json

from watchdog.core.model import Evidence, Verdict
from watchdog.outputs.emit import Emitter, format_verdict, use_color

HUNG = Verdict(
    state="hung",
    signature="cubin_download_stall",
    title="FlashInfer is stuck fetching kernel cubins",
    confidence=0.8,
    evidence=(Evidence("conns", "cdn_socket", "pid 7 -> edge (1.2.3.4:443) ESTABLISHED"),),
    fix="Install flashinfer-cubin.\nOr disable TRTLLM attention.",
    commands=("vllm serve M --attention-config.use_trtllm_attention=0",),
)


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_text_is_a_short_state_line_then_one_verdict_block() -> None:
    out = io.StringIO()
    Emitter("text", stream=out, wall=lambda: 0.0).state_change("serving", HUNG)
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "1970-01-01T00:00:00Z hang-watchdog state: serving -> hung: cubin_download_stall (0.80) "
        "FlashInfer is stuck fetching kernel cubins"
    )
    assert lines[1] == "1970-01-01T00:00:00Z hang-watchdog verdict:"
    block = lines[2:]
    assert block[0] == block[-1] == "-" * 72  # one block, framed
    assert block[1] == "HUNG  cubin_download_stall (confidence 0.80)"
    assert "  - [conns] pid 7 -> edge (1.2.3.4:443) ESTABLISHED" in block
    assert any(x.startswith("fix         Install flashinfer-cubin.") for x in block), block
    assert "            Or disable TRTLLM attention." in block  # each fix line kept, indented
    assert "  $ vllm serve M --attention-config.use_trtllm_attention=0" in block
    assert all(len(x) <= 100 for x in block), block
    assert "\033[" not in out.getvalue()  # not a terminal: no colour


def test_every_line_has_the_same_timestamp_format() -> None:
    out = io.StringIO()
    em = Emitter("text", stream=out, wall=lambda: 86400.0 + 3661.0)
    em.event("state", "x")
    em.verdict(HUNG)
    stamped = [x for x in out.getvalue().splitlines() if "hang-watchdog" in x]
    assert stamped and all(x.startswith("1970-01-02T01:01:01Z hang-watchdog ") for x in stamped)


def test_the_block_says_what_remediation_would_do() -> None:
    out = io.StringIO()
    em = Emitter("text", stream=out)
    em.remediation = lambda v: f"off; with --remediate it would restart with {v.signature}"
    em.verdict(HUNG)
    text = out.getvalue()
    assert "remediation off; with --remediate it would restart with cubin_download_stall" in text


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert use_color(Tty(), environ={}) is True
    assert use_color(io.StringIO(), environ={}) is False
    assert use_color(Tty(), environ={"NO_COLOR": "1"}) is False
    assert use_color(Tty(), environ={"TERM": "dumb"}) is False
    out = Tty()
    Emitter("text", stream=out, color=True).state_change("serving", HUNG)
    assert "\033[1;31mhung\033[0m" in out.getvalue()  # the new state, red
    assert "\033[1;31mHUNG\033[0m  cubin_download_stall" in out.getvalue()


def test_json_is_unchanged_by_colour() -> None:
    out = Tty()
    Emitter("json", stream=out, wall=lambda: 0.0, color=True).state_change("serving", HUNG)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "\033[" not in out.getvalue()
    assert events[0]["message"].startswith("serving -> hung: cubin_download_stall (0.80)")


def test_a_long_evidence_line_is_wrapped_not_cut() -> None:
    long = Verdict(
        state="stalled", reason="no progress", evidence=(Evidence("log", "x", "z " * 200),)
    )
    text = format_verdict(long)
    assert text.count("z") == 200 and all(len(x) <= 100 for x in text.splitlines())


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
