"""FlashInfer cubins: shipped by flashinfer-cubin, or downloaded at run time from the kernel CDN.

A download that cannot complete costs minutes of retries per file after the weights are loaded
(flashinfer-ai/flashinfer flashinfer/jit/cubin_loader.py download_file, v0.6.7: 4 attempts, a
10 s timeout each, 5/10/20 s backoff). The
CDN is contacted only here, only with a HEAD, only under a hard deadline (DNS included).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from watchdog.core.knowledge.published import Published, public, version_key
from watchdog.preflight.checks_gpu import GpuInventory
from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned
from watchdog.sources.deadline import DeadlineExceeded, call_with_deadline

# flashinfer-ai/flashinfer flashinfer/jit/cubin_loader.py, identical v0.6.7 .. v0.6.18rc7.
DEFAULT_CUBINS_REPOSITORY = (
    "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
)
_OFF = {"", "0", "false", "no", "off"}
_AIRGAP_FIXES = (
    "run `flashinfer download-cubin` (the server's FlashInfer version) with FLASHINFER_CUBIN_DIR "
    "set on a host that reaches the CDN, copy that directory over and set FLASHINFER_CUBIN_DIR "
    "to it in the server's environment",
)
# Where pre-fetched cubins go: FlashInfer reads FLASHINFER_CUBIN_DIR first and downloads into it
# (flashinfer/jit/env.py _get_cubin_dir and cubin_loader.py get_cubin, v0.2.14 .. v0.7.4).
PREFETCH_DIR = "/srv/flashinfer-cubins"
# `flashinfer download-cubin` is a console script from v0.4.0 (pyproject [project.scripts]);
# v0.3.1 had the command only as `python -m flashinfer download-cubin` (flashinfer/__main__.py).
_DOWNLOAD_CLI = (
    ("0.4.0", "flashinfer download-cubin"),
    ("0.3.1", "python -m flashinfer download-cubin"),
)
# `flashinfer install-jit-cache-wheel` picks the wheel for FlashInfer's version and the CUDA
# label from FlashInfer's own index (flashinfer/__main__.py, from v0.6.17).
_JIT_CACHE_CLI_SINCE = "0.6.17"
# GPUs whose attention runs FlashInfer's TRTLLM-gen cubins (fmhaSm100*, *_sm100f, fmhaSm103a*):
# datacenter Blackwell. The store holds them under <hash>/fmha/trtllm-gen/ and friends.
_CUBIN_SMS = {"10.0": ("sm100",), "10.3": ("sm103", "sm100f")}
_MAX_STORE_FILES = 200_000  # a bound on the walk of the store; a real one holds thousands


def cubin_fixes(fi: str, published: Published | None) -> list[str]:
    """How to get cubins for FlashInfer `fi` on a host without the CDN, as commands that work:
    the matching flashinfer-cubin when one was published, else a pre-fetch (or the fallback)."""
    pub = published or Published()
    have = pub.has("flashinfer-cubin", fi)
    pkg = pub.package("flashinfer-cubin")
    if have is not False:  # published, or no record to say otherwise
        lines = [f'pip install "flashinfer-cubin=={public(fi)}"', "or pre-fetch the cubins:"]
    else:
        newest = pkg.newest if pkg is not None else None
        lines = [
            f"no flashinfer-cubin {public(fi)} was published (newest {newest}, recorded "
            f"{pub.recorded}): pre-fetch the cubins instead"
        ]
    cli = next((c for since, c in _DOWNLOAD_CLI if version_key(fi) >= version_key(since)), None)
    if cli is not None:
        lines += [
            f"on a host that reaches the CDN, with flashinfer-python {fi}: "
            f"`FLASHINFER_CUBIN_DIR={PREFETCH_DIR} {cli}`",
            f"copy {PREFETCH_DIR} to the server and set `export FLASHINFER_CUBIN_DIR="
            f"{PREFETCH_DIR}` in its environment",
        ]
    else:
        lines.append(f"FlashInfer {fi} has no download-cubin command: upgrade flashinfer-python")
    lines.append("or restart with TRTLLM attention disabled (the fallback)")
    return lines


def jit_cache_fixes(fi: str) -> list[str]:
    """How to install the flashinfer-jit-cache matching FlashInfer `fi` (not on PyPI)."""
    if version_key(fi) >= version_key(_JIT_CACHE_CLI_SINCE):
        return [
            "`flashinfer install-jit-cache-wheel`",
            "or `pip uninstall -y flashinfer-jit-cache`",
        ]
    return [
        f'`pip install "flashinfer-jit-cache=={public(fi)}+cu129" --extra-index-url '
        "https://flashinfer.ai/whl/cu129` (cu129: the CUDA of the server's torch, e.g. cu128)",
        "or `pip uninstall -y flashinfer-jit-cache`",
    ]


def downloads_needed(versions: Mapping[str, str | None] | None) -> bool | None:
    """Cubins come from the CDN unless flashinfer-cubin matches FlashInfer exactly."""
    if versions is None:
        return None
    fi = versions.get("flashinfer-python")
    return bool(fi) and versions.get("flashinfer-cubin") != fi


def check_cubin_package(
    versions: Mapping[str, str | None] | None,
    environ: Mapping[str, str],
    published: Published | None = None,
) -> CheckResult:
    """flashinfer-cubin installed with exactly FlashInfer's version (else FlashInfer refuses)."""
    if versions is None:
        return skipped("cubin_package", "package versions unknown")
    fi, cubin = versions.get("flashinfer-python"), versions.get("flashinfer-cubin")
    if not fi:
        return skipped("cubin_package", "FlashInfer is not installed")
    if cubin == fi:
        return passed("cubin_package", f"flashinfer-cubin {cubin} matches FlashInfer")
    if cubin is None:
        return warned(
            "cubin_package",
            f"flashinfer-cubin is not installed: FlashInfer {fi} downloads cubins at run time",
            cubin_fixes(fi, published),
        )
    # FlashInfer raises "flashinfer-cubin version (...) does not match flashinfer version (...)"
    # unless FLASHINFER_DISABLE_VERSION_CHECK is set (flashinfer/jit/env.py).
    fix = [*cubin_fixes(fi, published), "or `pip uninstall -y flashinfer-cubin`"]
    reason = f"flashinfer-cubin {cubin} does not match FlashInfer {fi}"
    if environ.get("FLASHINFER_DISABLE_VERSION_CHECK", "").lower() not in _OFF:
        return warned("cubin_package", reason + " (version check disabled)", fix)
    return failed("cubin_package", reason + "; FlashInfer will refuse to start", fix)


