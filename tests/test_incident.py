"""Incident bundles: schema, redaction, permissions, retention and atomicity, on real files."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from stackprocs.spawn import start_target, stop

from tests.fakes import ENGINE_PACKAGES
from watchdog.core.model import (
    Evidence,
    GpuSample,
    LogEvent,
    Observation,
    ProcInfo,
    ProcSnapshot,
    Verdict,
)
from watchdog.core.state.timeline import read_timeline
from watchdog.knowledge import load_knowledge
from watchdog.outputs.incident import Incident, IncidentWriter, build_environment, load_incident
from watchdog.sources.stacks.capture import CaptureResult, StackCapturer, resolve_pyspy

PACKAGES = load_knowledge().packages  # what the daemon's facts source reads

HF = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm123456"
API = "sk-" + "LiveKey0123456789abcdefXYZ"
PLAIN_KEY = "plain-secret-value-42"
VLLM_KEY = "vllm-key-opaque-77"
REPO_PW = "mirrorpass99"
ALL_SECRETS = (HF, API, PLAIN_KEY, VLLM_KEY, REPO_PW)

VERDICT = Verdict(
    state="hung",
    signature="cubin_download_stall",
    title="FlashInfer is stuck downloading cubins",
    confidence=0.9,
    evidence=(
        Evidence("stacks", "stack", "pid 7 in download_file, unchanged across two dumps", 0.6),
        Evidence("log", "log", f"flashinfer.jit: Fetching x (HF_TOKEN={HF})", 0.3),
    ),
    fix="Install flashinfer-cubin and set FLASHINFER_NO_DOWNLOAD=1",
    commands=("pip install flashinfer-cubin", "flashinfer download-cubin"),
    references=("https://github.com/flashinfer-ai/flashinfer/issues/2939",),
    seconds_since_progress=42.0,
)


@pytest.fixture(scope="module")
def secret_target() -> Iterator[object]:
    env = {
        "HF_TOKEN": HF,
        "MY_API_KEY": PLAIN_KEY,
        "VLLM_API_KEY": VLLM_KEY,
        "VLLM_LOGGING_LEVEL": "INFO",
        "FLASHINFER_CUBINS_REPOSITORY": f"https://ops:{REPO_PW}@mirror.internal/cubins/",
    }
    proc = start_target("download_stall.py", env=env, args=("--api-key", API))
    yield proc
    stop(proc)


@pytest.fixture(scope="module")
def capture(secret_target) -> CaptureResult | None:
    if resolve_pyspy(None) is None:
        return None
    pid = secret_target.pid  # type: ignore[attr-defined]
    title = f"python download_stall.py --api-key {API}"
    return StackCapturer(deadline_s=30.0, second_after_s=0.3).capture_now(
        [ProcInfo(pid, os.getpid(), "python", title)]
    )


def _observations(pid: int, n: int = 3) -> list[Observation]:
    return [
        Observation(
            t=float(i),
            wall=1_760_000_000.0 + i,
            gpus=(GpuSample(0, name="NVIDIA GB300", cc="10.3", sm=0.0, dram=0.0),),
            logs=(LogEvent("line", f"Authorization: Bearer {API}"),),
            procs=ProcSnapshot(pid, True, (ProcInfo(pid, 1, "python", f"vllm --api-key {API}"),)),
            sources={"gpu": True, "server": False},
        )
        for i in range(n)
    ]


def _incident(pid: int, capture: CaptureResult | None, tail: list[str] | None = None) -> Incident:
    env = build_environment(
        target_pid=pid,
        gpus=(GpuSample(0, uuid="GPU-1", name="NVIDIA GB300", cc="10.3"),),
        facts={"vllm": "0.11.0", "flashinfer-python": "0.6.7", "torch": "2.9.0", "token": HF},
        driver="580.65.06",
        engine_packages=ENGINE_PACKAGES,
    )
    log_tail = tail if tail is not None else [f"HF_TOKEN={HF}\n", "flashinfer.jit: Fetching x\n"]
    return Incident(VERDICT, _observations(pid), capture, log_tail, env, 1_760_000_000.0)


class Clock:
    """A wall clock that advances one second per reading."""

    def __init__(self) -> None:
        self.now = 1_760_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_bundle_has_every_file_and_a_typed_schema(tmp_path, secret_target, capture) -> None:
    pid = secret_target.pid
    path = IncidentWriter(tmp_path / "inc").write(_incident(pid, capture))
    assert path.name.endswith("-cubin_download_stall")
    doc = load_incident(path)
    assert doc["schema_version"] == IncidentWriter.SCHEMA_VERSION == 1
    assert doc["verdict"]["signature"] == "cubin_download_stall"
    assert isinstance(doc["evidence"], list) and doc["evidence"][0]["source"] == "stacks"
    assert doc["timeline"]["observations"] == 3 and doc["timeline"]["sources_down"] == ["server"]
    assert isinstance(doc["created"], str) and isinstance(doc["created_wall"], float)
    assert doc["log_tail_file"] == "log-tail.txt" and doc["remediation"] is None
    env = doc["environment"]
    assert env["gpus"][0]["cc"] == "10.3" and env["driver"] == "580.65.06"
    assert env["versions"] == {
        "vllm": "0.11.0",
        "flashinfer-python": "0.6.7",
        "flashinfer-cubin": None,
        "torch": "2.9.0",
    }
    assert env["env"]["VLLM_LOGGING_LEVEL"] == "INFO" and env["env"]["HF_TOKEN"] == "<redacted>"
    assert "MY_API_KEY" not in env["env"]  # not a relevant prefix
    assert any(a.endswith("download_stall.py") for a in env["cmdline"])
    assert len(read_timeline(path / "timeline.jsonl")) == 3
    summary = (path / "summary.md").read_text()
    for heading in ("What is wrong", "Why we think so", "What to do now", "Exact fix commands"):
        assert f"## {heading}" in summary
    assert "pip install flashinfer-cubin" in summary and "issues/2939" in summary
    if capture is not None:
        assert doc["capture"]["result"] == "ok"
        assert doc["capture"]["pids"][0]["unchanged_threads"] >= 1
        for ext in (".txt", ".json", ".second.txt"):
            assert (path / "stacks" / f"{pid}{ext}").is_file()
        assert "download_file" in (path / "stacks" / f"{pid}.txt").read_text()


def test_no_secret_reaches_disk(tmp_path, secret_target, capture) -> None:
    path = IncidentWriter(tmp_path / "inc").write(_incident(secret_target.pid, capture))
    files = [p for p in path.rglob("*") if p.is_file()]
    assert len(files) >= 4
    for file in files:
        text = file.read_bytes().decode("utf-8", "replace")
        for secret in ALL_SECRETS:
            assert secret not in text, f"{secret} leaked into {file.relative_to(path)}"


def test_permissions_are_0750_and_0640_whatever_the_umask(tmp_path, secret_target, capture):
    old = os.umask(0o000)
    try:
        path = IncidentWriter(tmp_path / "inc").write(_incident(secret_target.pid, capture))
    finally:
        os.umask(old)
    for p in [path, *path.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o750 if p.is_dir() else 0o640), f"{p}: {oct(mode)}"


def test_update_remediation_rewrites_json_and_summary(tmp_path) -> None:
    writer = IncidentWriter(tmp_path)
    path = writer.write(_incident(os.getpid(), None))
    writer.update_remediation(path, {"action": "restart", "fallback": "no_trtllm_attention"})
    doc = load_incident(path)
    assert doc["remediation"]["fallback"] == "no_trtllm_attention"
    assert doc["capture"]["result"] == "not_taken"
    assert "## Remediation" in (path / "summary.md").read_text()
    assert sorted(p.name for p in path.iterdir()) == [
        "incident.json",
        "log-tail.txt",
        "summary.md",
        "timeline.jsonl",
    ]
    assert stat.S_IMODE((path / "incident.json").stat().st_mode) == 0o640


def test_retention_by_count_removes_the_oldest(tmp_path) -> None:
    writer = IncidentWriter(tmp_path, max_incidents=3, clock=Clock())
    paths = [writer.write(_incident(os.getpid(), None)) for _ in range(5)]
    (tmp_path / "unrelated").mkdir()  # not ours: never touched
    writer.write(_incident(os.getpid(), None))
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name != "unrelated")
    assert len(kept) == 3
    assert paths[0].name not in kept and paths[4].name in kept
    assert (tmp_path / "unrelated").is_dir()


def test_retention_by_bytes_keeps_the_newest(tmp_path) -> None:
    tail = ["x" * 1000 + "\n"] * 100  # about 100 kB per bundle
    clock = Clock()
    writer = IncidentWriter(tmp_path, max_bytes=250_000, clock=clock)
    paths = [writer.write(_incident(os.getpid(), None, tail)) for _ in range(4)]
    kept = sorted(tmp_path.iterdir())
    assert kept == paths[-2:]
    tiny = IncidentWriter(tmp_path, max_bytes=1, clock=clock)
    newest = tiny.write(_incident(os.getpid(), None, tail))
    assert sorted(tmp_path.iterdir()) == [newest]  # the bundle just written always stays


def test_no_partial_bundle_is_ever_visible(tmp_path) -> None:
    tail = [f"line {i} " + "y" * 200 + "\n" for i in range(40_000)]  # about 8 MB
    writer = IncidentWriter(tmp_path / "inc")
    writer.root.mkdir()
    done = threading.Event()
    seen_tmp, partial = [], []

    def watch() -> None:
        while not done.is_set():
            for entry in os.scandir(writer.root):
                if entry.name.startswith(".tmp-"):
                    seen_tmp.append(entry.name)
                elif not (Path(entry.path) / "incident.json").is_file():
                    partial.append(entry.name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        path = writer.write(_incident(os.getpid(), None, tail))
    finally:
        done.set()
        watcher.join()
    assert seen_tmp, "the watcher never saw the build directory; the test proved nothing"
    assert partial == []
    assert load_incident(path)["log_tail_lines"] == 40_000
    assert [p.name for p in writer.root.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read"),
        ("{oops", "not valid JSON"),
        ('{"verdict": {}}', "no schema_version"),
        ('{"schema_version": 99, "verdict": {}}', "schema_version 99 is not supported"),
        ('{"schema_version": 1, "verdict": {}, "environment": {}}', "'capture' is missing"),
    ],
)
def test_load_incident_rejects_bad_input_clearly(tmp_path: Path, content, needle) -> None:
    if content is not None:
        (tmp_path / "incident.json").write_text(content)
    with pytest.raises(ValueError, match=needle):
        load_incident(tmp_path)


def test_environment_reports_what_it_could_not_read(tmp_path: Path) -> None:
    env = build_environment(
        target_pid=999_999_999,
        gpus=(),
        facts={"versions": {"flashinfer": "0.6.7.post2"}},
        driver=None,
        engine_packages=ENGINE_PACKAGES,
        proc_root=str(tmp_path),
    )
    assert env["versions"]["flashinfer-python"] == "0.6.7.post2"
    assert env["cmdline"] is None and env["env"] == {}
    assert len(env["errors"]) == 1 and "the server exited" in env["errors"][0]
    assert json.dumps(env)  # plain JSON


def test_an_exited_server_keeps_what_was_read_while_it_ran(tmp_path: Path) -> None:
    """A dead server's /proc entry is gone by the time its bundle is written: the command
    line and environment the facts source kept are used, and the bundle says it exited."""
    facts = {
        "cmdline": ["python", "-m", "vllm.entrypoints.openai.api_server", "--api-key", "s3cret"],
        "server_env": {"VLLM_CPU_KVCACHE_SPACE": "1", "FLASHINFER_CUBIN_DIR": "/c"},
    }
    env = build_environment(
        target_pid=999_999_999,
        gpus=(),
        facts=facts,
        driver=None,
        engine_packages=ENGINE_PACKAGES,
        proc_root=str(tmp_path),
    )
    assert env["cmdline"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "s3cret" not in json.dumps(env["cmdline"])
    assert env["env"] == facts["server_env"]
    assert env["errors"] == [
        f"{tmp_path}/999999999 is gone: the server exited; command line and environment as "
        "read while it ran"
    ]


def test_a_retitled_servers_fragments_do_not_replace_the_kept_environment(tmp_path: Path) -> None:
    proc = tmp_path / "42"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"VLLM::APIServer\0")
    (proc / "environ").write_bytes(b"ngine_DP0\0VLLM_CPU\0")  # setproctitle's leftovers
    kept = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env = build_environment(
        target_pid=42,
        gpus=(),
        facts={"server_env": kept},
        driver=None,
        engine_packages=ENGINE_PACKAGES,
        proc_root=str(tmp_path),
    )
    assert env["env"] == kept and env["cmdline"] == ["VLLM::APIServer"] and env["errors"] == []
