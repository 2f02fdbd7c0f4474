"""Runs every pre-flight check in order and returns their results; collaborators are parameters.

Facts are gathered once (GPUs, package versions, settings), then each check is a pure-ish
function of those facts plus its own deadline-bound probe.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from watchdog.core.knowledge.tomlcheck import SignatureError
from watchdog.engines.loader import EngineError
from watchdog.engines.profile import EngineProfile
from watchdog.knowledge import Knowledge, load_knowledge
from watchdog.preflight import (
    checks_cubins,
    checks_engine,
    checks_fabric,
    checks_toolchain,
    checks_versions,
    checks_watchdog,
)
from watchdog.preflight.checks_gpu import GpuInventory, check_gpus, collect_gpus
from watchdog.preflight.checks_versions import KnownBadLike
from watchdog.preflight.report import CheckResult, failed
from watchdog.sources.facts import trtllm_attention
from watchdog.sources.gpu.backend import GpuBackend
from watchdog.sources.pyenv import COMMON, PyEnvError, package_versions


@dataclass(frozen=True)
class PreflightOptions:
    """Everything a pre-flight run reads from the host; tests point the paths at temp dirs."""

    environ: Mapping[str, str]
    python: str | None = None
    server_args: tuple[str, ...] = ()
    cdn_url: str | None = None
    timeout_s: float = 3.0
    incident_dir: Path | None = None
    gpu_source: str = "nvml"
    cuda_default: Path = checks_toolchain.DEFAULT_CUDA_ROOT
    systemd_root: Path = Path("/run/systemd/system")
    proc_root: Path = Path("/proc")
    shm: Path = Path("/dev/shm")
    # The py-spy the watchdog is configured with (its `pyspy` key); None: the watchdog's own
    # lookup, beside this Python and then on PATH.
    pyspy: str | None = None
    disk_usage: checks_watchdog.DiskUsage = shutil.disk_usage
    engine: str = "vllm"  # the engine profile whose server arguments and packages are checked


def resolve_python(opts: PreflightOptions) -> str | None:
    """--python, else `python` (then `python3`) on the PATH the server would see."""
    if opts.python:
        return opts.python
    path = opts.environ.get("PATH", "")
    return shutil.which("python", path=path) or shutil.which("python3", path=path)


def load_shipped() -> tuple[Knowledge | None, str | None]:
    """The shipped knowledge (the same files the runtime classifier reads), or why it could
    not be read: pre-flight reports that as a failed check instead of stopping."""
    try:
        return load_knowledge(), None
    except (SignatureError, EngineError, OSError) as e:
        return None, str(e)


def read_versions(
    opts: PreflightOptions,
    python: str | None,
    extra: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> tuple[dict[str, str | None] | None, str | None]:
    """Package versions in the server's environment, or why they could not be read. `extra`
    names more distributions (those known-bad entries name, e.g. nvidia-nccl-cu12); `modules`
    the engines' import packages (Knowledge.modules), for a renamed distribution."""
    if python is None:
        return None, "no `python` on PATH"
    names = tuple(dict.fromkeys([*COMMON, *extra]))
    try:
        return package_versions(
            python, env=opts.environ, packages=names, timeout_s=opts.timeout_s, modules=modules
        ), None
    except PyEnvError as e:
        return None, str(e)


def run_checks(
    opts: PreflightOptions,
    backend: GpuBackend | None,
    knowledge: Knowledge | None,
    knowledge_error: str | None = None,
) -> list[CheckResult]:
    """Run all checks with `knowledge` (None: it could not be read, `knowledge_error` says
    why, and the checks that need it report that); never raises for anything the host does."""
    inv: GpuInventory = collect_gpus(backend, opts.timeout_s, opts.gpu_source)
    python = resolve_python(opts)
    profile = _profile(opts.engine, knowledge)
    package, title = (profile.version_package, profile.title) if profile else ("vllm", "vLLM")
    known_bad: Sequence[KnownBadLike] = knowledge.signatures.known_bad if knowledge else ()
    kerr = knowledge_error if knowledge is None else None
    modules = knowledge.modules if knowledge is not None else ()
    # The version report shows the engine's own distributions (its profile's) with FlashInfer's
    # and torch's; known-bad entries see every one read.
    shown = (*(profile.distributions if profile else (package,)), *COMMON)
    extra = [*shown, *(kb.package for kb in known_bad)]
    all_versions, verr = read_versions(opts, python, extra, modules)
    versions = None if all_versions is None else {k: all_versions.get(k) for k in shown}
    results = [
        check_gpus(inv),
        checks_versions.check_versions(versions, verr, python, package=package, title=title),
    ]
    if kerr:
        results.append(failed("known_bad", f"signature data: {kerr}", ["fix the file"]))
    if profile is not None and profile.attention_flags:
        trtllm = profile.trtllm_attention(opts.server_args)
        attention = checks_engine.check_attention_path(
            profile, opts.server_args, inv, versions, knowledge.published if knowledge else None
        )
        results += [attention] if attention is not None else []
    else:
        trtllm = trtllm_attention(opts.server_args, opts.environ)
    results += checks_versions.check_known_bad(known_bad, all_versions, inv, trtllm)
    results += _toolchain(opts, inv, versions)
    results += _cubins(opts, versions, inv, knowledge)
    results += [
        checks_fabric.check_fabric(inv),
        checks_fabric.check_fabric_manager(inv, opts.environ, opts.systemd_root, opts.timeout_s),
    ]
    results += _watchdog(opts, inv, versions)
    return results


def _profile(name: str, knowledge: Knowledge | None) -> EngineProfile | None:
    """The shipped profile named `name` (None for vLLM's built-in checks)."""
    if name == "vllm" or knowledge is None:
        return None
    return knowledge.engines.get(name)


def _toolchain(
    opts: PreflightOptions, inv: GpuInventory, versions: Mapping[str, str | None] | None
) -> list[CheckResult]:
    env = opts.environ
    return [
        checks_toolchain.check_nvcc(inv, versions, env, opts.cuda_default, opts.timeout_s),
        checks_toolchain.check_ninja(versions, env),
        checks_toolchain.check_arch_lists(inv, versions, env),
    ]


def _cubins(
    opts: PreflightOptions,
    versions: Mapping[str, str | None] | None,
    inv: GpuInventory,
    knowledge: Knowledge | None,
) -> list[CheckResult]:
    """flashinfer-python vs flashinfer-cubin vs flashinfer-jit-cache, the local cubin store for
    the GPUs' SM, and the download path; fixes name only releases that were published."""
    pub = knowledge.published if knowledge is not None else None
    env, timeout = opts.environ, opts.timeout_s
    return [
        checks_cubins.check_cubin_package(versions, env, pub),
        checks_cubins.check_jit_cache_package(versions, pub),
        checks_cubins.check_cubin_store(versions, env, inv, pub),
        checks_cubins.check_cubin_download(versions, env, opts.cdn_url, timeout, pub),
    ]


def _watchdog(
    opts: PreflightOptions, inv: GpuInventory, versions: Mapping[str, str | None] | None
) -> list[CheckResult]:
    downloads = checks_cubins.downloads_needed(versions)
    timeout, usage = opts.timeout_s, opts.disk_usage
    return [
        checks_watchdog.check_pyspy(timeout, opts.pyspy),
        checks_watchdog.check_ptrace(opts.proc_root),
        checks_watchdog.check_incident_space(opts.incident_dir, timeout, usage),
        checks_watchdog.check_cache_space(opts.environ, downloads, timeout, usage),
        checks_watchdog.check_shm(inv, opts.shm, timeout, usage),
    ]
