"""Incident bundles: everything an on-call engineer needs, in one directory, before any restart.

A bundle is built in `root/.tmp-XXXX` and renamed into place, so a half-written bundle is never
visible under its final name. Every string that reaches disk goes through `watchdog.core.redact`.
Retention is bounded by count and bytes, oldest first.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from watchdog import __version__
from watchdog.core.model import GpuSample, Observation, Verdict, to_dict
from watchdog.core.redact import redact_argv, redact_text, redact_tree, relevant_environ
from watchdog.core.state.capture import CaptureResult
from watchdog.core.state.timeline import write_timeline
from watchdog.outputs.summary import render_summary

log = logging.getLogger("hang_watchdog.incident")
# Shown whatever the engine (with the spellings older timelines used).
VERSION_KEYS = {
    "flashinfer-python": ("flashinfer-python", "flashinfer_python", "flashinfer"),
    "flashinfer-cubin": ("flashinfer-cubin", "flashinfer_cubin"),
    "torch": ("torch",),
}
_NAME_RE = re.compile(r"^\d{8}T\d{6}Z-")
FILE_MODE, DIR_MODE = 0o640, 0o750
STALE_TMP_S = 3600.0


@dataclass
class Incident:
    """One hang episode as the daemon saw it, ready to be written as a bundle."""

    verdict: Verdict
    observations: Sequence[Observation]
    capture: CaptureResult | None
    log_tail: Sequence[str]
    environment: dict[str, Any]
    started_wall: float
    remediation: dict[str, Any] | None = None


def build_environment(
    *,
    target_pid: int | None,
    gpus: Sequence[GpuSample],
    facts: Mapping[str, Any],
    driver: str | None,
    engine_packages: Sequence[str],
    proc_root: str = "/proc",
) -> dict[str, Any]:
    """GPU names and capabilities, driver, package versions, the server's command line and
    relevant environment variables (redacted), for the bundle. `engine_packages`: the engine
    profiles' own distributions, shown when the server has one installed."""
    merged: dict[str, Any] = dict(facts)
    if isinstance(facts.get("versions"), Mapping):
        merged.update(facts["versions"])
    engine = merged.get("engine") if isinstance(merged.get("engine"), str) else None
    env: dict[str, Any] = {
        "gpus": [{"index": g.index, "name": g.name, "cc": g.cc, "uuid": g.uuid} for g in gpus],
        "driver": driver,
        "engine": {"name": engine, "version": merged.get("engine_version")} if engine else None,
        "versions": _versions(merged, engine_packages),
        "facts": redact_tree(dict(facts)),
        "target_pid": target_pid,
        "cmdline": None,
        "env": {},
        "errors": [],
    }
    if target_pid is not None:
        _read_target(env, f"{proc_root}/{target_pid}", facts)
    return env


def _versions(merged: Mapping[str, Any], engine_packages: Sequence[str]) -> dict[str, Any]:
    """The engine's distributions that are installed, then FlashInfer's and torch's."""
    names = (*engine_packages, merged.get("engine_package"))  # an operator profile's too
    found = {k: merged[k] for k in names if isinstance(k, str) and isinstance(merged.get(k), str)}
    common = {
        key: next((merged[a] for a in aliases if merged.get(a) is not None), None)
        for key, aliases in VERSION_KEYS.items()
    }
    return {**found, **common}


def _read_target(env: dict[str, Any], base: str, facts: Mapping[str, Any]) -> None:
    """The server's command line and environment now, else as the facts source read them
    while it ran (a dead server's /proc entry is gone; a retitled one's environ is fragments)."""
    kept_cmd = [str(a) for a in facts.get("cmdline") or []]
    kept_env = dict(facts.get("server_env") or {})
    if not Path(base).exists():
        env["cmdline"] = redact_argv(kept_cmd) or None
        env["env"] = kept_env
        env["errors"].append(
            f"{base} is gone: the server exited; command line and environment as read while it ran"
        )
        return
    try:
        raw = Path(base, "cmdline").read_bytes()
        env["cmdline"] = redact_argv(_split_nul(raw) or kept_cmd)
    except OSError as e:
        env["cmdline"] = redact_argv(kept_cmd) or None
        env["errors"].append(f"could not read {base}/cmdline: {e.strerror or e}")
    try:
        pairs = (item.partition("=") for item in _split_nul(Path(base, "environ").read_bytes()))
        now = relevant_environ({k: v for k, _, v in pairs if k})
        env["env"] = now if len(now) >= len(kept_env) else kept_env
    except OSError as e:
        env["env"] = kept_env
        if not kept_env:
            env["errors"].append(
                f"could not read {base}/environ: {e.strerror or e} (needs the same user or root)"
            )


