"""Pre-flight checks, each PASS/WARN/FAIL path: fake GPUs, stand-in nvcc/ninja on a temp PATH,
package metadata on a temp sys.path, and a loopback HTTP server standing in for the cubin CDN."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes import gpus, inventory
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import GpuSample
from watchdog.preflight import checks_cubins, checks_fabric, checks_toolchain, checks_watchdog
from watchdog.preflight.checks_gpu import check_gpus, collect_gpus
from watchdog.preflight.checks_versions import check_known_bad
from watchdog.preflight.report import exit_code
from watchdog.sources.facts import trtllm_attention as trtllm_setting
from watchdog.sources.gpu.backend import FabricInfo, GpuError
from watchdog.sources.gpu.fake import FakeGpuBackend

SLEEP = shutil.which("sleep")
NVCC_OUT = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release {rel}, V{rel}.93
Build cuda_{rel}.r{rel}/compiler.35583870_0
"""  # format from flashinfer #1919 (a real `nvcc --version` for 12.8)


def tool(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def nvcc(bindir: Path, rel: str) -> Path:
    lines = NVCC_OUT.format(rel=rel).splitlines()
    return tool(bindir, "nvcc", "".join(f"echo '{line}'\n" for line in lines))


# -- GPUs ------------------------------------------------------------------------------------


def test_gpus_pass_lists_ccs_and_arch_targets() -> None:
    result = check_gpus(inventory("10.3", "10.3"))
    assert result.status == "PASS"
    assert result.details["arch_targets"] == ["10.3a"]
    assert "2 GPU(s)" in result.reason and "580.82.07" in result.reason


def test_gpus_fail_when_nvml_errors_and_skip_when_disabled() -> None:
    fake = gpus("10.0")
    fake.fail_next("init", GpuError("NVML Shared Library Not Found"))
    result = check_gpus(collect_gpus(fake, 5.0))
    assert result.status == "FAIL" and "NVML Shared Library Not Found" in result.reason
    assert check_gpus(collect_gpus(None, 5.0)).status == "SKIP"


def test_gpus_hanging_backend_hits_the_deadline() -> None:
    fake = gpus("10.0")
    fake.hang_next("device_count", 30.0)
    try:
        result = check_gpus(collect_gpus(fake, 0.3))
    finally:
        fake.release()
    assert result.status == "FAIL" and "did not answer within 0.3 s" in result.reason


def test_gpus_warn_when_cc_unreadable() -> None:
    fake = FakeGpuBackend({0: [GpuSample(index=0, name="GPU", cc=None)]})
    assert check_gpus(collect_gpus(fake, 5.0)).status == "WARN"


# -- known-bad combinations (from the shipped signature data) --------------------------------


KNOWN_BAD = load_signatures().known_bad
FI067 = {"flashinfer-python": "0.6.7", "vllm": "0.11.2"}


def test_sm103_flashinfer_067_fails_with_both_fixes() -> None:
    [result] = check_known_bad(KNOWN_BAD, FI067, inventory("10.3"), trtllm_setting([], {}))
    assert result.status == "FAIL"
    assert any("use_trtllm_attention=0" in f for f in result.fixes)
    assert any("0.6.7.post2" in f for f in result.fixes)


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--attention-config.use_trtllm_attention=0"], {}),
        (["--attention-config.use_trtllm_attention", "false"], {}),
        (["--attention-config", '{"use_trtllm_attention": false}'], {}),
        ([], {"VLLM_USE_TRTLLM_ATTENTION": "0"}),
    ],
)
def test_sm103_flashinfer_067_passes_once_trtllm_is_disabled(argv: list[str], env: dict) -> None:
    [result] = check_known_bad(KNOWN_BAD, FI067, inventory("10.3"), trtllm_setting(argv, env))
    assert result.status == "PASS" and "avoided" in result.reason


def test_forcing_trtllm_on_still_fails() -> None:
    argv = ["--attention-config.use_trtllm_attention=1"]
    [result] = check_known_bad(KNOWN_BAD, FI067, inventory("10.3"), trtllm_setting(argv, {}))
    assert result.status == "FAIL" and "forced on" in result.reason


def test_flashinfer_067_on_sm100_and_fixed_release_pass() -> None:
    [on_b200] = check_known_bad(KNOWN_BAD, FI067, inventory("10.0"), None)
    assert on_b200.status == "PASS"
    fixed = {"flashinfer-python": "0.6.7.post2"}
    [result] = check_known_bad(KNOWN_BAD, fixed, inventory("10.3"), None)
    assert result.status == "PASS" and result.id == "known_bad"


