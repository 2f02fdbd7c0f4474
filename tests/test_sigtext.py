"""Signature text that depends on the server: the cubin source named in the title."""

from __future__ import annotations

import pytest

from watchdog.core.knowledge.sigtext import cubin_source, fill


@pytest.mark.parametrize(
    ("repo", "said"),
    [
        (None, "NVIDIA's CDN"),
        ("", "NVIDIA's CDN"),
        (
            "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/",
            "NVIDIA's CDN",
        ),
        ("http://127.0.0.1:8080/cubins/", "the cubin mirror 127.0.0.1:8080"),
        ("https://artifacts.corp.internal/flashinfer/", "the cubin mirror artifacts.corp.internal"),
        ("/srv/cubins", "the cubin mirror /srv/cubins"),
        ("https://user:s3cret@mirror.internal:8443/c/", "the cubin mirror mirror.internal:8443"),
        ("https://user:s3cret@mirror.internal:99999/", "the cubin mirror mirror.internal"),
    ],
)
def test_the_cubin_source_is_the_mirror_the_server_is_pointed_at(
    repo: str | None, said: str
) -> None:
    assert cubin_source({"cubins_repository": repo}) == said


def test_fill_leaves_other_braces_alone() -> None:
    text = "stuck fetching from {cubin_source}; see {other}"
    assert fill(text, {}) == "stuck fetching from NVIDIA's CDN; see {other}"