def _split_nul(raw: bytes) -> list[str]:
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


class IncidentWriter:
    """Writes bundles atomically under `root` and keeps at most max_incidents / max_bytes."""

    SCHEMA_VERSION = 1

    def __init__(
        self,
        root: Path,
        *,
        max_incidents: int = 50,
        max_bytes: int = 512 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.max_incidents = max_incidents
        self.max_bytes = max_bytes
        self._clock = clock
        if self.root.is_dir():  # a writer killed mid-bundle (SIGKILL, power) left its build dir
            self._remove_stale_tmp()

    def write(self, incident: Incident) -> Path:
        """Write `incident` as a new bundle directory and return its final path.

        Retention runs first (room for the new bundle), and a full disk costs the oldest
        bundle, once, before the error is raised: the newest evidence matters most.
        """
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        self._enforce_retention(keep=None, room_for=1)
        try:
            return self._write(incident)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._drop_oldest():
                raise
        return self._write(incident)

    def _write(self, incident: Incident) -> Path:
        now = self._clock()
        # The writer's pid in the name: a build dir whose writer is gone is removed at once.
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=self.root))
        try:
            os.chmod(tmp, DIR_MODE)
            doc = self._document(incident, now)
            self._fill(tmp, incident, doc)
            final = self._final_name(now, incident.verdict)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._enforce_retention(keep=final)
        return final

    def update_remediation(self, path: Path, remediation: dict[str, Any]) -> None:
        """Record what remediation did in an existing bundle (incident.json and summary.md)."""
        doc = load_incident(path)
        doc["remediation"] = redact_tree(remediation)
        _write_file(Path(path) / "incident.json", _json(doc), atomic=True)
        _write_file(Path(path) / "summary.md", render_summary(doc), atomic=True)

    def update_outcome(self, path: Path, outcome: str, detail: str) -> None:
        """Record how the episode of an existing bundle ended (incident.json and summary.md)."""
        doc = load_incident(path)
        doc["outcome"] = {"outcome": outcome, "detail": detail}
        _write_file(Path(path) / "incident.json", _json(doc), atomic=True)
        _write_file(Path(path) / "summary.md", render_summary(doc), atomic=True)

    def _document(self, incident: Incident, now: float) -> dict[str, Any]:
        verdict = to_dict(incident.verdict)
        return redact_tree(
            {
                "schema_version": self.SCHEMA_VERSION,
                "generator": f"hang-watchdog {__version__}",
                "created": _iso(now),
                "created_wall": now,
                "started": _iso(incident.started_wall),
                "started_wall": incident.started_wall,
                "verdict": verdict,
                "evidence": verdict["evidence"],
                "timeline": _timeline_summary(incident.observations),
                "environment": incident.environment,
                "capture": _capture_summary(incident.capture),
                "remediation": incident.remediation,
                "log_tail_file": "log-tail.txt",
                "log_tail_lines": len(incident.log_tail),
            }
        )

    def _fill(self, tmp: Path, incident: Incident, doc: dict[str, Any]) -> None:
        write_timeline(tmp / "timeline.jsonl", incident.observations)
        os.chmod(tmp / "timeline.jsonl", FILE_MODE)
        tail = "".join(redact_text(line.rstrip("\n")) + "\n" for line in incident.log_tail)
        _write_file(tmp / "log-tail.txt", tail)
        if incident.capture is not None:
            _write_stacks(tmp / "stacks", incident.capture)
        _write_file(tmp / "summary.md", render_summary(doc))
        _write_file(tmp / "incident.json", _json(doc))

    def _final_name(self, now: float, verdict: Verdict) -> Path:
        stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        label = re.sub(r"[^a-z0-9_]+", "_", (verdict.signature or verdict.state).lower())
        final, n = self.root / f"{stamp}-{label}", 1
        while final.exists():
            n += 1
            final = self.root / f"{stamp}-{label}-{n}"
        return final

    def _bundles(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if p.is_dir() and _NAME_RE.match(p.name))

    def _drop_oldest(self) -> bool:
        """Remove the oldest bundle to make room on a full disk; False when there is none."""
        with contextlib.suppress(OSError):
            bundles = self._bundles()
            if bundles:
                shutil.rmtree(bundles[0], ignore_errors=True)
                log.warning("incident disk full: removed the oldest bundle %s", bundles[0].name)
                return True
        return False

    def _enforce_retention(self, keep: Path | None, room_for: int = 0) -> None:
        """Drop the oldest bundles until count and bytes fit; `keep` (the newest) always stays."""
        bundles = self._bundles()
        sizes = {p: _tree_bytes(p) for p in bundles}
        total = sum(sizes.values())
        for old in list(bundles):
            if old == keep:
                continue
            if len(bundles) + room_for <= self.max_incidents and total <= self.max_bytes:
                break
            shutil.rmtree(old, ignore_errors=True)
            bundles.remove(old)
            total -= sizes[old]
            log.info("incident retention removed %s", old.name)
        self._remove_stale_tmp()

    def _remove_stale_tmp(self) -> None:
        """Delete build directories a crashed writer left behind: at once when the pid in
        the name is gone, else (a reused pid, an older name) after STALE_TMP_S."""
        for p in self.root.glob(".tmp-*"):
            with contextlib.suppress(OSError):
                if not _writer_alive(p.name) or self._clock() - p.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(p, ignore_errors=True)


