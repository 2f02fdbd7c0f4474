"""The knowledge bundle: built once from the shipped files plus the operator's, passed down, and
never read on import."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from watchdog.core.knowledge.signatures import SignatureError
from watchdog.engines.loader import EngineError
from watchdog.knowledge import Knowledge, load_knowledge
from watchdog.sources.pyenv import COMMON

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh interpreter: lists every watchdog module, then imports each one with every
# way to read a file patched to record its path, then looks for loaded knowledge at module
# level. The import system's own reads (io.open_code) are not patched: they load code.
IMPORT_ALL = r"""
import builtins, importlib, importlib.resources, importlib.util, io, json, os, pathlib, sys

PKG = sys.argv[1]
top = importlib.util.find_spec(PKG).submodule_search_locations[0]  # found, not imported
OURS = sys.argv[2] if len(sys.argv) > 2 else top  # whose code's reads count
names = []
for folder, dirs, files in os.walk(top):
    dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py")))
    parts = [PKG, *os.path.relpath(folder, top).split(os.sep)]
    base = ".".join(p for p in parts if p != ".")
    for f in sorted(files):
        if f.endswith(".py") and f != "__main__.py":
            names.append(base if f == "__init__.py" else f"{base}.{f[:-3]}")
opened = []
real_open = io.open
real_read_text, real_read_bytes = pathlib.Path.read_text, pathlib.Path.read_bytes
# Whose read it is: the innermost frame outside pathlib and importlib.resources. A read by a
# third-party import (psutil reads /proc/stat, prometheus_client /proc/self/stat) is theirs.
PLUMBING = (pathlib.__file__, os.path.dirname(importlib.resources.__file__))

def note(path):
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(PLUMBING):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(OURS):
        opened.append(f"{path} (read by {frame.f_code.co_filename}:{frame.f_lineno})")

def spy_open(file, *args, **kwargs):
    note(file)
    return real_open(file, *args, **kwargs)

def spy_read_text(self, *args, **kwargs):
    note(self)
    return real_read_text(self, *args, **kwargs)

def spy_read_bytes(self, *args, **kwargs):
    note(self)
    return real_read_bytes(self, *args, **kwargs)

builtins.open = io.open = spy_open
pathlib.Path.read_text, pathlib.Path.read_bytes = spy_read_text, spy_read_bytes
by_module = {}
for name in names:
    before = len(opened)
    importlib.import_module(name)
    if len(opened) > before:
        by_module[name] = opened[before:]
builtins.open = io.open = real_open
pathlib.Path.read_text, pathlib.Path.read_bytes = real_read_text, real_read_bytes

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.knowledge.rankrules import RankRules
from watchdog.core.knowledge.sigmodel import SignatureSet
from watchdog.engines.loader import EngineSet
from watchdog.sources.logs.parse import LogPatterns

def loaded(value):
    if isinstance(value, (SignatureSet, EngineSet)):
        return True
    if isinstance(value, RankRules):
        return bool(value.activities)
    if isinstance(value, LogPatterns):
        return bool(value.prefixes or value.first or value.rest)
    return isinstance(value, tuple) and any(isinstance(v, OpDef) for v in value)

