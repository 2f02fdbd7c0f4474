"""summary.md of an incident bundle: what is wrong, why we think so, what to do now."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def render_summary(doc: Mapping[str, Any]) -> str:
    """summary.md from an incident.json document: what, why, what to do, references, capture."""
    v = doc["verdict"]
    parts = (
        _what(doc, v),
        _why(doc),
        _todo(v),
        _ranks_md(v),
        _capture_md(doc["capture"]),
        _env_md(doc),
    )
    lines = [line for part in parts for line in [*part, ""]]
    outcome = doc.get("outcome")
    if isinstance(outcome, Mapping):
        lines += ["## Outcome", "", f"`{outcome.get('outcome')}`: {outcome.get('detail')}", ""]
    if doc.get("remediation") is not None:
        rem = json.dumps(doc["remediation"], indent=2)
        lines += ["## Remediation", "", "```json", rem, "```", ""]
    lines += ["## Files", "", "incident.json, timeline.jsonl, log-tail.txt, stacks/<pid>.*"]
    return "\n".join(lines) + "\n"


def _witnesses(v: Mapping[str, Any]) -> list[str]:
    said = v.get("witnesses") or []
    return [f"- Work pending, as said by: {'; '.join(str(w) for w in said)}"] if said else []


def _what(doc: Mapping[str, Any], v: Mapping[str, Any]) -> list[str]:
    name = v.get("signature") or v.get("state")
    return [
        f"# {v.get('title') or name} ({v.get('state')})",
        "",
        f"Incident created {doc.get('created')}; the episode began {doc.get('started')}.",
        "",
        "## What is wrong",
        "",
        f"- State `{v.get('state')}`, signature `{name}`, confidence {v.get('confidence')}",
        f"- {_since(v.get('seconds_since_progress'))}{v.get('reason') or ''}".rstrip(),
        *_witnesses(v),
    ]


def _since(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return ""
    return f"No progress for {seconds:.0f} s. "


def _why(doc: Mapping[str, Any]) -> list[str]:
    # `[source] detail`, as the terminal's verdict block shows it (the kind is in incident.json)
    items = [f"- [{e['source']}] {e['detail']}" for e in doc.get("evidence", [])]
    return ["## Why we think so", "", *(items or ["- (no evidence recorded)"])]


def _todo(v: Mapping[str, Any]) -> list[str]:
    out = ["## What to do now", "", v.get("fix") or "No specific fix is known for this state."]
    if v.get("fallback"):
        out += ["", f"Fallback configuration: `{v['fallback']}`"]
    if v.get("commands"):
        out += ["", "## Exact fix commands", "", "```sh", *v["commands"], "```"]
    refs = [f"- {r}" for r in v.get("references", [])]
    return out + ["", "## Upstream references", "", *(refs or ["- (none)"])]


def _ranks_md(v: Mapping[str, Any]) -> list[str]:
    """One row per process of the server: who is the cause, who waits (core/judge/ranks.py)."""
    views = v.get("ranks") or []
    if not views:
        return []
    cause = v.get("cause_rank")
    head = f"Cause: rank {cause}" if cause is not None else "Cause: no single rank named"
    if v.get("waiting_ranks"):
        head += f"; waiting: ranks {', '.join(str(r) for r in v['waiting_ranks'])}"
    out = ["## Ranks", "", head + ".", ""]
    out += [
        "| rank | role | part | doing | unchanged | GPU | sockets |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in views:
        rank = "-" if r.get("rank") is None else r["rank"]
        gpu = "-" if r.get("gpu") is None else r["gpu"]
        doing = f"{r.get('activity')}: `{r.get('frame')}`" if r.get("frame") else r.get("activity")
        socks = ", ".join(r.get("sockets") or []) or "-"
        out.append(
            f"| {rank} | {r.get('role') or '-'} | {r.get('part') or '-'} | {doing} "
            f"| {r.get('unchanged')} | {gpu} | {socks} |"
        )
    return out


def _capture_md(cap: Mapping[str, Any]) -> list[str]:
    out = ["## Stack capture", "", f"Result `{cap.get('result')}`: {cap.get('reason')}", ""]
    for p in cap.get("pids", []):
        state = p["error"] or f"{p['threads']} threads, {p['unchanged_threads']} unchanged"
        fix = f". Fix: {p['fix']}" if p.get("fix") else ""
        out.append(f"- pid {p['pid']} `{p['title']}`: {state}{fix}")
    return out


def _env_md(doc: Mapping[str, Any]) -> list[str]:
    env = doc["environment"]
    gpus = ", ".join(f"{g['index']}: {g['name']} (CC {g['cc']})" for g in env.get("gpus", []))
    vers = ", ".join(f"{k} {val}" for k, val in env.get("versions", {}).items())
    engine = env.get("engine") or {}
    named = " ".join(str(x) for x in (engine.get("name"), engine.get("version")) if x)
    return [
        "## Environment",
        "",
        f"- Engine: {named or 'not recognised'}",
        f"- GPUs: {gpus or 'unknown'}; driver {env.get('driver') or 'unknown'}",
        f"- Versions: {vers or 'unknown'}",
        f"- Command line: `{' '.join(env.get('cmdline') or [])}`",
    ]