def check_cubin_download(
    versions: Mapping[str, str | None] | None,
    environ: Mapping[str, str],
    cdn_url: str | None,
    timeout_s: float,
    published: Published | None = None,
) -> CheckResult:
    """When downloads would happen: allowed, and the repository (URL or local path) answers."""
    needed = downloads_needed(versions)
    fi = (versions or {}).get("flashinfer-python")
    fixes = cubin_fixes(fi, published) if fi else list(_AIRGAP_FIXES)
    if needed is None:
        return skipped("cubin_download", "package versions unknown")
    if not needed:
        why = (
            "FlashInfer is not installed"
            if not (versions or {}).get("flashinfer-python")
            else ("flashinfer-cubin provides the cubins")
        )
        return skipped("cubin_download", f"no downloads: {why}")
    if environ.get("FLASHINFER_NO_DOWNLOAD", "").lower() not in _OFF:
        # >= 0.6.7.post1: get_artifact raises "Artifact not found locally ... FLASHINFER_NO_DOWNLOAD
        # is set - refusing to download" (flashinfer/jit/cubin_loader.py, v0.6.7.post1). v0.6.7
        # ignores the variable.
        return failed(
            "cubin_download",
            "FLASHINFER_NO_DOWNLOAD is set but flashinfer-cubin does not provide the cubins",
            fixes,
        )
    repo = cdn_url or environ.get("FLASHINFER_CUBINS_REPOSITORY") or DEFAULT_CUBINS_REPOSITORY
    if urlsplit(repo).scheme not in ("http", "https"):
        return _check_local(repo)
    return probe_cdn(repo, timeout_s, fixes=fixes)


