"""Placeholders in a signature's title and fix, filled from the server's facts.

A signature's text is data, but some of it depends on the server: FlashInfer fetches cubins
from `FLASHINFER_CUBINS_REPOSITORY` when it is set (flashinfer/jit/cubin_loader.py), so "from
NVIDIA's CDN" would be wrong for a server pointed at a mirror. `{cubin_source}` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# FlashInfer's default FLASHINFER_CUBINS_REPOSITORY host (flashinfer/jit/cubin_loader.py).
DEFAULT_CUBIN_HOST = "edge.urm.nvidia.com"


def cubin_source(facts: Mapping[str, Any]) -> str:
    """ "NVIDIA's CDN", or "the cubin mirror HOST[:PORT]" the server is pointed at."""
    repo = facts.get("cubins_repository")
    if not isinstance(repo, str) or not repo.strip():
        return "NVIDIA's CDN"
    parts = urlsplit(repo.strip())
    try:
        port = parts.port
    except ValueError:  # a malformed port: say no more than the host
        port = None
    if parts.hostname == DEFAULT_CUBIN_HOST:
        return "NVIDIA's CDN"
    # Host and port only: a URL's user:password part must never reach a title.
    if parts.hostname:
        where = parts.hostname + (f":{port}" if port else "")
    else:
        where = "" if parts.scheme else parts.path  # a local path: FlashInfer copies from it
    return f"the cubin mirror {where}" if where else "NVIDIA's CDN"


def fill(text: str, facts: Mapping[str, Any]) -> str:
    """`text` with its known placeholders replaced; other braces are left as they are."""
    if "{cubin_source}" in text:
        text = text.replace("{cubin_source}", cubin_source(facts))
    return text
