"""Simulated `flashinfer/jit/cubin_loader.py` (flashinfer-ai/flashinfer v0.6.7 shape).

Same function names and call chain as upstream, so a py-spy dump of a stalled simulator
shows what a stalled vLLM shows: `get_cubin_callback` -> `get_cubin` -> `download_file` ->
http.client -> socket (upstream `get_cubin` calls `load_cubin` first, which misses and returns,
then `download_file`). Upstream uses `requests`; the simulator is standard library only, so
`urllib.request` stands in and `OSError` plays `requests.exceptions.RequestException`.
It refuses any URL whose host is not a loopback address.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import logging
import os
import pathlib
import shutil
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import TextIO
from urllib.parse import urljoin, urlsplit

logger = logging.getLogger("flashinfer.jit")

# Upstream default (flashinfer v0.6.7 .. HEAD). The simulator never contacts it: `repository()`
# must be pointed at the stand-in CDN on 127.0.0.1 or at a local directory.
UPSTREAM_REPOSITORY = (
    "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
)
# flashinfer/jit/core.py's format, v0.6.7 and later.
LOG_FORMAT = "%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: %(message)s"


def configure_logging(stream: TextIO = sys.stderr, log_path: str | None = None) -> None:
    """Attach FlashInfer's stderr handler (and a file handler) the way jit/core.py does."""
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(stream)]
    if log_path:
        handlers.append(logging.FileHandler(log_path))
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def repository() -> str:
    """FLASHINFER_CUBINS_REPOSITORY, defaulting to upstream's URL (which download refuses)."""
    return os.environ.get("FLASHINFER_CUBINS_REPOSITORY", UPSTREAM_REPOSITORY)


def cubin_dir() -> pathlib.Path:
    """FLASHINFER_CUBIN_DIR, else `<FLASHINFER_WORKSPACE_BASE or ~>/.cache/flashinfer/cubins`."""
    if os.environ.get("FLASHINFER_CUBIN_DIR"):
        return pathlib.Path(os.environ["FLASHINFER_CUBIN_DIR"])
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~")
    return pathlib.Path(base) / ".cache" / "flashinfer" / "cubins"


def safe_urljoin(base: str, path: str) -> str:
    """Join URLs ensuring base is treated as a directory (as upstream)."""
    if not base.endswith("/"):
        base += "/"
    return urljoin(base, path)


def check_loopback(url: str) -> None:
    """Refuse any URL that is not on a loopback address: the simulator must stay on this host."""
    host = urlsplit(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"simulated FlashInfer refuses to fetch {url!r}: host {host!r} is not loopback; "
            "point FLASHINFER_CUBINS_REPOSITORY (or vllm_sim --cdn-url) at the stand-in CDN "
            "on 127.0.0.1"
        )


def _fetch(source: str, timeout: float) -> bytes:
    """One HTTP GET (upstream: `session.get(source, timeout=timeout)` + `raise_for_status()`)."""
    with urllib.request.urlopen(source, timeout=timeout) as response:  # noqa: S310 loopback only
        return response.read()


def download_file(
    source: str,
    destination: str,
    retries: int = 4,
    delay: int = 5,
    timeout: float = 10,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Download `source` (or copy a local path) to `destination` with v0.6.7's retry/backoff."""
    with open(f"{destination}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        logger.info(f"Acquired lock for {destination}")
        temp_path = f"{destination}.{uuid.uuid4().hex}.tmp"
        if os.path.exists(source):
            shutil.copy(source, temp_path)
            os.replace(temp_path, destination)
            logger.info(f"File copied successfully: {destination}")
            return True
        check_loopback(source)
        for attempt in range(1, retries + 1):
            try:
                data = _fetch(source, timeout)
                with open(temp_path, "wb") as file:
                    file.write(data)
                os.replace(temp_path, destination)
                logger.info(f"File downloaded successfully: {source} -> {destination}")
                return True
            except OSError as e:  # urllib's URLError and socket timeouts are OSErrors
                logger.warning(f"Downloading {source}: attempt {attempt} failed: {e}")
                if attempt < retries:
                    # v0.6.7-v0.6.10: deterministic delay*2**(attempt-1); jitter from v0.6.11.
                    backoff_delay = delay * 2 ** (attempt - 1)
                    logger.info(f"Retrying in {backoff_delay} seconds...")
                    sleep(backoff_delay)
                else:
                    logger.error("Max retries reached. Download failed.")
            finally:
                if os.path.exists(temp_path):
                    os.remove(temp_path)
    return False


def load_cubin(cubin_path: str, sha256: str) -> bytes:
    """Read a cached cubin and check its sha256; empty bytes on a miss or mismatch."""
    logger.debug(f"Loading from {cubin_path}")
    try:
        with open(cubin_path, mode="rb") as f:
            cubin = f.read()
    except OSError:
        return b""
    if os.getenv("FLASHINFER_CUBIN_CHECKSUM_DISABLED") or not sha256:
        return cubin
    actual_sha = hashlib.sha256(cubin).hexdigest()
    if sha256 == actual_sha:
        return cubin
    logger.warning(f"sha256 mismatch (expected {sha256} actual {actual_sha}) for {cubin_path}")
    return b""


def get_cubin(file_name: str, sha256: str, timeout: float = 10) -> bytes:
    """Load a cubin from the cache, downloading it from the repository on a miss (v0.6.7)."""
    local_path = str(cubin_dir() / file_name)
    data = load_cubin(local_path, sha256)
    if data:
        return data
    if os.getenv("FLASHINFER_NO_DOWNLOAD"):
        # Message as in v0.6.7.post1 `get_artifact` (not present in v0.6.7 itself).
        raise RuntimeError(
            f"Artifact not found locally: {file_name} (looked at {local_path}). "
            "FLASHINFER_NO_DOWNLOAD is set — refusing to download. "
            "This means flashinfer-cubin is missing this file."
        )
    os.makedirs(os.path.dirname(local_path), exist_ok=True)
    uri = safe_urljoin(repository(), file_name)
    logger.info(f"Fetching cubin {file_name} from {uri}")
    download_file(uri, local_path, timeout=timeout)
    return load_cubin(local_path, sha256)


def get_cubin_callback(name: bytes, sha256: bytes, timeout: float = 10) -> bytes:
    """What the C++ `getCubin` hook calls through ctypes (upstream: set by setup_cubin_loader)."""
    return get_cubin(name.decode("utf-8"), sha256.decode("utf-8"), timeout=timeout)