def _check_local(repo: str) -> CheckResult:
    """A local repository path: download_file copies when os.path.exists(source)."""
    if Path(repo).is_dir():
        return passed("cubin_download", f"cubins are copied from the local repository {repo}")
    return failed(
        "cubin_download",
        f"FLASHINFER_CUBINS_REPOSITORY {repo!r} is not an http(s) URL nor an existing directory",
        ["set FLASHINFER_CUBINS_REPOSITORY to the directory holding the downloaded cubins"],
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_cdn(
    url: str,
    timeout_s: float,
    client: httpx.Client | None = None,
    fixes: list[str] | tuple[str, ...] = _AIRGAP_FIXES,
) -> CheckResult:
    """HEAD the repository under a hard deadline; unreachable means runtime downloads would hang.

    httpx's timeout covers connect, read and write but not the DNS lookup, which blocks in
    getaddrinfo (a resolver that never answers holds it for minutes), so the whole request runs
    under `call_with_deadline`. `client` is the seam for tests (a transport that blocks).
    """
    host = urlsplit(url).hostname or ""

    def head() -> httpx.Response:
        if client is not None:
            return client.head(url)
        # Proxies from the environment apply to the real CDN, never to a loopback stand-in.
        # The worker closes its own client, so an abandoned request never blocks the caller.
        with httpx.Client(timeout=timeout_s, trust_env=not _is_loopback(host)) as own:
            return own.head(url)

    try:
        response = call_with_deadline(head, timeout_s, name="preflight-cdn")
    except (httpx.TimeoutException, DeadlineExceeded):
        return failed(
            "cubin_download",
            f"the cubin repository {url} did not answer within {timeout_s:g} s",
            fixes,
        )
    except httpx.HTTPError as e:
        return failed(
            "cubin_download",
            f"cannot reach the cubin repository {url}: {type(e).__name__}: {e}",
            fixes,
        )
    if response.status_code >= 400:
        return warned(
            "cubin_download",
            f"the cubin repository {url} answered HTTP {response.status_code} to HEAD",
            ["check that the URL is right and that downloads of its files work", *fixes],
        )
    return passed(
        "cubin_download", f"the cubin repository {url} answered HTTP {response.status_code}"
    )


def check_jit_cache_package(
    versions: Mapping[str, str | None] | None, published: Published | None = None
) -> CheckResult:
    """flashinfer-jit-cache, when installed, of FlashInfer's version (else FlashInfer raises
    "flashinfer-jit-cache version (...) does not match flashinfer version (...)" at import,
    flashinfer/jit/env.py _get_aot_dir; its version carries a CUDA label, 0.6.16+cu130)."""
    del published  # not on PyPI: nothing recorded to compare with (published.toml)
    if versions is None:
        return skipped("jit_cache_package", "package versions unknown")
    fi, cache = versions.get("flashinfer-python"), versions.get("flashinfer-jit-cache")
    if not fi:
        return skipped("jit_cache_package", "FlashInfer is not installed")
    if not cache:
        return skipped("jit_cache_package", "flashinfer-jit-cache is not installed (see nvcc)")
    if public(cache) == public(fi):
        return passed("jit_cache_package", f"flashinfer-jit-cache {cache} matches FlashInfer")
    return failed(
        "jit_cache_package",
        f"flashinfer-jit-cache {cache} does not match FlashInfer {fi}; FlashInfer will refuse "
        "to start",
        jit_cache_fixes(fi),
    )


def cubin_store(environ: Mapping[str, str]) -> Path:
    """FlashInfer's cubin directory for the server's environment: FLASHINFER_CUBIN_DIR, else
    <FLASHINFER_WORKSPACE_BASE or HOME>/.cache/flashinfer/cubins (flashinfer/jit/env.py)."""
    if environ.get("FLASHINFER_CUBIN_DIR"):
        return Path(environ["FLASHINFER_CUBIN_DIR"])
    base = environ.get("FLASHINFER_WORKSPACE_BASE") or environ.get("HOME") or "~"
    return Path(os.path.expanduser(base)) / ".cache" / "flashinfer" / "cubins"


def check_cubin_store(
    versions: Mapping[str, str | None] | None,
    environ: Mapping[str, str],
    inv: GpuInventory,
    published: Published | None = None,
) -> CheckResult:
    """Before the load: when cubins would be downloaded, does the local store already hold
    cubins for this GPU's SM? If not, the first batch fetches them from the CDN."""
    if not downloads_needed(versions):
        return skipped("cubin_store", "no downloads: flashinfer-cubin provides the cubins")
    sms = [cc for cc in inv.ccs if cc in _CUBIN_SMS]
    if not sms:
        why = "GPUs unknown" if inv.gpus is None else "no GPU here runs TRTLLM-gen cubins"
        return skipped("cubin_store", why)
    store = cubin_store(environ)
    missing = [cc for cc in sms if not _holds(store, _CUBIN_SMS[cc])]
    fi = (versions or {}).get("flashinfer-python") or ""
    details = {"store": str(store), "compute_capabilities": sms}
    if not missing:
        return passed("cubin_store", f"{store} holds cubins for SM {', '.join(sms)}", **details)
    return warned(
        "cubin_store",
        f"no local cubins for SM {', '.join(missing)} in {store}: FlashInfer fetches them "
        "from the kernel CDN at the first batch",
        cubin_fixes(fi, published),
        **details,
    )


def _holds(store: Path, tags: tuple[str, ...]) -> bool:
    """Is there a .cubin under `store` whose name names one of `tags` (case-insensitive)?"""
    seen = 0
    for _root, _dirs, files in os.walk(store):
        for name in files:
            seen += 1
            low = name.lower()
            if low.endswith(".cubin") and any(t in low for t in tags):
                return True
            if seen >= _MAX_STORE_FILES:
                return False
    return False