def _writer_alive(name: str) -> bool:
    """Is the writer of build dir `.tmp-PID-XXXX` still running (True when no pid is named)?"""
    pid = name.split("-")[1] if name.count("-") >= 2 else ""
    if not pid.isdigit() or int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def load_incident(path: Path) -> dict[str, Any]:
    """Read a bundle's incident.json (path to the bundle or the file); ValueError if unusable."""
    path = Path(path)
    file = path / "incident.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{file}: cannot read ({e.strerror or e}); pass an incident bundle") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e}); is this an incident bundle?") from e
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise ValueError(f"{file}: no schema_version; not an incident.json from hang-watchdog")
    version = doc["schema_version"]
    if version != IncidentWriter.SCHEMA_VERSION:
        raise ValueError(
            f"{file}: schema_version {version!r} is not supported (this hang-watchdog reads "
            f"{IncidentWriter.SCHEMA_VERSION}); use the hang-watchdog version that wrote it"
        )
    for key, kind in (("verdict", dict), ("environment", dict), ("capture", dict)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"{file}: field {key!r} is missing or not a {kind.__name__}")
    return doc


def _timeline_summary(observations: Sequence[Observation]) -> dict[str, Any]:
    walls = [o.wall for o in observations]
    down = sorted({name for o in observations for name, up in o.sources.items() if not up})
    return {
        "file": "timeline.jsonl",
        "observations": len(observations),
        "first": _iso(walls[0]) if walls else None,
        "last": _iso(walls[-1]) if walls else None,
        "duration_s": round(walls[-1] - walls[0], 3) if walls else 0.0,
        "sources_down": down,
    }


def _capture_summary(capture: CaptureResult | None) -> dict[str, Any]:
    if capture is None:
        return {"result": "not_taken", "reason": "no stack capture for this incident", "pids": []}
    pids = [
        {
            "pid": s.pid,
            "title": s.title,
            "threads": len(s.threads),
            "unchanged_threads": sum(t.unchanged for t in s.threads),
            "error": s.error,
            "fix": s.fix,
            "files": [f"stacks/{s.pid}{ext}" for ext in _stack_exts(capture, s.pid)],
        }
        for s in capture.samples
    ]
    return {"result": capture.result, "reason": capture.reason, "pids": pids}


def _stack_exts(capture: CaptureResult, pid: int) -> list[str]:
    have = (
        (".txt", capture.raw_text),
        (".json", capture.raw_json),
        (".second.txt", capture.second_text),
    )
    return [ext for ext, table in have if pid in table]


def _write_stacks(folder: Path, capture: CaptureResult) -> None:
    folder.mkdir(mode=DIR_MODE)
    os.chmod(folder, DIR_MODE)
    for pid, text in capture.raw_text.items():
        _write_file(folder / f"{pid}.txt", redact_text(text))
    for pid, data in capture.raw_json.items():
        _write_file(folder / f"{pid}.json", _json(redact_tree(data)))
    for pid, text in capture.second_text.items():
        _write_file(folder / f"{pid}.second.txt", redact_text(text))


def _write_file(path: Path, text: str, *, atomic: bool = False) -> None:
    """Create `path` with mode 0640 whatever the umask; atomic replaces via a sibling file."""
    target = path.with_name(f".{path.name}.new") if atomic else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), FILE_MODE)
        f.write(text)
    if atomic:
        os.replace(target, path)


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="seconds")


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
