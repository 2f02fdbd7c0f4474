"""README.md is assembled from docs/readme/ and the config table; it must not drift."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from watchdog.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build_readme.py"), "--check"], cwd=ROOT, check=False
    )
    assert result.returncode == 0, "README.md is stale: run `python docs/build_readme.py`"


def test_readme_documents_every_config_key_and_command() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for f in dataclasses.fields(Config):
        assert f"| `{f.name}` |" in text, f.name
    for cmd in ("run", "diagnose", "replay", "signatures", "preflight", "demo", "fallback"):
        assert f"| `{cmd}" in text, cmd


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "pip install . && hang-watchdog demo" in quick
    assert "python -m pytest" in quick
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pytest -q" in ci
