"""The engine watched and its version travel from the facts into the verdict, the terminal
block and the incident bundle (`engine: sglang 0.5.23`), whatever the engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tests.fakes import ENGINE_PACKAGES
from tests.obsbuilder import Timeline, final, frozen_bar, procs, spin
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import GpuSample, Verdict
from watchdog.knowledge import load_knowledge
from watchdog.outputs.emit import format_verdict
from watchdog.outputs.incident import Incident, IncidentWriter, build_environment, load_incident

PACKAGES = load_knowledge().packages  # what the daemon's facts source reads

SGLANG_FACTS = {
    "engine": "sglang",
    "engine_package": "sglang",
    "engine_version": "0.5.23",
    "sglang": "0.5.23",
    "sglang-kernel": "0.4.10",
    "vllm": None,
    "tensorrt_llm": None,
    "flashinfer-python": "0.7.2",
    "torch": "2.9.1",
}


def _sglang_timeline() -> Timeline:
    tree = dataclasses.replace(procs(), engine="sglang")
    return Timeline(gpus=(spin(),), procs=tree, facts=dict(SGLANG_FACTS))


def test_verdict_names_the_engine_and_its_version() -> None:
    tl = _sglang_timeline()
    frozen_bar(tl, 40, cdn=True)
    v = final(tl.obs, load_signatures())
    assert v.signature == "cubin_download_stall" and v.engine == "sglang 0.5.23"
    block = format_verdict(v)
    assert any(line.split() == ["engine", "sglang", "0.5.23"] for line in block.splitlines())


def test_version_of_another_engine_is_not_borrowed() -> None:
    """Facts read for a vLLM target do not label a later SGLang one with vLLM's version."""
    tl = _sglang_timeline()
    tl.facts = {**SGLANG_FACTS, "engine": "vllm", "engine_version": "0.11.0"}
    frozen_bar(tl, 40, cdn=True)
    assert final(tl.obs, load_signatures()).engine == "sglang"


def test_unknown_engine_shows_no_engine_line() -> None:
    tl = Timeline(gpus=(spin(),), procs=dataclasses.replace(procs(), engine="unknown"))
    frozen_bar(tl, 40, cdn=True)
    v = final(tl.obs, load_signatures())
    assert v.is_hang and v.engine == ""
    assert not any(line.startswith("engine") for line in format_verdict(v).splitlines())


def test_bundle_carries_the_engine_version(tmp_path: Path) -> None:
    env = build_environment(
        target_pid=None,
        gpus=(GpuSample(0, name="NVIDIA B200", cc="10.0"),),
        facts=SGLANG_FACTS,
        driver="580.65.06",
        engine_packages=ENGINE_PACKAGES,
    )
    assert env["engine"] == {"name": "sglang", "version": "0.5.23"}
    # The engine's installed distributions; no `vllm None` line in an SGLang bundle.
    assert env["versions"] == {
        "sglang": "0.5.23",
        "sglang-kernel": "0.4.10",
        "flashinfer-python": "0.7.2",
        "flashinfer-cubin": None,
        "torch": "2.9.1",
    }
    verdict = Verdict(state="hung", signature="cubin_download_stall", engine="sglang 0.5.23")
    path = IncidentWriter(tmp_path / "inc").write(
        Incident(verdict, [], None, [], env, 1_760_000_000.0)
    )
    doc = load_incident(path)
    assert doc["environment"]["engine"]["version"] == "0.5.23"
    assert doc["verdict"]["engine"] == "sglang 0.5.23"
    summary = (path / "summary.md").read_text()
    assert "- Engine: sglang 0.5.23" in summary and "sglang 0.5.23, sglang-kernel" in summary
    assert json.dumps(doc)


def test_operator_engine_package_is_in_the_bundle() -> None:
    facts = {"engine": "acme", "engine_package": "acme-serve", "engine_version": "1.2.3"}
    env = build_environment(
        target_pid=None,
        gpus=(),
        facts={**facts, "acme-serve": "1.2.3"},
        driver=None,
        engine_packages=ENGINE_PACKAGES,
    )
    assert env["engine"] == {"name": "acme", "version": "1.2.3"}
    assert env["versions"]["acme-serve"] == "1.2.3"


def test_bundle_without_an_engine_says_so(tmp_path: Path) -> None:
    env = build_environment(
        target_pid=None,
        gpus=(),
        facts={"vllm": "0.11.0"},
        driver=None,
        engine_packages=ENGINE_PACKAGES,
    )
    assert env["engine"] is None and env["versions"]["vllm"] == "0.11.0"
    path = IncidentWriter(tmp_path / "inc").write(
        Incident(Verdict(state="stalled"), [], None, [], env, 1_760_000_000.0)
    )
    assert "- Engine: not recognised" in (path / "summary.md").read_text()
