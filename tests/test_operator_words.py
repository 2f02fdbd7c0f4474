"""The words an operator reads: state reasons, the GPU-choice line, summary.md, process titles,
preflight's limits and counts, the offline CDN note, and `--gpu-source none`'s metrics."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.obsbuilder import Timeline, window_of
from watchdog.commands.preflight import UsageError, options_from_args
from watchdog.config import Config
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.judge.evidence import short_title
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import GpuSample, ProcSnapshot
from watchdog.daemon.loop import judging_line
from watchdog.outputs.summary import render_summary
from watchdog.preflight.checks_watchdog import check_incident_space
from watchdog.preflight.report import CheckResult, render_table
from watchdog.sources.conns import Resolver


def verdict_for(procs: ProcSnapshot) -> Any:
    tl = Timeline(procs=procs)
    tl.ticks(3)
    return classify(window_of(tl.obs), load_signatures([]), Thresholds())


def test_a_target_never_found_is_not_called_gone() -> None:
    never = verdict_for(ProcSnapshot(target_pid=None, alive=False))
    assert never.state == "dead"
    assert never.reason == "no server process found: nothing matches the target (yet)"
    gone = verdict_for(ProcSnapshot(target_pid=4242, alive=False))
    assert gone.reason == "the server process is gone"


def test_the_gpu_choice_line_says_why_in_words() -> None:
    one = (GpuSample(index=0),)
    assert judging_line(one, 1, "all") == (
        "judging GPU 0 of 1 (every GPU on the host: the server's own could not be told apart)"
    )
    two = (GpuSample(index=0), GpuSample(index=3))
    assert judging_line(two, 8, "server processes") == (
        "judging GPUs 0, 3 of 8 (the GPUs the server's processes use)"
    )
    assert "(the --gpus setting)" in judging_line(one, 2, "configured")


def summary_doc(driver: Any) -> dict[str, Any]:
    return {
        "verdict": {"state": "hung", "signature": "x", "title": "X", "confidence": 1.0},
        "evidence": [{"source": "stacks", "kind": "stack", "detail": "in download_file"}],
        "capture": {"result": "ok", "reason": "", "pids": []},
        "environment": {"gpus": [], "versions": {}, "driver": driver, "cmdline": []},
    }


def test_summary_says_unknown_driver_and_names_each_evidence_source_once() -> None:
    text = render_summary(summary_doc(None))
    assert "driver unknown" in text and "driver None" not in text
    assert "- [stacks] in download_file" in text and "[stacks/stack]" not in text
    assert "driver 580.65.06" in render_summary(summary_doc("580.65.06"))


def test_process_titles_are_cut_at_a_word_boundary() -> None:
    title = (
        "/root/.pyenv/versions/3.11.7/bin/python3 -m vllm.entrypoints.openai.api_server "
        "--model meta-llama/Llama-3.1-8B-Instruct --port 8000"
    )
    short = short_title(title, limit=60)
    assert short.endswith(" …") and len(short) <= 60, short
    kept, full = short[:-2], "python3 " + title.split(" ", 1)[1]
    assert full.startswith(kept)  # the interpreter's path dropped, the words kept whole
    assert full[len(kept)] == " ", short  # cut between words
    assert short_title("vllm serve m") == "vllm serve m"


def test_preflight_timeout_limit_is_stated_as_it_is_checked() -> None:
    args = SimpleNamespace(server_args="", timeout=0.0, python=None)
    with pytest.raises(UsageError) as err:
        options_from_args(args)  # type: ignore[arg-type]
    assert str(err.value).startswith("--timeout must be more than 0 and at most 60 seconds, got 0")


def test_preflight_counts_are_plural_only_when_plural() -> None:
    one = [CheckResult(id="a", status="WARN", reason="r")]
    assert "1 warning, 0 failed" in render_table(one, strict=False)
    two = one + [CheckResult(id="b", status="WARN", reason="r")]
    assert "2 warnings, 0 failed" in render_table(two, strict=False)


def test_preflight_refuses_an_incident_dir_that_run_refuses(tmp_path: Path) -> None:
    afile = tmp_path / "bundles"
    afile.write_text("")
    result = check_incident_space(afile)
    assert result.status == "FAIL", result
    assert "is a file, not a directory; `hang-watchdog run` refuses it" in result.reason
    assert check_incident_space(tmp_path / "new" / "dir").status in ("PASS", "WARN")


def test_the_default_cdn_not_resolving_offline_is_one_info_line(caplog: Any) -> None:
    def offline(host: str) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    caplog.set_level(logging.INFO, logger="hang_watchdog")
    resolver = Resolver(offline, quiet=frozenset({"edge.urm.nvidia.com"}), retry_s=0.01)
    try:
        for _ in range(50):
            resolver.addresses("edge.urm.nvidia.com")
            resolver.addresses("cdn.example.internal")
            time.sleep(0.01)
    finally:
        resolver.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "edge.urm.nvidia.com" in w], warnings
    assert any("cdn.example.internal" in w for w in warnings), warnings  # the operator's host
    notes = [r.getMessage() for r in caplog.records if "edge.urm.nvidia.com" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("edge.urm.nvidia.com does not resolve")


def test_wiring_marks_only_the_default_cdn_as_quiet() -> None:
    from watchdog.daemon.wiring import build

    built = build(Config(pid=1, gpu_source="none", metrics_addr="off", stacks=False))
    try:
        assert built.daemon.source("conns").resolver._quiet == frozenset({"edge.urm.nvidia.com"})
    finally:
        built.close()


def test_gpu_source_none_exports_no_gpu_source_and_warns_nothing(
    tmp_path: Path, caplog: Any
) -> None:
    from watchdog.daemon.wiring import build

    caplog.set_level(logging.INFO, logger="hang_watchdog")
    log = tmp_path / "server.log"
    log.write_text("")
    cfg = Config(
        gpu_source="none",
        log_files=[str(log)],
        metrics_addr="127.0.0.1:0",
        tick_s=0.1,
        stacks=False,
        cdn_default=False,
    )
    built = build(cfg)
    stop = threading.Event()
    host, port = built.server.start()
    loop = threading.Thread(target=built.daemon.run, args=(stop,), daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while built.daemon.stats.iterations < 5:
            assert time.monotonic() < deadline, "the loop did not tick"
            time.sleep(0.05)
        text = httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
    finally:
        stop.set()
        loop.join(10)
        built.close()
    assert 'hang_watchdog_source_up{source="logs"} 1' in text
    assert 'source="gpu"' not in text  # nothing for HangWatchdogBlind to fire on
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in said if "gpu" in m.lower()], said


def hung(signature: str, confidence: float = 1.0) -> Any:
    from watchdog.core.model import Verdict

    sig = load_signatures([]).get(signature)
    assert sig is not None
    return Verdict(state="hung", signature=signature, confidence=confidence, fallback=sig.fallback)


def test_the_verdict_block_says_what_remediation_would_do() -> None:
    from watchdog.remediation.describe import remediation_note
    from watchdog.remediation.settings import RemediationConfig

    sigs = load_signatures([])
    facts = {"vllm": "0.14.0"}
    note = remediation_note(
        RemediationConfig.of(Config()), sigs, hung("cubin_download_stall"), facts
    )
    assert note == (
        "off; with --remediate it would restart with fallback disable_trtllm_attention: "
        "--attention-config.use_trtllm_attention=0 (vLLM 0.14.0 >= 0.13.0: command-line flag)"
    )
    dry = remediation_note(
        RemediationConfig.of(Config(remediate=True, dry_run=True)),
        sigs,
        hung("cubin_download_stall"),
        facts,
    )
    assert dry.startswith("dry run: would restart with fallback disable_trtllm_attention")
    low = remediation_note(
        RemediationConfig.of(Config(remediate=True)), sigs, hung("cubin_download_stall", 0.3), facts
    )
    assert low == "on, not acting: confidence 0.30 is below remediate_min_confidence 0.6"
    on = remediation_note(
        RemediationConfig.of(Config(remediate=True)), sigs, hung("engine_dead"), facts
    )
    assert on.startswith("on: will restart with fallback restart") and "at most 3 restarts" in on
    advise = remediation_note(
        RemediationConfig.of(Config(remediate=True)), sigs, hung("jit_toolchain_missing"), facts
    )
    assert advise == "advise only: fallback none needs an operator; no restart"
