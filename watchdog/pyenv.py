"""Read package versions from another Python environment (the server's) without importing them.

Importing vLLM or torch to learn their versions would take seconds and touch CUDA; reading the
installed distributions' metadata in a child interpreter takes milliseconds and cannot hang the
caller: the child runs with a deadline.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence

PACKAGES: tuple[str, ...] = (
    "vllm",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "torch",
)

# Runs inside the target interpreter. Drops the "" (cwd) entry `-c` puts on sys.path so a stray
# *.dist-info in the working directory cannot shadow the environment's real packages.
_SNIPPET = """
import json, sys
sys.path[:] = [p for p in sys.path if p]
from importlib import metadata
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


class PyEnvError(Exception):
    """The interpreter could not be asked: missing, timed out, failed, or printed garbage."""


def package_versions(
    python: str,
    *,
    env: Mapping[str, str] | None = None,
    packages: Sequence[str] = PACKAGES,
    timeout_s: float = 5.0,
) -> dict[str, str | None]:
    """Return {distribution name: version or None if not installed} as seen by `python`."""
    argv = [python, "-c", _SNIPPET, json.dumps(list(packages))]
    try:
        proc = subprocess.run(
            argv,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError as e:
        raise PyEnvError(
            f"Python interpreter not found: {python!r}; pass --python with the path of the "
            "server's interpreter (e.g. /opt/vllm/.venv/bin/python)"
        ) from e
    except PermissionError as e:
        raise PyEnvError(f"Python interpreter {python!r} is not executable: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise PyEnvError(
            f"Python interpreter {python!r} did not answer within {timeout_s:g} s; "
            "check that it starts (a slow network filesystem or a sitecustomize can hang it)"
        ) from e
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise PyEnvError(
            f"Python interpreter {python!r} exited with status {proc.returncode}: {tail[0]}"
        )
    return _parse(python, proc.stdout, packages)


def _parse(python: str, stdout: str, packages: Sequence[str]) -> dict[str, str | None]:
    """Parse the snippet's JSON line; anything else is an error naming the interpreter."""
    lines = stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        shown = stdout.strip()[:200] or "(nothing)"
        raise PyEnvError(
            f"Python interpreter {python!r} printed something that is not a version map: {shown}"
        )
    result: dict[str, str | None] = {}
    for name in packages:
        value = data.get(name)
        result[name] = value if isinstance(value, str) else None
    return result