def test_flashinfer_0614_moe_hang_warns() -> None:
    [result] = check_known_bad(KNOWN_BAD, {"flashinfer-python": "0.6.14"}, inventory("10.3"), None)
    assert result.status == "WARN" and "3971" in " ".join(result.details["references"])
    assert any("0.6.15" in f for f in result.fixes)


# -- JIT toolchain ---------------------------------------------------------------------------


JIT = {"flashinfer-python": "0.6.7", "flashinfer-cubin": None, "flashinfer-jit-cache": None}
PREBUILT = {
    "flashinfer-python": "0.6.16",
    "flashinfer-cubin": "0.6.16",
    "flashinfer-jit-cache": "0.6.16+cu130",
}


def test_nvcc_new_enough_passes_via_cuda_home(tmp_path: Path) -> None:
    nvcc(tmp_path / "cuda" / "bin", "12.9")
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": str(tmp_path / "empty")}
    result = checks_toolchain.check_nvcc(inventory("10.3"), JIT, env, tmp_path / "none", 5.0)
    assert result.status == "PASS" and "10.3a" in result.reason


def test_nvcc_too_old_for_sm103_fails_with_minimum(tmp_path: Path) -> None:
    nvcc(tmp_path / "bin", "12.8")
    env = {"PATH": str(tmp_path / "bin")}
    result = checks_toolchain.check_nvcc(inventory("10.3"), JIT, env, tmp_path / "none", 5.0)
    assert result.status == "FAIL" and "sm_103a" in result.reason
    assert "CUDA >= 12.9" in result.fixes[0]
    ok = checks_toolchain.check_nvcc(inventory("10.0"), JIT, env, tmp_path / "none", 5.0)
    assert ok.status == "PASS"


def test_nvcc_missing_fails_when_jit_needed_and_skips_with_prebuilt(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "empty")}
    result = checks_toolchain.check_nvcc(inventory("10.0"), JIT, env, tmp_path / "none", 5.0)
    assert result.status == "FAIL" and "nvcc not found" in result.reason
    assert any("flashinfer-cubin" in f for f in result.fixes)
    skip = checks_toolchain.check_nvcc(inventory("10.0"), PREBUILT, env, tmp_path / "none", 5.0)
    assert skip.status == "SKIP"


def test_nvcc_found_in_default_cuda_root(tmp_path: Path) -> None:
    nvcc(tmp_path / "cuda" / "bin", "13.0")
    env = {"PATH": str(tmp_path / "empty")}
    result = checks_toolchain.check_nvcc(inventory("10.3"), JIT, env, tmp_path / "cuda", 5.0)
    assert result.status == "PASS" and str(tmp_path / "cuda") in result.reason


def test_nvcc_unknown_architecture_warns(tmp_path: Path) -> None:
    nvcc(tmp_path / "bin", "13.0")
    env = {"PATH": str(tmp_path / "bin")}
    result = checks_toolchain.check_nvcc(inventory("99.0"), JIT, env, tmp_path / "none", 5.0)
    assert result.status == "WARN" and "99.0" in result.reason


def test_nvcc_that_hangs_or_prints_garbage_fails(tmp_path: Path) -> None:
    tool(tmp_path / "bin", "nvcc", f"exec {SLEEP} 30\n")
    env = {"PATH": str(tmp_path / "bin")}
    result = checks_toolchain.check_nvcc(inventory("10.0"), JIT, env, tmp_path / "none", 0.5)
    assert result.status == "FAIL" and "does not work" in result.reason
    tool(tmp_path / "bin", "nvcc", "echo nonsense\n")
    result = checks_toolchain.check_nvcc(inventory("10.0"), JIT, env, tmp_path / "none", 5.0)
    assert result.status == "FAIL" and "nonsense" in result.reason


def test_ninja_pass_fail_skip(tmp_path: Path) -> None:
    empty = {"PATH": str(tmp_path / "empty")}
    assert checks_toolchain.check_ninja(JIT, empty).status == "FAIL"
    assert checks_toolchain.check_ninja(PREBUILT, empty).status == "SKIP"
    tool(tmp_path / "bin", "ninja", "echo 1.11.1\n")
    assert checks_toolchain.check_ninja(JIT, {"PATH": str(tmp_path / "bin")}).status == "PASS"


