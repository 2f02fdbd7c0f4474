"""Versions in the server's Python environment, and the known-bad combinations they form.

Known-bad combinations are data (`[[known_bad]]` in watchdog/core/knowledge/signatures.toml),
shared with the runtime classifier, so adding knowledge happens in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from watchdog.core.knowledge.sigmodel import KnownBad
from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned

# The fields of `watchdog.core.knowledge.signatures.KnownBad` pre-flight reads: the type itself.
KnownBadLike = KnownBad


def check_versions(
    versions: Mapping[str, str | None] | None,
    error: str | None,
    python: str | None,
    *,
    package: str = "vllm",
    title: str = "vLLM",
) -> CheckResult:
    """The server environment's engine, FlashInfer, flashinfer-cubin, jit-cache and torch."""
    if versions is None:
        return failed(
            "versions",
            f"could not read package versions: {error}",
            ["pass --python with the server's interpreter, e.g. --python /opt/vllm/bin/python"],
        )
    shown = ", ".join(f"{k} {v or '-'}" for k, v in versions.items())
    details = {"python": python, "packages": dict(versions)}
    if not versions.get(package):
        return warned(
            "versions",
            f"{title} is not installed in {python}: {shown}",
            [f"pass --python with the interpreter that runs the {title} server"],
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
    # An entry without `cc` applies on every GPU (e.g. an NCCL version bad on any of them).
    if kb.cc and inv.gpus is not None and not set(kb.cc) & set(inv.ccs):
        return passed(cid, f"{kb.package} {version} is only bad on CC {', '.join(kb.cc)}")
    if kb.unless_disabled == "trtllm_attention" and trtllm is False:
        return passed(cid, f"{kb.title}: avoided, TRTLLM attention is disabled", **details)
    reason = kb.title + f" ({kb.package} {version}"
    if inv.gpus is None and kb.cc:
        reason += f"; GPUs unknown, cannot rule out CC {', '.join(kb.cc)}"
    if kb.unless_disabled == "trtllm_attention":
        reason += "; TRTLLM attention " + ("forced on" if trtllm else "auto-detected (on)")
    reason += ")"
    if kb.severity == "fail" and inv.gpus is not None:
        return failed(cid, reason, kb.fixes, **details)
    return warned(cid, reason, kb.fixes, **details)
