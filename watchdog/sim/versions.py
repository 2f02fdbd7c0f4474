"""`--fake-versions`: make package versions visible to the sim's own Python, without import magic.

A directory of `<name>-<version>.dist-info/METADATA` files is prepended to PYTHONPATH and the
process re-execs itself, so any program that runs `/proc/PID/exe -c "importlib.metadata..."`
with the sim's environment (as a watchdog reading /proc/PID/environ would) sees them.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence

MARKER = "VLLM_SIM_FAKE_VERSIONS_DIR"
_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def parse_spec(spec: str) -> dict[str, str]:
    """`vllm=0.11.0,flashinfer-python=0.6.7` -> {name: version}; ValueError naming the bad item."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        match = _SPEC.match(item)
        if not match:
            raise ValueError(
                f"--fake-versions item {item!r} is not NAME=VERSION "
                "(example: vllm=0.11.0,flashinfer-python=0.6.7)"
            )
        out[match.group(1)] = match.group(2)
    return out


def write_dist_infos(root: str, versions: Mapping[str, str]) -> None:
    """Write one minimal `.dist-info/METADATA` per package under `root`."""
    for name, version in versions.items():
        # Directory names use the normalised project name (PEP 427/503 style).
        dist = os.path.join(root, f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info")
        os.makedirs(dist, exist_ok=True)
        with open(os.path.join(dist, "METADATA"), "w", encoding="utf-8") as fh:
            fh.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def reexec_with_versions(spec: str, argv: Sequence[str], workdir: str | None) -> None:
    """Re-exec once with the fake dist-infos on PYTHONPATH; returns only when nothing to do."""
    if not spec or os.environ.get(MARKER):
        return
    versions = parse_spec(spec)
    root = tempfile.mkdtemp(prefix="fake-versions-", dir=workdir)
    write_dist_infos(root, versions)
    env = dict(os.environ)
    env[MARKER] = root
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = root + (os.pathsep + old if old else "")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "watchdog.sim.vllm_sim", *argv], env)
