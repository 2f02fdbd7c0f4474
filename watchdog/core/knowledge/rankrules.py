"""The rank rules' schema and loader: the activities a rank can be in, recognised by its frames,
and the plumbing frames skipped when naming one (data: ranks.toml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from watchdog.core.knowledge.tomlcheck import read_toml


@dataclass(frozen=True)
class Activity:
    """One thing a rank can be doing, recognised by its frames."""

    name: str
    part: str  # "cause" or "waiting"
    frames: re.Pattern[str]
    files: re.Pattern[str] | None


_NOTHING = re.compile(r"(?!)")  # matches no frame: rules without plumbing skip none


@dataclass(frozen=True)
class RankRules:
    """The activities and the plumbing frames skipped when naming a meaningful frame (the
    default, no rules, names no activity: every rank is "other")."""

    activities: tuple[Activity, ...] = ()
    plumbing_files: re.Pattern[str] = _NOTHING
    plumbing_frames: re.Pattern[str] = _NOTHING


def load_rank_rules(text: str | None = None) -> RankRules:
    """The shipped ranks.toml (or `text` in its format), read now on every call: the knowledge
    bundle calls it once and passes the rules down."""
    if text is None:
        text = Path(__file__).parent.joinpath("ranks.toml").read_text(encoding="utf-8")
    data = read_toml(text, "ranks.toml", "a rank rule file")
    acts = tuple(
        Activity(
            a["name"],
            a["part"],
            re.compile(a["frames"]),
            re.compile(a["files"]) if a.get("files") else None,
        )
        for a in data["activity"]
    )
    plumb = data["plumbing"]
    return RankRules(acts, re.compile(plumb["files"]), re.compile(plumb["frames"]))
