"""README.md and docs/ stay usable: every link and anchor resolves, every command, flag and
config key is documented somewhere, and the README stays a short front page."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from watchdog.commands.cli import build_parser
from watchdog.config import Config

ROOT = Path(__file__).resolve().parent.parent
# docs/readme/ holds the README's source fragments: README.md itself is checked instead.
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "readme" not in p.parent.name),
]
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code: links and headings live outside."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", FENCE.sub("", page.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def test_slug_follows_github() -> None:
    assert slug("Pre-flight: `hang-watchdog preflight`") == "pre-flight-hang-watchdog-preflight"
    assert slug("State, `fallback show` and `fallback clear`") == (
        "state-fallback-show-and-fallback-clear"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == [], broken


def docs_text() -> str:
    return "\n".join(p.read_text() for p in PAGES)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_is_in_the_readme_commands_table() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name in subcommands():
        assert f"| `{name}" in table, name


def test_every_flag_of_every_command_is_documented() -> None:
    text = docs_text()
    missing = []
    for name, sub in subcommands().items():
        for action in sub._actions:
            longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            if longs and not re.search(rf"`{re.escape(longs[0])}[\s`=\]]", text):
                missing.append(f"{name} {longs[0]}")
    assert missing == [], missing


def test_every_config_key_is_documented() -> None:
    text = docs_text()
    for f in dataclasses.fields(Config):
        assert f"`{f.name}`" in text, f.name


def test_every_old_name_is_documented_as_an_alias() -> None:
    """An alias kept for one release is listed with its new name where operators look for it."""
    from watchdog.commands.flags import flag_name
    from watchdog.config import ALIASES

    kept = (ROOT / "docs" / "engines.md").read_text().split("## Names kept for one release")[1]
    kept = kept.split("\n## ", 1)[0]
    reference = (ROOT / "docs" / "configuration.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for old, new in ALIASES.items():
        row = f"| `{old}` | `{flag_name(old)}` | `{new}` (`{flag_name(new)}`) |"
        assert row in reference, old
        assert f"`{flag_name(old)}" in kept and f"`{old}`" in kept and f"`{new}`" in kept, old
        assert f"`{flag_name(old)}" in readme and "aliases for one release" in readme, old


def test_the_readme_is_a_short_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    assert "docs/README.md" in "\n".join(lines)
