"""README.md and docs/configuration.md are generated (docs/build_readme.py); they must not
drift from their sources, and the README starts with the two Quick start commands."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from watchdog.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_generated_docs_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build_readme.py"), "--check"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr or "run `python3 docs/build_readme.py`"


def test_the_configuration_page_has_a_row_per_config_key() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for f in dataclasses.fields(Config):
        assert f"| `{f.name}` |" in text, f.name


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0].strip() for b in quick.split("```sh\n")[1:]]
    assert blocks[:2] == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && hang-watchdog demo",
        "apt-get update && apt-get install -y prometheus prometheus-alertmanager systemd "
        "util-linux && pip install -e '.[test]' && python -m pytest -q -n 3",
    ]
    real_tier = blocks[2]
    assert real_tier.endswith("python -m pytest -q -m real_engine tests/real_engine")
    first_section = text.split("\n## ", 2)[1]
    assert first_section.startswith("Quick start")  # right after the introduction
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # CI runs the README's commands in the README's venv, then the real-engine tier
    assert "python3 -m venv .venv" in ci and ". .venv/bin/activate" in ci
    assert "python -m pytest -q -n 3" in ci
    assert "tests/real_engine/install.sh" in ci
    assert "python -m pytest -q -m real_engine tests/real_engine" in ci