held = sorted(
    f"{name}.{attr}"
    for name in names
    for attr, value in vars(sys.modules[name]).items()
    if loaded(value)
)
print(json.dumps({"modules": len(names), "opened": by_module, "held": held}))
"""


def test_importing_every_module_reads_no_file_and_holds_no_knowledge() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, "watchdog"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["modules"] > 80  # every module was imported, not a handful
    assert got["opened"] == {}
    assert got["held"] == []


def test_the_import_check_sees_a_module_that_reads_knowledge(tmp_path: Path) -> None:
    """The spy in IMPORT_ALL would catch a module-level load like the one it replaced."""
    pkg = tmp_path / "watchdog_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from watchdog.engines.loader import load_engines\nENGINES = load_engines()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, "watchdog_probe", str(ROOT / "watchdog")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert any("vllm.toml (read by " in p for p in got["opened"].get("watchdog_probe", []))
    assert got["held"] == ["watchdog_probe.ENGINES"]


def test_the_shipped_bundle_holds_every_part() -> None:
    kb = load_knowledge()
    assert "cubin_download_stall" in kb.signatures.ids and kb.signatures.known_bad
    assert kb.ops and kb.ops is kb.signatures.ops  # openops.toml, loaded with the signatures
    assert kb.ranks.activities and kb.ranks is kb.signatures.ranks  # ranks.toml
    assert {"vllm", "sglang", "trtllm"} <= set(kb.engines.names)
    assert kb.packages[:2] == ("vllm", "sglang") and "tensorrt_llm" in kb.packages
    assert kb.packages[-len(COMMON) :] == COMMON
    assert "tensorrt_llm" in kb.modules


SIGNATURE = """
[[signature]]
id = "my_hang"
title = "My hang"
[[signature.evidence]]
kind = "log"
pattern = "my engine is stuck"
weight = 1.0
"""

ENGINE = """
schema = 1
[[engine]]
name = "acme"
version_package = "acme-serve"
packages = ["acme-kernels"]
[engine.detect]
cmdline = ['acme-serve']
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_operator_files_merge_into_the_bundle(tmp_path: Path) -> None:
    shipped = load_knowledge()
    kb = load_knowledge(
        [_write(tmp_path, "mine.toml", SIGNATURE)], [_write(tmp_path, "acme.toml", ENGINE)]
    )
    assert set(kb.signatures.ids) == set(shipped.signatures.ids) | {"my_hang"}
    assert kb.ops == shipped.ops and kb.ranks == shipped.ranks  # operator files add signatures
    assert kb.engines.names[0] == "acme" and set(shipped.engines.names) < set(kb.engines.names)
    assert kb.packages[:2] == ("acme-serve", "acme-kernels")  # read from the server too
    assert set(shipped.packages) < set(kb.packages)
    assert "acme_serve" in kb.modules


def test_bad_operator_files_raise_naming_the_file(tmp_path: Path) -> None:
    bad_sig = _write(tmp_path, "bad.toml", SIGNATURE.replace('kind = "log"', 'kind = "nope"'))
    with pytest.raises(SignatureError, match="bad.toml: signature 'my_hang'"):
        load_knowledge([bad_sig])
    bad_engine = _write(tmp_path, "acme.toml", ENGINE.replace('name = "acme"', "name = 3"))
    with pytest.raises(EngineError, match="acme.toml: engine\\[0\\]: key 'name'"):
        load_knowledge((), [bad_engine])


def test_replay_exits_2_on_a_bad_operator_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from watchdog.commands import replay

    log = _write(tmp_path, "server.log", "INFO my engine is stuck\n")
    bad_engine = _write(tmp_path, "acme.toml", ENGINE.replace('name = "acme"', "name = 3"))
    args = argparse.Namespace(
        input=str(log), signatures=[], engines=[str(bad_engine)], json=False, stuck=False
    )
    assert replay.run(args) == 2
    assert "hang-watchdog replay: --engines: " in capsys.readouterr().err
    args.engines, args.signatures = [], [str(_write(tmp_path, "mine.toml", SIGNATURE))]
    assert replay.run(args) == 1  # the operator's signature names the line
    assert "my_hang" in capsys.readouterr().out


def test_the_wiring_passes_its_bundle_down(tmp_path: Path) -> None:
    """What `build` is handed is what the daemon classifies with and its sources read."""
    from watchdog.config import build_config
    from watchdog.daemon.wiring import build

    kb = load_knowledge(
        [_write(tmp_path, "mine.toml", SIGNATURE)], [_write(tmp_path, "acme.toml", ENGINE)]
    )
    cfg = build_config(
        {"metrics_addr": "off", "gpu_source": "none", "cdn_default": False, "pid": 1}
    )
    built = build(cfg, knowledge=kb)
    try:
        assert built.daemon.sigs is kb.signatures
        assert built.daemon.window.ranks is kb.ranks
        assert built.engines is kb.engines
        assert built.daemon.source("facts").packages == kb.packages
    finally:
        built.close()


def test_a_knowledge_value_is_frozen() -> None:
    kb = load_knowledge()
    with pytest.raises(AttributeError):
        kb.packages = ()  # type: ignore[misc]
    assert isinstance(Knowledge.of(kb.signatures, kb.engines), Knowledge)
