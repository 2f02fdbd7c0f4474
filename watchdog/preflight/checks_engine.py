"""What is engine-specific before a start, read through the engine profile: is the engine
installed, and will its attention backend take FlashInfer's TRTLLM-gen path (cubins fetched
from the kernel CDN at first use)?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from watchdog.core.knowledge.published import Published
from watchdog.engines.profile import EngineProfile
from watchdog.preflight.checks_cubins import cubin_fixes
from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, passed, warned


def check_attention_path(
    profile: EngineProfile,
    server_args: Sequence[str],
    inv: GpuInventory,
    versions: Mapping[str, str | None] | None,
    published: Published | None = None,
) -> CheckResult | None:
    """The attention backend the server would run and whether it needs TRTLLM-gen cubins."""
    if not profile.attention_flags:
        return None
    forced = profile.trtllm_attention(server_args)
    flags = "/".join(profile.attention_flags[:1])
    on_default = [cc for cc in inv.ccs if cc in profile.trtllm_default_cc]
    trtllm = forced if forced is not None else bool(on_default)
    why = (
        f"{flags} given: {'a TRTLLM-gen backend' if forced else 'not TRTLLM-gen'}"
        if forced is not None
        else (
            f"no {flags}: {profile.title} picks TRTLLM-gen on compute capability "
            f"{', '.join(on_default)}"
            if on_default
            else f"no {flags}: {profile.title} picks another backend on this GPU"
        )
    )
    cubin = (versions or {}).get("flashinfer-cubin")
    details = {"engine": profile.name, "trtllm_attention": trtllm, "flashinfer_cubin": cubin}
    if not trtllm:
        return passed("engine_attention", f"{why}; no TRTLLM-gen cubins are fetched", **details)
    if cubin:
        return passed(
            "engine_attention",
            f"{why}; its cubins come from flashinfer-cubin {cubin} (no download)",
            **details,
        )
    spelling = profile.fallbacks.get("disable_trtllm_attention")
    avoid = " ".join(spelling.args) if spelling is not None else ""
    fi = (versions or {}).get("flashinfer-python")
    fixes = (
        cubin_fixes(fi, published)[:-1]
        if fi
        else ["install flashinfer-cubin of FlashInfer's version"]
    )
    if avoid:
        fixes.append(f"or start with {avoid}")
    return warned(
        "engine_attention",
        f"{why}; FlashInfer will fetch TRTLLM-gen cubins from the kernel CDN at the first "
        "batch (a stall there hangs the server; see the cubin checks)",
        fixes,
        **details,
    )
