"""`hang-watchdog replay`: re-classify a recorded incident, a timeline, or a plain server log.

Rule authors test a new signature against past incidents; postmortems re-run with today's
knowledge. Exit 1 if the verdict is hung, stalled or dead (or a log shows a signature), 0 if
not, 2 if the input cannot be read or is not a log, timeline or bundle (compressed, binary).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.judge.logverdict import name_signatures
from watchdog.core.knowledge.signatures import SignatureError, SignatureSet, load_signatures
from watchdog.core.model import Verdict, to_dict
from watchdog.core.state.window import Window
from watchdog.knowledge import Knowledge
from watchdog.outputs.emit import format_verdict

UNHEALTHY = frozenset({"hung", "stalled", "dead"})  # exit 1, as `diagnose` (commands/cli.py)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input",
        metavar="INPUT",
        help="an incident directory, a timeline.jsonl, a server log file, or - for stdin",
    )
    p.add_argument(
        "--signatures",
        action="append",
        default=[],
        metavar="FILE",
        help="operator signature file added to the built-in ones; repeatable",
    )
    p.add_argument(
        "--engines",
        action="append",
        default=[],
        metavar="FILE",
        help="operator engine profile file added to the shipped ones (its log formats are read "
        "in a plain log); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--stuck",
        action="store_true",
        help="the server is hung now: the operation a plain log ends inside (a cubin fetch, a "
        "communicator init, a JIT build) becomes the verdict",
    )


def run(args: argparse.Namespace) -> int:
    kb = _knowledge(args.signatures, getattr(args, "engines", []))
    if kb is None:
        return 2
    sigs = kb.signatures
    path = args.input
    name = "<stdin>" if path == "-" else path
    stuck = getattr(args, "stuck", False)
    try:
        if path != "-" and Path(path).is_dir():
            if stuck:
                return _stuck_misuse(name)
            return _bundle(Path(path), sigs, args.json)
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(
            f"hang-watchdog replay: cannot read {name}: {why}; give an incident directory, "
            "a timeline.jsonl, a server log or - for standard input",
            file=sys.stderr,
        )
        return 2
    if not data.strip():
        print(f"hang-watchdog replay: {name} is empty; nothing to replay", file=sys.stderr)
        return 2
    problem = not_text(data)
    if problem:
        print(f"hang-watchdog replay: {name} {problem}", file=sys.stderr)
        return 2
    if _looks_like_timeline(data):
        if stuck:
            return _stuck_misuse(name)
        # Parse the bytes already read: stdin cannot be read twice, and "-" is no path.
        from watchdog.core.state.timeline import parse_timeline

        try:
            observations = parse_timeline(data, name)
            return _timeline(observations, sigs, args.json, recorded=None, thresholds=_beside(path))
        except ValueError as exc:
            print(f"hang-watchdog replay: {exc}", file=sys.stderr)
            return 2
    from watchdog.sources.logs.parse import LogPatterns

    # A plain log is read in the formats of the shipped and the operator's engine profiles.
    patterns = LogPatterns.from_engines(kb.engines)
    return plain_log(data, sigs, args.json, stuck=stuck, patterns=patterns)


def _knowledge(signatures: list[str], engines: list[str]) -> Knowledge | None:
    """The shipped knowledge plus the operator's files; None (reported) if a file is bad."""
    from watchdog.engines.loader import EngineError, load_engines

    try:
        sigs = load_signatures(signatures)
    except SignatureError as exc:
        print(f"hang-watchdog replay: {exc}", file=sys.stderr)
        return None
    try:
        return Knowledge.of(sigs, load_engines(engines))
    except EngineError as exc:
        print(f"hang-watchdog replay: --engines: {exc}", file=sys.stderr)
        return None


def _stuck_misuse(name: str) -> int:
    print(
        f"hang-watchdog replay: --stuck applies to a plain server log; {name} is an incident "
        "bundle or timeline, whose recorded observations already hold the stall (drop --stuck)",
        file=sys.stderr,
    )
    return 2


def reclassify(observations: list[Any], sigs: SignatureSet, thresholds: Thresholds) -> Verdict:
    """Rebuild the window from recorded observations and classify it."""
    window = Window(
        span_s=float("inf"),
        max_len=max(len(observations), 1),
        ranks=sigs.ranks,
        thresholds=thresholds,
        ops=sigs.ops,
    )
    for obs in observations:
        window.append(obs)
    return classify(window, sigs, thresholds)


def _bundle(root: Path, sigs: SignatureSet, as_json: bool) -> int:
    from watchdog.core.state.timeline import read_timeline
    from watchdog.outputs.incident import load_incident

    try:
        incident = load_incident(root)
    except (OSError, ValueError) as exc:
        print(f"hang-watchdog replay: {root}: {exc}", file=sys.stderr)
        return 2
    env = incident.get("environment") or {}
    th = _thresholds(env.get("watchdog", {}).get("thresholds") if isinstance(env, dict) else None)
    try:
        observations = read_timeline(root / "timeline.jsonl")
        return _timeline(observations, sigs, as_json, incident.get("verdict"), th)
    except (OSError, ValueError) as exc:
        print(f"hang-watchdog replay: {root / 'timeline.jsonl'}: {exc}", file=sys.stderr)
        return 2


