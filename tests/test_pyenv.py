"""Package versions read from a real venv's metadata, and the errors for broken interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from watchdog.pyenv import PACKAGES, PyEnvError, package_versions


def write_dist(site: Path, name: str, version: str) -> None:
    """A minimal installed distribution: <name>-<version>.dist-info/METADATA."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


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
    assert got == {
        "vllm": "0.11.2",
        "flashinfer-python": "0.6.7",
        "flashinfer-cubin": None,
        "flashinfer-jit-cache": None,
        "torch": "2.9.0",
    }
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
