"""Assemble README.md from docs/readme/*.md and the config table generated from watchdog.config.

Run `python docs/build_readme.py` after editing a fragment or a config key; the test suite
fails when README.md is out of date (tests/test_readme.py).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from watchdog.commands.cli import FLAG_NAMES, NO_FLAG  # noqa: E402
from watchdog.config import Config  # noqa: E402


def config_section() -> str:
    """The config reference: every key, its flag, its default and what it does."""
    lines = [
        "## Configuration reference",
        "",
        "Every key has a default. Give keys in a TOML file with `--config FILE` (top-level",
        "`key = value`); a flag overrides the file. An unknown key or a bad value is an error that",
        "names the key (exit code 2). Boolean flags have a `--no-` form.",
        "",
        "| key | flag | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(Config):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        flag = (
            "(config file)"
            if f.name in NO_FLAG
            else FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        )
        if f.name == "command":
            flag = "`run -- COMMAND ...`"
        else:
            flag = f"`{flag}`" if flag.startswith("--") else flag
        meaning = str(f.metadata["help"]).replace("|", "\\|")
        lines.append(f"| `{f.name}` | {flag} | `{default!r}` | {meaning} |")
    return "\n".join(lines) + "\n"


def build() -> str:
    parts = []
    for frag in sorted((ROOT / "docs" / "readme").glob("*.md")):
        parts.append(frag.read_text(encoding="utf-8").strip() + "\n")
        if frag.name.startswith("00-"):
            parts.append(config_section())
    return "\n".join(parts)


if __name__ == "__main__":
    text = build()
    if "--check" in sys.argv:
        current = (
            (ROOT / "README.md").read_text(encoding="utf-8")
            if (ROOT / "README.md").exists()
            else ""
        )
        sys.exit(0 if current == text else 1)
    (ROOT / "README.md").write_text(text, encoding="utf-8")
