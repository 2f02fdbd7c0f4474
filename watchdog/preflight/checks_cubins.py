"""FlashInfer cubins: shipped by flashinfer-cubin, or downloaded at run time from the kernel CDN.

A download that cannot complete costs minutes of retries per file after the weights are loaded
(flashinfer-ai/flashinfer flashinfer/jit/cubin_loader.py download_file, v0.6.7: 4 attempts, a
10 s timeout each, 5/10/20 s backoff). The
CDN is contacted only here, only with a HEAD, only under a hard deadline (DNS included).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from watchdog.preflight.report import CheckResult, failed, passed, skipped, warned
from watchdog.sources.deadline import DeadlineExceeded, call_with_deadline

# flashinfer-ai/flashinfer flashinfer/jit/cubin_loader.py, identical v0.6.7 .. v0.6.18rc7.
DEFAULT_CUBINS_REPOSITORY = (
    "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
)
_OFF = {"", "0", "false", "no", "off"}
_AIRGAP_FIXES = (
    "pip install flashinfer-cubin==<flashinfer version> --extra-index-url https://flashinfer.ai/whl/",
    "or run `flashinfer download-cubin` on a connected host, copy the cubins over and set "
    "FLASHINFER_CUBINS_REPOSITORY=/path/to/cubins",
)


def downloads_needed(versions: Mapping[str, str | None] | None) -> bool | None:
    """Cubins come from the CDN unless flashinfer-cubin matches FlashInfer exactly."""
    if versions is None:
        return None
    fi = versions.get("flashinfer-python")
    return bool(fi) and versions.get("flashinfer-cubin") != fi


def check_cubin_package(
    versions: Mapping[str, str | None] | None, environ: Mapping[str, str]
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
            [f"pip install flashinfer-cubin=={fi} --extra-index-url https://flashinfer.ai/whl/"],
        )
    # FlashInfer raises "flashinfer-cubin version (...) does not match flashinfer version (...)"
    # unless FLASHINFER_DISABLE_VERSION_CHECK is set (flashinfer/jit/env.py).
    fix = [f"pip install flashinfer-cubin=={fi} --extra-index-url https://flashinfer.ai/whl/"]
    reason = f"flashinfer-cubin {cubin} does not match FlashInfer {fi}"
    if environ.get("FLASHINFER_DISABLE_VERSION_CHECK", "").lower() not in _OFF:
        return warned("cubin_package", reason + " (version check disabled)", fix)
    return failed("cubin_package", reason + "; FlashInfer will refuse to start", fix)


def check_cubin_download(
    versions: Mapping[str, str | None] | None,
    environ: Mapping[str, str],
    cdn_url: str | None,
    timeout_s: float,
) -> CheckResult:
    """When downloads would happen: allowed, and the repository (URL or local path) answers."""
    needed = downloads_needed(versions)
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
            _AIRGAP_FIXES,
        )
    repo = cdn_url or environ.get("FLASHINFER_CUBINS_REPOSITORY") or DEFAULT_CUBINS_REPOSITORY
    if urlsplit(repo).scheme not in ("http", "https"):
        return _check_local(repo)
    return probe_cdn(repo, timeout_s)


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


def probe_cdn(url: str, timeout_s: float, client: httpx.Client | None = None) -> CheckResult:
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
            _AIRGAP_FIXES,
        )
    except httpx.HTTPError as e:
        return failed(
            "cubin_download",
            f"cannot reach the cubin repository {url}: {type(e).__name__}: {e}",
            _AIRGAP_FIXES,
        )
    if response.status_code >= 400:
        return warned(
            "cubin_download",
            f"the cubin repository {url} answered HTTP {response.status_code} to HEAD",
            ["check that the URL is right and that downloads of its files work", *_AIRGAP_FIXES],
        )
    return passed(
        "cubin_download", f"the cubin repository {url} answered HTTP {response.status_code}"
    )
