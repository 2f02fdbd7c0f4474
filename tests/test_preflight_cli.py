"""`hang-watchdog preflight` end to end: exit codes, usage errors, the JSON schema, and the
SM103 + FlashInfer 0.6.7 case that fails until --server-args disables TRTLLM attention."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from site import getsitepackages

import pytest

from watchdog.commands.preflight import add_arguments, options_from_args, run
from watchdog.core.model import GpuSample
from watchdog.preflight.checks_cubins import DEFAULT_CUBINS_REPOSITORY, probe_cdn
from watchdog.preflight.report import SCHEMA, STATUSES
from watchdog.sources.gpu.fake import FakeGpuBackend

MAIN = "import sys; from watchdog.commands.preflight import main; sys.exit(main(sys.argv[1:]))"
REPO = Path(__file__).resolve().parents[1]


def test_guard_catches_the_real_cdn() -> None:
    with pytest.raises(AssertionError, match="edge.urm.nvidia.com"):
        probe_cdn(DEFAULT_CUBINS_REPOSITORY, 1.0)


def site(tmp_path: Path, **versions: str) -> Path:
    """A directory on sys.path holding dist-info metadata for the chosen versions."""
    root = tmp_path / "site"
    for name, version in versions.items():
        dist = name.replace("_", "-")
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        info.joinpath("METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        )
    return root


def tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


def cli(tmp_path: Path, *argv: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(pythonpath or "")])),
    }
    env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-c", MAIN, *argv], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "abc"], "--timeout"),
        (["--server-args", '"unterminated'], "--server-args"),
        (["--gpu-source", "dcgm"], "--gpu-source"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_usage_errors_exit_2_naming_the_flag(tmp_path: Path, argv: list[str], flag: str) -> None:
    proc = cli(tmp_path, *argv)
    assert proc.returncode == 2
    assert flag in proc.stderr


def refused_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/"


def test_json_schema_and_exit_1_when_air_gapped(tmp_path: Path) -> None:
    libs = site(tmp_path, vllm="0.11.2", flashinfer_python="0.6.7", torch="2.9.0")
    argv = [
        "--gpu-source",
        "none",
        "--python",
        sys.executable,
        "--cdn-url",
        refused_url(),
        "--json",
    ]
    proc = cli(tmp_path, *argv, pythonpath=libs)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == SCHEMA
    assert set(doc) >= {"schema", "ok", "exit_code", "strict", "elapsed_s", "summary", "checks"}
    assert doc["ok"] is False and doc["exit_code"] == 1
    assert set(doc["summary"]) == {s.lower() for s in STATUSES}
    for check in doc["checks"]:
        assert set(check) == {"id", "status", "reason", "fixes", "details"}
        assert check["status"] in STATUSES and check["reason"]
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["cubin_download"]["status"] == "FAIL"
    assert by_id["gpus"]["status"] == "SKIP"
    assert by_id["versions"]["details"]["packages"]["flashinfer-python"] == "0.6.7"


class Usage:
    """shutil.disk_usage's result: every disk has 100 GiB, all free."""

    total = free = 100 * 1024**3


def fake_proc(root: Path, scope: str, capeff: str) -> Path:
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text(f"Uid:\t998\t998\t998\t998\nCapEff:\t{capeff}\n")
    (root / "sys/kernel/yama").mkdir(parents=True)
    (root / "sys/kernel/yama/ptrace_scope").write_text(scope + "\n")
    return root


def test_table_output_exit_0_with_prebuilt_kernels(tmp_path: Path) -> None:
    """Every input pinned (GPUs, packages, PATH, /proc, disks, py-spy): the outcome is fixed."""
    libs = site(
        tmp_path,
        vllm="0.11.2",
        flashinfer_python="0.6.16",
        flashinfer_cubin="0.6.16",
        flashinfer_jit_cache="0.6.16+cu130",
        torch="2.9.0",
    )
    bindir = tmp_path / "bin"  # no nvcc, no ninja: the prebuilt kernels make them unneeded
    tool(bindir, "py-spy", "echo 'py-spy 0.4.1'\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--python", sys.executable, "--cdn-url", refused_url(), "--strict"]
    args = parser.parse_args([*argv, "--pyspy", str(bindir / "py-spy")])
    opts = dataclasses.replace(
        options_from_args(args),
        environ={
            "PATH": str(bindir),
            "PYTHONPATH": str(libs),
            "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
        },
        proc_root=fake_proc(tmp_path / "proc", "1", "0000000000000000"),
        cuda_default=tmp_path / "no-cuda",
        systemd_root=tmp_path / "no-systemd",
        shm=tmp_path,
        disk_usage=lambda _path: Usage(),
    )
    two_gb200 = FakeGpuBackend(
        {i: [GpuSample(index=i, name="NVIDIA GB200", cc="10.0")] for i in range(2)}
    )
    out = io.StringIO()
    code = run(args, backend=two_gb200, options=opts, out=out)
    text = out.getvalue()
    assert code == 0, text  # with --strict: no FAIL and no WARN either
    assert text.splitlines()[0].split() == ["STATUS", "CHECK", "REASON"]
    rows = {
        line.split()[1]: line.split()[0] for line in text.splitlines()[2:] if line[:1].isupper()
    }
    expected = {
        "gpus": "PASS",
        "versions": "PASS",
        "nvcc": "SKIP",
        "ninja": "SKIP",
        "arch_list": "SKIP",
        "cubin_package": "PASS",
        "cubin_download": "SKIP",  # flashinfer-cubin ships them: the CDN is never asked
        "fabric": "SKIP",
        "fabric_manager": "SKIP",
        "py_spy": "PASS",
        "ptrace": "PASS",  # this process lacks CAP_SYS_PTRACE, but it is not the watchdog
        "incident_space": "SKIP",
        "cache_space": "PASS",
        "shm": "PASS",
    }
    assert {k: rows.get(k) for k in expected} == expected, text
    assert {v for k, v in rows.items() if k.startswith("known_bad")} == {"PASS"}, text
    flat = " ".join(text.split())
    assert "2 GPU(s): NVIDIA GB200; CC 10.0 (needs 10.0a)" in flat
    assert "PASS py_spy py-spy 0.4.1 at " in flat  # the configured stand-in, not the real one
    assert "preflight OK: " in text and "0 warnings, 0 failed" in text


