"""The real-log corpus (tests/data/corpus/): every excerpt replayed, every expectation checked.

The corpus is split by thread. `dev` excerpts are what rules are written from: each must name
its signature (or be listed, with the reason, as one that log evidence alone cannot name, and
then name nothing false and show exactly its generic class). `test` excerpts are frozen: no
rule is written from them and no knowledge file cites their threads; they are only scored, and
the score may not fall below the figures recorded in figures.toml. A non-hang excerpt of either
split must name nothing and show no generic class.
"""

from __future__ import annotations

import collections
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import tomllib

from tests.shipped import PATTERNS
from watchdog.commands.replayclass import log_classes
from watchdog.commands.replaylog import read_log
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.state.openops import open_operations, stuck_cause

ROOT = Path(__file__).parent.parent
CORPUS = Path(__file__).parent / "data" / "corpus"
MANIFEST = tomllib.loads((CORPUS / "manifest.toml").read_text(encoding="utf-8"))["excerpt"]
RECORDED = tomllib.loads((CORPUS / "figures.toml").read_text(encoding="utf-8"))
SIGS = load_signatures()
OPS = load_ops()
CLASSES = {c.id for c in SIGS.generic}
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class Replayed:
    """What `replay FILE` says of one excerpt: signatures named, generic class, --stuck cause."""

    names: tuple[str, ...]
    cls: str | None
    stuck: str | None

    @property
    def flagged(self) -> bool:  # exit 1 of a plain `replay FILE`
        return bool(self.names) or self.cls is not None


@cache
def replayed(name: str) -> Replayed:
    data = (CORPUS / name).read_bytes()
    lines, events = read_log(data, SIGS, PATTERNS)  # as `replay` reads it
    names = tuple(m.signature.id for m in name_signatures(events, SIGS))
    verdict = None if names else log_classes(events, data, SIGS)
    cause = stuck_cause(open_operations(lines, OPS))
    return Replayed(
        names,
        verdict.primary.cls.id if verdict is not None else None,
        cause.signature if cause is not None else None,
    )


