"""Versions in the server's Python environment, and the known-bad combinations they form.

Known-bad combinations are data (`[[known_bad]]` in watchdog/signatures.toml), shared with the
runtime classifier, so adding knowledge happens in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned

_TRUE = {"1", "true", "yes", "on"}
_FLAG = "--attention-config.use_trtllm_attention"
_GROUP = "--attention-config"


class KnownBadLike(Protocol):
    """The fields of `watchdog.signatures.KnownBad` that pre-flight reads."""

    id: str
    severity: str
    cc: tuple[str, ...]
    package: str
    versions: tuple[str, ...]
    unless_disabled: str | None
    title: str
    fixes: tuple[str, ...]
    references: tuple[str, ...]


def _bool(value: str) -> bool:
    return value.strip().lower() in _TRUE


def _trtllm_from_args(argv: Sequence[str]) -> bool | None:
    """The last `--attention-config.use_trtllm_attention` (or JSON `--attention-config`) wins."""
    found: bool | None = None
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if not eq and i + 1 < len(argv):
            value = argv[i + 1]
        if name == _FLAG and (eq or i + 1 < len(argv)):
            found = _bool(value)
        elif name == _GROUP and (eq or i + 1 < len(argv)):
            try:
                group = json.loads(value)
            except json.JSONDecodeError:
                continue
            if isinstance(group, dict) and group.get("use_trtllm_attention") is not None:
                found = bool(group["use_trtllm_attention"])
    return found


def trtllm_setting(argv: Sequence[str], environ: Mapping[str, str]) -> bool | None:
    """Whether the server forces TRTLLM attention on (True), off (False) or auto-detects (None).

    Uses `watchdog.sources.facts.trtllm_setting` when present (one parser for the whole tool);
    otherwise this small parser: `--attention-config.use_trtllm_attention=0|1` (vLLM PR #26315)
    beats the legacy env `VLLM_USE_TRTLLM_ATTENTION` (unset: auto; "1"/"true": on; else off).
    """
    try:
        from watchdog.sources.facts import trtllm_setting as shared
    except ImportError:
        shared = None
    if shared is not None:
        return shared(argv, environ)
    from_args = _trtllm_from_args(argv)
    if from_args is not None:
        return from_args
    legacy = environ.get("VLLM_USE_TRTLLM_ATTENTION")
    return None if legacy is None else _bool(legacy)


def check_versions(
    versions: Mapping[str, str | None] | None, error: str | None, python: str | None
) -> CheckResult:
    """The server environment's vLLM, FlashInfer, flashinfer-cubin, jit-cache and torch."""
    if versions is None:
        return failed(
            "versions",
            f"could not read package versions: {error}",
            ["pass --python with the server's interpreter, e.g. --python /opt/vllm/bin/python"],
        )
    shown = ", ".join(f"{k} {v or '-'}" for k, v in versions.items())
    details = {"python": python, "packages": dict(versions)}
    if not versions.get("vllm"):
        return warned(
            "versions",
            f"vLLM is not installed in {python}: {shown}",
            ["pass --python with the interpreter that runs `vllm serve`"],
            **details,
        )
    return passed("versions", f"{python}: {shown}", **details)


def check_known_bad(
    entries: Sequence[KnownBadLike],
    versions: Mapping[str, str | None] | None,
    inv: GpuInventory,
    trtllm: bool | None,
) -> list[CheckResult]:
    """One result per known-bad entry whose package version matches; one PASS if none do."""
    if versions is None:
        return [skipped("known_bad", "package versions unknown")]
    results = []
    for kb in entries:
        version = versions.get(kb.package)
        if version is None or version not in kb.versions:
            continue
        results.append(_judge(kb, version, inv, trtllm))
    if not results:
        return [passed("known_bad", f"none of {len(entries)} known-bad combinations applies")]
    return results


def _judge(kb: KnownBadLike, version: str, inv: GpuInventory, trtllm: bool | None) -> CheckResult:
    """Decide one version-matched entry against the GPUs and the server's settings."""
    cid = f"known_bad:{kb.id}"
    details = {"package": kb.package, "version": version, "references": list(kb.references)}
    if inv.gpus is not None and not set(kb.cc) & set(inv.ccs):
        return passed(cid, f"{kb.package} {version} is only bad on CC {', '.join(kb.cc)}")
    if kb.unless_disabled == "trtllm_attention" and trtllm is False:
        return passed(cid, f"{kb.title}: avoided, TRTLLM attention is disabled", **details)
    reason = kb.title + f" ({kb.package} {version}"
    if inv.gpus is None:
        reason += f"; GPUs unknown, cannot rule out CC {', '.join(kb.cc)}"
    if kb.unless_disabled == "trtllm_attention":
        reason += "; TRTLLM attention " + ("forced on" if trtllm else "auto-detected (on)")
    reason += ")"
    if kb.severity == "fail" and inv.gpus is not None:
        return failed(cid, reason, kb.fixes, **details)
    return warned(cid, reason, kb.fixes, **details)