@pytest.mark.parametrize(
    ("value", "versions", "status"),
    [
        ("10.0a 10.3a", JIT, "PASS"),
        ("9.0;10.3+PTX", JIT, "PASS"),
        ("9.0;10.0", JIT, "FAIL"),
        ("9.0;10.0", PREBUILT, "WARN"),
    ],
)
def test_arch_lists(value: str, versions: dict, status: str) -> None:
    env = {"FLASHINFER_CUDA_ARCH_LIST": value}
    result = checks_toolchain.check_arch_lists(inventory("10.3"), versions, env)
    assert result.status == status
    if status != "PASS":
        assert "10.3a" in result.fixes[0]


def test_arch_list_unset_skips() -> None:
    assert checks_toolchain.check_arch_lists(inventory("10.3"), JIT, {}).status == "SKIP"


# -- cubins and the CDN (loopback stand-in only) ----------------------------------------------


class _Head(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(404 if "missing" in self.path else 200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cdn() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Head)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts TCP connections (kernel backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


def refused_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_cubin_package_paths() -> None:
    check = checks_cubins.check_cubin_package
    assert check(PREBUILT, {}).status == "PASS"
    assert check(JIT, {}).status == "WARN"
    mismatch = {"flashinfer-python": "0.6.7", "flashinfer-cubin": "0.6.6"}
    assert check(mismatch, {}).status == "FAIL"
    assert check(mismatch, {"FLASHINFER_DISABLE_VERSION_CHECK": "1"}).status == "WARN"
    assert check({"flashinfer-python": None}, {}).status == "SKIP"


def test_cdn_answering_passes_and_404_warns(cdn: str) -> None:
    assert checks_cubins.check_cubin_download(JIT, {}, cdn, 5.0).status == "PASS"
    env = {"FLASHINFER_CUBINS_REPOSITORY": cdn + "missing/"}
    result = checks_cubins.check_cubin_download(JIT, env, None, 5.0)
    assert result.status == "WARN" and "HTTP 404" in result.reason


def test_cdn_refusing_fails_with_airgap_fixes() -> None:
    url = f"http://127.0.0.1:{refused_port()}/"
    result = checks_cubins.check_cubin_download(JIT, {}, url, 5.0)
    assert result.status == "FAIL" and "cannot reach" in result.reason
    assert any("download-cubin" in f for f in result.fixes)


def test_cdn_never_answering_times_out_promptly(silent_port: int) -> None:
    started = time.monotonic()
    result = checks_cubins.check_cubin_download(JIT, {}, f"http://127.0.0.1:{silent_port}/", 0.5)
    assert result.status == "FAIL" and "did not answer within 0.5 s" in result.reason
    assert time.monotonic() - started < 20  # a deadline, not a speed goal


def test_no_download_local_repo_and_prebuilt(tmp_path: Path) -> None:
    check = checks_cubins.check_cubin_download
    no_dl = check(JIT, {"FLASHINFER_NO_DOWNLOAD": "1"}, None, 5.0)
    assert no_dl.status == "FAIL" and "FLASHINFER_NO_DOWNLOAD" in no_dl.reason
    local = check(JIT, {"FLASHINFER_CUBINS_REPOSITORY": str(tmp_path)}, None, 5.0)
    assert local.status == "PASS"
    gone = check(JIT, {"FLASHINFER_CUBINS_REPOSITORY": str(tmp_path / "gone")}, None, 5.0)
    assert gone.status == "FAIL"
    assert check(PREBUILT, {}, None, 5.0).status == "SKIP"


# -- fabric ------------------------------------------------------------------------------------


DONE = FabricInfo(state=3, status=0, health_summary=1, health_mask=0)


@pytest.mark.parametrize(
    ("info", "status"),
    [
        (DONE, "PASS"),
        (FabricInfo(state=2), "FAIL"),
        (FabricInfo(state=3, status=0, health_summary=2), "FAIL"),
        (FabricInfo(state=3, status=0, health_summary=1, health_mask=0x1), "WARN"),
        (FabricInfo(state=0), "SKIP"),
        (None, "SKIP"),
    ],
)
def test_fabric_states(info: FabricInfo | None, status: str) -> None:
    result = checks_fabric.check_fabric(inventory("10.3", "10.3", fabric={0: DONE, 1: info}))
    assert result.status == ("PASS" if status == "SKIP" else status)
    if status in ("FAIL", "WARN"):
        assert any("NCCL_NVLS_ENABLE=0" in f for f in result.fixes)
    alone = checks_fabric.check_fabric(inventory("10.3", fabric={0: info}))
    assert alone.status == status


def systemctl(tmp_path: Path, load: str, active: str) -> dict[str, str]:
    tool(tmp_path / "bin", "systemctl", f"echo LoadState={load}\necho ActiveState={active}\n")
    (tmp_path / "systemd").mkdir(exist_ok=True)
    return {"PATH": str(tmp_path / "bin")}


@pytest.mark.parametrize(
    ("load", "active", "status"),
    [("loaded", "active", "PASS"), ("loaded", "failed", "FAIL"), ("not-found", "inactive", "WARN")],
)
def test_fabric_manager(tmp_path: Path, load: str, active: str, status: str) -> None:
    env = systemctl(tmp_path, load, active)
    inv = inventory("10.3", fabric={0: DONE})
    result = checks_fabric.check_fabric_manager(inv, env, tmp_path / "systemd", 5.0)
    assert result.status == status
    no_systemd = checks_fabric.check_fabric_manager(inv, env, tmp_path / "nope", 5.0)
    assert no_systemd.status == "SKIP"
    no_fabric = checks_fabric.check_fabric_manager(inventory("10.3"), env, tmp_path, 5.0)
    assert no_fabric.status == "SKIP"


# -- what the watchdog itself needs ------------------------------------------------------------


def test_pyspy_configured_path_missing_or_broken_warns(tmp_path: Path) -> None:
    missing = checks_watchdog.check_pyspy(5.0, str(tmp_path / "py-spy"))
    assert missing.status == "WARN" and str(tmp_path / "py-spy") in missing.reason
    broken = tool(tmp_path / "bin", "py-spy", "exit 3\n")
    result = checks_watchdog.check_pyspy(5.0, str(broken))
    assert result.status == "WARN" and "exited 3" in result.reason
    assert checks_watchdog.check_pyspy(5.0, None, lambda _p: None).status == "WARN"


def test_pyspy_real_binary_runs() -> None:
    real = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if real is None:
        pytest.skip("py-spy is not installed")
    result = checks_watchdog.check_pyspy(10.0, real)
    assert result.status == "PASS" and "py-spy" in result.reason


def fake_proc(tmp_path: Path, scope: str | None, capeff: str) -> Path:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text(
        f"Name:\tpython\nUid:\t998\t998\t998\t998\nCapEff:\t{capeff}\n"
    )
    if scope is not None:
        (root / "sys/kernel/yama").mkdir(parents=True)
        (root / "sys/kernel/yama/ptrace_scope").write_text(scope + "\n")
    return root


@pytest.mark.parametrize(
    ("scope", "capeff", "status"),
    [
        ("0", "0000000000000000", "PASS"),
        # Pre-flight under ExecStartPre runs as User=vllm without CAP_SYS_PTRACE: that says
        # nothing about the watchdog (which has it), so no warning.
        ("1", "0000000000000000", "PASS"),
        ("1", "0000000000080000", "PASS"),  # bit 19 = CAP_SYS_PTRACE
        ("2", "0000000000000000", "PASS"),
        ("3", "000001ffffffffff", "WARN"),  # nobody may attach, whatever its capabilities
        (None, "0000000000000000", "PASS"),
    ],
)
def test_ptrace(tmp_path: Path, scope: str | None, capeff: str, status: str) -> None:
    result = checks_watchdog.check_ptrace(fake_proc(tmp_path, scope, capeff))
    assert result.status == status
    has = int(capeff, 16) >> 19 & 1
    # Worded as this process, never as a verdict on the watchdog's own permissions.
    here = f"this pre-flight process (uid 998, not the watchdog) {'has' if has else 'lacks'}"
    assert f"{here} CAP_SYS_PTRACE" in result.reason
    if status == "WARN":
        assert any("reboot" in f for f in result.fixes)
    else:
        assert "CAP_SYS_PTRACE" in result.reason and "hang-watchdog.service" in result.reason


class Usage:
    """shutil.disk_usage's result for a chosen size."""

    def __init__(self, total: int, free: int | None = None) -> None:
        self.total, self.free = total, total if free is None else free


def sized(total: int, free: int | None = None):  # noqa: ANN201
    seen: list[Path] = []

    def usage(path: Path) -> Usage:
        seen.append(path)
        return Usage(total, free)

    usage.seen = seen  # type: ignore[attr-defined]
    return usage


GIB, MIB = 1024**3, 1024**2


def test_space_checks(tmp_path: Path) -> None:
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    incident = checks_watchdog.check_incident_space(tmp_path / "not" / "yet", 5.0, sized(GIB))
    assert incident.status == "PASS" and str(tmp_path) in incident.reason
    assert checks_watchdog.check_incident_space(None).status == "SKIP"
    full = sized(64 * MIB, 100 * MIB)
    assert checks_watchdog.check_cache_space(env, True, 5.0, full).status == "FAIL"
    assert checks_watchdog.check_cache_space(env, False, 5.0, full).status == "WARN"
    assert checks_watchdog.check_incident_space(tmp_path, 5.0, full).status == "WARN"
    # The nearest existing parent of a cache that does not exist yet is what gets measured.
    assert full.seen[0] == tmp_path  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("total", "gpus_ccs", "status"),
    [
        (64 * MIB, ("10.0", "10.0"), "WARN"),  # Docker's default /dev/shm
        (16 * GIB, ("10.0", "10.0"), "PASS"),  # --shm-size=16g / an emptyDir {medium: Memory}
        (64 * MIB, ("10.0",), "SKIP"),  # one GPU: no NCCL shared memory
    ],
)
def test_shm_and_cache_with_chosen_sizes(
    tmp_path: Path, total: int, gpus_ccs: tuple[str, ...], status: str
) -> None:
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    usage = sized(total)
    shm = checks_watchdog.check_shm(inventory(*gpus_ccs), shm_dir, 5.0, usage)
    assert shm.status == status
    if status != "SKIP":
        assert usage.seen == [shm_dir]  # type: ignore[attr-defined]
        assert f"{shm_dir} is {total // MIB} MiB for 2 GPUs" == shm.reason
    if status == "WARN":
        assert any("shm-size" in f for f in shm.fixes)
        assert any("medium: Memory" in f for f in shm.fixes)
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    cache = checks_watchdog.check_cache_space(env, True, 5.0, sized(100 * GIB, 40 * GIB))
    assert cache.status == "PASS"
    assert cache.reason == f"40.0 GiB free for {tmp_path / '.cache/flashinfer'} (at {tmp_path})"


# -- hard deadlines: a probe that blocks never holds pre-flight up ----------------------------


@pytest.fixture
def blocked() -> Iterator[threading.Event]:
    """Released at teardown so the abandoned worker threads end."""
    gate = threading.Event()
    yield gate
    gate.set()


def test_hung_mount_hits_the_deadline(tmp_path: Path, blocked: threading.Event) -> None:
    def hung(_path: Path) -> Usage:  # statvfs on a dead NFS server
        blocked.wait(60)
        return Usage(GIB)

    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path)}
    started = time.monotonic()
    results = [
        checks_watchdog.check_cache_space(env, True, 0.2, hung),
        checks_watchdog.check_incident_space(tmp_path, 0.2, hung),
        checks_watchdog.check_shm(inventory("10.0", "10.0"), tmp_path, 0.2, hung),
    ]
    assert time.monotonic() - started < 10  # three 0.2 s deadlines, not 60 s blocks
    for result in results:
        assert result.status == "WARN" and "did not return within 0.2 s" in result.reason


def test_cdn_blocked_in_dns_hits_the_deadline(blocked: threading.Event) -> None:
    """httpx's timeout does not cover getaddrinfo; a transport that blocks stands in for it."""

    def resolve_forever(request: httpx.Request) -> httpx.Response:
        blocked.wait(60)
        return httpx.Response(200)

    client = httpx.Client(transport=httpx.MockTransport(resolve_forever), timeout=0.2)
    started = time.monotonic()
    result = checks_cubins.probe_cdn("http://127.0.0.1:9/cubins/", 0.3, client=client)
    assert time.monotonic() - started < 10
    assert result.status == "FAIL" and "did not answer within 0.3 s" in result.reason
    assert any("download-cubin" in f for f in result.fixes)


def test_exit_code_strict() -> None:
    results = checks_cubins.check_cubin_package(JIT, {}), check_gpus(inventory("10.0"))
    assert exit_code(results) == 0
    assert exit_code(results, strict=True) == 1