def thread(url: str) -> str:
    """`owner/repo#N` of a GitHub issue or pull-request URL."""
    m = re.match(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", url)
    assert m, url
    return f"{m[1]}#{m[2]}"


def test_the_corpus_is_large_and_every_file_is_listed() -> None:
    files = {p.name for p in CORPUS.glob("*.log")}
    listed = [e["file"] for e in MANIFEST]
    assert sorted(listed) == sorted(files)
    assert len(listed) == len(set(listed))
    for e in MANIFEST:
        assert e["source"].startswith("https://github.com/"), e["file"]
        assert e["expect"] in ("quiet", "unnameable") or SIGS.get(e["expect"]), e["file"]
        assert e.get("split") in SPLITS, f"{e['file']}: split must be one of {SPLITS}"
        assert e.get("class") is None or e["class"] in CLASSES, e["file"]
        if e["expect"] == "unnameable":
            assert e.get("reason"), f"{e['file']}: an unnameable excerpt needs its reason"


def test_the_split_is_by_thread() -> None:
    """Every excerpt of one thread is in the same split, and a third at least is `test`."""
    splits: dict[str, set[str]] = collections.defaultdict(set)
    for e in MANIFEST:
        splits[thread(e["source"])].add(e["split"])
    mixed = sorted(t for t, s in splits.items() if len(s) > 1)
    assert not mixed, f"threads in both splits: {mixed}"
    new = [e for e in MANIFEST if not e["file"].startswith(("n", "s_"))]
    if new:
        assert sum(e["split"] == "test" for e in new) * 3 >= len(new)


def _cited() -> str:
    """Every knowledge file and every source comment of the package, as one text."""
    files = sorted((ROOT / "watchdog").rglob("*.toml")) + sorted((ROOT / "watchdog").rglob("*.py"))
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def test_no_rule_cites_a_test_thread() -> None:
    """The test split is frozen: no signature reference, rule or comment cites its threads."""
    text = _cited()
    held_out = {thread(e["source"]) for e in MANIFEST if e["split"] == "test"}
    found = []
    for t in sorted(held_out):
        repo, num = t.split("#")
        name = repo.split("/")[1]
        spelled = (
            rf"{re.escape(repo)}(?:/issues/|/pull/|#){num}\b",
            rf"(?<![\w/]){re.escape(name)} ?#{num}\b",
        )
        if any(re.search(p, text, re.IGNORECASE) for p in spelled):
            found.append(t)
    assert not found, f"knowledge cites frozen test threads: {found}"


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"] for e in MANIFEST])
def test_excerpt_meets_its_expectation(entry: dict[str, str]) -> None:
    r = replayed(entry["file"])
    if entry["expect"] == "quiet":  # both splits: a false alarm is never allowed
        assert not r.flagged, f"{entry['file']} is no hang, named {r.names} / class {r.cls}"
        return
    if entry["split"] == "test":
        return  # scored by test_the_test_figures_hold, never tuned one by one
    if entry["expect"] == "unnameable":
        assert r.names == (), f"{entry['file']} must name no signature, named {r.names}"
        assert r.cls == entry.get("class"), f"{entry['file']}: class {r.cls}"
    else:
        assert r.names and r.names[0] == entry["expect"], f"{entry['file']}: named {r.names}"
    if "stuck" in entry:
        assert not r.names and r.stuck == entry["stuck"]


def right_cause(entry: dict[str, str], r: Replayed) -> bool:
    """The named signature is the expected one; where no signature covers the cause, the
    generic class shown is the one the excerpt shows (and no signature is named falsely)."""
    if entry["expect"] not in ("quiet", "unnameable"):
        return bool(r.names) and r.names[0] == entry["expect"]
    return not r.names and entry.get("class") is not None and r.cls == entry["class"]


def figures(split: str) -> dict[str, int]:
    """Per split: hang and crash excerpts, how many are flagged and how many with the right
    cause; those whose lines show the failure (labelled with a signature or a generic class,
    before they were scored) and how many of them are flagged; non-hang excerpts and how many
    of them were flagged (false alarms)."""
    out = collections.Counter[str]()
    for e in MANIFEST:
        if e["split"] != split:
            continue
        r = replayed(e["file"])
        if e["expect"] == "quiet":
            out["quiet"] += 1
            out["false_alarms"] += r.flagged
        else:
            out["hang"] += 1
            out["flagged"] += r.flagged
            out["right"] += right_cause(e, r)
            if shows_failure(e):
                out["shows"] += 1
                out["shows_flagged"] += r.flagged
    keys = ("hang", "flagged", "right", "shows", "shows_flagged", "quiet", "false_alarms")
    return {k: out[k] for k in keys}


def shows_failure(entry: dict[str, str]) -> bool:
    """Do the excerpt's lines show its failure? Labelled with a signature, or with the generic
    class they show; not an excerpt of startup lines from a thread that reports a hang later."""
    return entry["expect"] != "unnameable" or "class" in entry


def _pct(n: int, of: int) -> str:
    return f"{n} ({100 * n / of:.0f} %)" if of else str(n)


def render_figures() -> str:
    """The dev and test figures (docs/field-knowledge.md and the README)."""
    rows = [
        "| split | excerpts | hang and crash | flagged | right cause "
        "| lines show the failure | of those flagged | non-hang | false alarms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for split in SPLITS:
        f = figures(split)
        rows.append(
            f"| {split} | {f['hang'] + f['quiet']} | {f['hang']} | {_pct(f['flagged'], f['hang'])} "
            f"| {_pct(f['right'], f['hang'])} | {f['shows']} "
            f"| {_pct(f['shows_flagged'], f['shows'])} | {f['quiet']} | {f['false_alarms']} |"
        )
    return "\n".join(rows)


def test_the_test_figures_hold() -> None:
    """Printed for the record; fails on any false alarm, or when the frozen split scores
    below the figures last recorded in tests/data/corpus/figures.toml."""
    print("\n" + render_figures())
    for split in SPLITS:
        assert figures(split)["false_alarms"] == 0, f"{split}: a non-hang excerpt was flagged"
    now, rec = figures("test"), RECORDED["test"]
    assert now["hang"] >= rec["hang"], "excerpts left the frozen test split"
    assert now["flagged"] >= rec["flagged"], f"test flagged {now['flagged']} < {rec['flagged']}"
    assert now["right"] >= rec["right"], f"test right cause {now['right']} < {rec['right']}"
    assert now["shows_flagged"] >= rec["shows_flagged"], "test: fewer failures shown are flagged"


def tally() -> dict[tuple[str, str], collections.Counter[str]]:
    """Per engine and signature: named / not nameable / non-hang quiet (docs/field-knowledge.md)."""
    out: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for e in MANIFEST:
        r = replayed(e["file"])
        if e["expect"] == "quiet":
            out[(e["engine"], "(not a hang)")]["quiet" if not r.flagged else "FALSE ALARM"] += 1
        elif e["expect"] == "unnameable":
            out[(e["engine"], "(not nameable)")]["not nameable" if not r.names else "WRONG"] += 1
        else:
            ok = bool(r.names) and r.names[0] == e["expect"]
            out[(e["engine"], e["expect"])]["named" if ok else "MISSED"] += 1
    return out


def test_the_docs_table_is_current() -> None:
    doc = (ROOT / "docs" / "field-knowledge.md").read_text("utf-8")
    # To refresh: PYTHONPATH=. python3 tests/test_corpus.py, paste into docs/field-knowledge.md
    assert render_tally() in doc, "the corpus tally in docs/field-knowledge.md is stale"
    assert render_figures() in doc, "the dev/test figures in docs/field-knowledge.md are stale"


def test_the_readme_tally_is_current() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    # To refresh: PYTHONPATH=. python3 tests/test_corpus.py --readme, paste into
    # docs/readme/00-intro.md and run docs/build_readme.py
    assert render_engine_tally() in readme, "the corpus tally in the README is stale"
    assert render_figures() in readme, "the dev/test figures in the README are stale"


def render_engine_tally() -> str:
    """The README's short form: per engine, excerpts named, flagged, not nameable, and quiet."""
    rows = [
        "| engine | hang excerpts named | flagged by a generic class only "
        "| not nameable from the log alone | non-hang, quiet |",
        "|---|---|---|---|---|",
    ]
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (engine, _), c in tally().items():
        per[engine].update(c)
    classed = collections.Counter(
        e["engine"]
        for e in MANIFEST
        if e["expect"] != "quiet" and not replayed(e["file"]).names and replayed(e["file"]).cls
    )
    for engine, c in sorted(per.items()):
        rows.append(
            f"| {engine} | {c['named']} | {classed[engine]} | {c['not nameable']} | {c['quiet']} |"
        )
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
    if "--figures" in sys.argv:
        sys.stdout.write(render_figures() + "\n")
    elif "--readme" in sys.argv:
        sys.stdout.write(render_engine_tally() + "\n\n" + render_figures() + "\n")
    else:
        sys.stdout.write(render_tally() + "\n\n" + render_figures() + "\n")