def _beside(path: str) -> Thresholds:
    """A timeline inside a bundle is replayed with the thresholds its daemon used."""
    doc = Path(path).parent / "incident.json" if path != "-" else None
    if doc is None or not doc.is_file():
        return Thresholds()
    try:
        env = json.loads(doc.read_text(encoding="utf-8")).get("environment") or {}
    except (OSError, ValueError):
        return Thresholds()
    return _thresholds(env.get("watchdog", {}).get("thresholds") if isinstance(env, dict) else None)


def _thresholds(raw: Any) -> Thresholds:
    if not isinstance(raw, dict):
        return Thresholds()
    # Each recorded number as its field's type (a count such as health_confirm stays an int).
    default = Thresholds()
    known = {
        k: type(getattr(default, k))(v)
        for k, v in raw.items()
        if k in Thresholds.__dataclass_fields__ and isinstance(v, (int, float))
    }
    return Thresholds(**known)


def _timeline(
    observations: list[Any],
    sigs: SignatureSet,
    as_json: bool,
    recorded: Any,
    thresholds: Thresholds,
) -> int:
    if not observations:
        raise ValueError("the timeline holds no observations")
    verdict = reclassify(observations, sigs, thresholds)
    changes = _changes(recorded, verdict) if isinstance(recorded, dict) else []
    if as_json:
        print(
            json.dumps(
                {"verdict": to_dict(verdict), "recorded": recorded, "changes": changes}, indent=2
            )
        )
    else:
        print(format_verdict(verdict))
        if recorded is not None:
            print(
                "compared with the recorded verdict: "
                + ("; ".join(changes) if changes else "no change")
            )
    return 1 if verdict.is_hang or verdict.state in UNHEALTHY else 0


def _changes(old: dict[str, Any], new: Verdict) -> list[str]:
    out = []
    for key in ("state", "signature"):
        if old.get(key) != getattr(new, key):
            out.append(f"{key}: {old.get(key)} -> {getattr(new, key)}")
    if abs(float(old.get("confidence") or 0) - new.confidence) > 1e-6:
        out.append(f"confidence: {old.get('confidence')} -> {new.confidence}")
    before = {e.get("detail") for e in old.get("evidence") or [] if isinstance(e, dict)}
    after = {e.detail for e in new.evidence}
    out += [f"+ evidence: {d}" for d in sorted(after - before)]
    out += [f"- evidence: {d}" for d in sorted(before - after, key=str)]
    return out


# Compressed files an operator may hand over as "the log" (magic numbers from each format's
# spec: RFC 1952 gzip, bzip2, xz, zstd RFC 8878, zip).
_COMPRESSED = {
    b"\x1f\x8b": ("gzip", "zcat"),
    b"BZh": ("bzip2", "bzcat"),
    b"\xfd7zXZ\x00": ("xz", "xzcat"),
    b"\x28\xb5\x2f\xfd": ("zstd", "zstdcat"),
    b"PK\x03\x04": ("zip", "unzip -p"),
}


def not_text(data: bytes) -> str | None:
    """Why `data` is no log, timeline or bundle (compressed or binary), or None if it is text."""
    for magic, (kind, cat) in _COMPRESSED.items():
        if data.startswith(magic):
            return (
                f"is {kind}-compressed; decompress it first: `{cat} FILE | hang-watchdog replay -`"
            )
    head = data[:65536]
    if b"\x00" in head:
        return "is binary data, not a text log; give a server log, a timeline.jsonl or an incident"
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") + sum(1 for c in text if ord(c) < 32 and c not in "\t\r\n\x1b")
    if bad > max(8, len(text) // 20):  # a few stray bytes are a log; this many are not
        return "is binary data, not a text log; give a server log, a timeline.jsonl or an incident"
    return None


def _looks_like_timeline(data: bytes) -> bool:
    first = data.lstrip()[:1]
    if first != b"{":
        return False
    try:
        obj = json.loads(io.BytesIO(data).readline())
    except ValueError:
        return False
    return isinstance(obj, dict) and "t" in obj and "wall" in obj


def plain_log(
    data: bytes, sigs: SignatureSet, as_json: bool, *, stuck: bool = False, patterns: Any = None
) -> int:
    """Name what a plain log shows: signatures, stacks it holds, and what it ended inside."""
    from watchdog.commands.replayclass import log_classes
    from watchdog.commands.replaylog import report
    from watchdog.sources.logs import scan_bytes

    scan = scan_bytes(data, sigs, patterns)
    matches = name_signatures(scan.events, sigs)
    classes = None if matches else log_classes(scan.events, data, sigs)
    return report(
        scan.records,
        scan.ops,
        matches,
        sigs,
        as_json=as_json,
        stuck=stuck,
        events=scan.events,
        classes=classes,
    )
