"""The real-log corpus (tests/data/corpus/): every excerpt replayed, every expectation checked.

A hang excerpt must name its signature (or be listed, with the reason, as one that log evidence
alone cannot name, and then name nothing false); a non-hang excerpt must name nothing.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import tomllib

from watchdog.commands.replaylog import read_log
from watchdog.core.logverdict import name_signatures
from watchdog.core.openops import load_ops, open_operations, stuck_cause
from watchdog.core.signatures import load_signatures

CORPUS = Path(__file__).parent / "data" / "corpus"
MANIFEST = tomllib.loads((CORPUS / "manifest.toml").read_text(encoding="utf-8"))["excerpt"]
SIGS = load_signatures()
OPS = load_ops()


def _named(name: str) -> tuple[list[str], str | None]:
    lines, events = read_log((CORPUS / name).read_bytes(), SIGS)
    names = [m.signature.id for m in name_signatures(events, SIGS)]
    cause = stuck_cause(open_operations(lines, OPS))
    return names, cause.signature if cause is not None else None


def test_the_corpus_is_large_and_every_file_is_listed() -> None:
    files = {p.name for p in CORPUS.glob("*.log")}
    listed = [e["file"] for e in MANIFEST]
    assert sorted(listed) == sorted(files)
    assert len(listed) == len(set(listed))
    for e in MANIFEST:
        assert e["source"].startswith("https://github.com/"), e["file"]
        assert e["expect"] in ("quiet", "unnameable") or SIGS.get(e["expect"]), e["file"]
        if e["expect"] == "unnameable":
            assert e.get("reason"), f"{e['file']}: an unnameable excerpt needs its reason"


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"] for e in MANIFEST])
def test_excerpt_meets_its_expectation(entry: dict[str, str]) -> None:
    names, stuck = _named(entry["file"])
    if entry["expect"] in ("quiet", "unnameable"):
        assert names == [], f"{entry['file']} must name no hang, named {names}"
    else:
        assert names and names[0] == entry["expect"], f"{entry['file']}: named {names}"
    if "stuck" in entry:
        assert not names and stuck == entry["stuck"]


def tally() -> dict[tuple[str, str], collections.Counter[str]]:
    """Per engine and signature: named / not nameable / non-hang quiet (docs/field-knowledge.md)."""
    out: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for e in MANIFEST:
        names, _ = _named(e["file"])
        if e["expect"] == "quiet":
            out[(e["engine"], "(not a hang)")]["quiet" if not names else "FALSE ALARM"] += 1
        elif e["expect"] == "unnameable":
            out[(e["engine"], "(not nameable)")]["not nameable" if not names else "WRONG"] += 1
        else:
            ok = bool(names) and names[0] == e["expect"]
            out[(e["engine"], e["expect"])]["named" if ok else "MISSED"] += 1
    return out


def test_the_docs_table_is_current() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "field-knowledge.md").read_text("utf-8")
    # To refresh: PYTHONPATH=. python3 tests/test_corpus.py, paste into docs/field-knowledge.md
    assert render_tally() in doc, "the corpus tally in docs/field-knowledge.md is stale"


def test_the_readme_tally_is_current() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text("utf-8")
    # To refresh: PYTHONPATH=. python3 tests/test_corpus.py --readme, paste into
    # docs/readme/00-intro.md and run docs/build_readme.py
    assert render_engine_tally() in readme, "the corpus tally in the README is stale"


def render_engine_tally() -> str:
    """The README's short form: per engine, excerpts named, not nameable, and quiet."""
    rows = [
        "| engine | hang excerpts named | not nameable from the log alone | non-hang, quiet |",
        "|---|---|---|---|",
    ]
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (engine, _), c in tally().items():
        per[engine].update(c)
    for engine, c in sorted(per.items()):
        rows.append(f"| {engine} | {c['named']} | {c['not nameable']} | {c['quiet']} |")
    return "\n".join(rows)


def render_tally() -> str:
    rows = [
        "| Engine | Signature | Named | Not nameable | Non-hang, quiet |",
        "|---|---|---|---|---|",
    ]
    for (engine, sig), c in sorted(tally().items()):
        rows.append(
            f"| {engine} | {sig} | {c['named'] or ''} | {c['not nameable'] or ''} "
            f"| {c['quiet'] or ''} |"
        )
    total = collections.Counter[str]()
    for c in tally().values():
        total.update(c)
    rows.append(
        f"| **all** | {len(MANIFEST)} excerpts | {total['named']} | {total['not nameable']} "
        f"| {total['quiet']} |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write((render_engine_tally() if "--readme" in sys.argv else render_tally()) + "\n")