def test_pyspy_beside_the_watchdogs_python_passes_off_path(tmp_path: Path) -> None:
    """The README's systemd install: a venv in /opt, only the entry point linked onto PATH.

    The watchdog finds py-spy beside its own Python (resolve_pyspy); pre-flight must too.
    """
    venv_bin = tmp_path / "opt" / "hang-watchdog" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)  # sys.executable stays the venv path
    tool(venv_bin, "py-spy", "echo 'py-spy 0.4.1'\n")
    empty = tmp_path / "usr-bin"
    empty.mkdir()
    # The link has no pyvenv.cfg beside it, so its Python starts with the base interpreter's
    # site-packages: hand it this environment's, so that a venv-installed test run (the README's
    # way) finds psutil and the rest just as a system install does.
    path = os.pathsep.join([str(REPO), *getsitepackages()])
    env = {"PATH": str(empty), "PYTHONPATH": path, "FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    argv = ["--gpu-source", "none", "--python", sys.executable, "--json"]
    proc = subprocess.run(
        [str(venv_bin / "python"), "-c", MAIN, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    by_id = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert by_id["py_spy"]["status"] == "PASS", by_id["py_spy"]
    assert by_id["py_spy"]["details"]["path"] == str(venv_bin / "py-spy")


# -- the GB300 case, in process with a fake GPU ------------------------------------------------


def gb300_options(tmp_path: Path, argv: list[str]):  # noqa: ANN201
    libs = site(
        tmp_path,
        vllm="0.11.2",
        flashinfer_python="0.6.7",
        flashinfer_cubin="0.6.7",
        flashinfer_jit_cache="0.6.7+cu129",
        torch="2.9.0",
    )
    bindir = tmp_path / "bin"
    tool(bindir, "ninja", "echo 1.11.1\n")
    tool(bindir, "nvcc", "echo 'Cuda compilation tools, release 12.9, V12.9.86'\n")
    proc_root = tmp_path / "proc"
    (proc_root / "self").mkdir(parents=True)
    (proc_root / "self" / "status").write_text("CapEff:\t000001ffffffffff\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--python", sys.executable, "--cdn-url", refused_url(), *argv])
    pyspy_dir = os.path.dirname(sys.executable)
    environ = {
        "PATH": f"{bindir}:{pyspy_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(libs),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
    }
    opts = dataclasses.replace(
        options_from_args(args),
        environ=environ,
        proc_root=proc_root,
        cuda_default=tmp_path / "no-cuda",
        systemd_root=tmp_path / "no-systemd",
    )
    return args, opts


def gb300() -> FakeGpuBackend:
    return FakeGpuBackend({0: [GpuSample(index=0, name="NVIDIA GB300", cc="10.3")]})


def test_sm103_flashinfer_067_fails_then_passes_with_fallback_flag(tmp_path: Path) -> None:
    args, opts = gb300_options(tmp_path / "a", ["--json"])
    out = io.StringIO()
    assert run(args, backend=gb300(), options=opts, out=out) == 1
    by_id = {c["id"]: c for c in json.loads(out.getvalue())["checks"]}
    bad = by_id["known_bad:sm103_flashinfer_067_trtllm_attention"]
    assert bad["status"] == "FAIL" and len(bad["fixes"]) == 2

    flag = "--attention-config.use_trtllm_attention=0 --tensor-parallel-size 1"
    args, opts = gb300_options(tmp_path / "b", ["--json", f"--server-args={flag}"])
    out = io.StringIO()
    code = run(args, backend=gb300(), options=opts, out=out)
    doc = json.loads(out.getvalue())
    assert code == 0, [c for c in doc["checks"] if c["status"] == "FAIL"]
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["known_bad:sm103_flashinfer_067_trtllm_attention"]["status"] == "PASS"
    assert by_id["nvcc"]["status"] == "PASS"  # the stand-in nvcc 12.9 can target sm_103a
    assert by_id["cubin_download"]["status"] == "SKIP"  # flashinfer-cubin 0.6.7 ships them


def test_strict_turns_warnings_into_exit_1(tmp_path: Path) -> None:
    flag = "--attention-config.use_trtllm_attention=0"
    args, opts = gb300_options(tmp_path, [f"--server-args={flag}", "--strict"])
    opts = dataclasses.replace(opts, pyspy=str(tmp_path / "no-such-py-spy"))
    out = io.StringIO()
    code = run(args, backend=gb300(), options=opts, out=out)
    text = out.getvalue()
    warns = [line for line in text.splitlines() if line.startswith("WARN")]
    assert warns and code == 1, text
    assert "(strict)" in text
