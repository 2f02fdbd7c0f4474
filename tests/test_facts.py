"""FactsSource against real child processes and a fake /proc tree; versions from an injected
lookup or the real one (metadata under /proc/PID/root, else the server's interpreter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from watchdog.knowledge import load_knowledge
from watchdog.sources.facts import FactsSource, speculative_decoding, trtllm_attention

# The distributions the daemon reads: the shipped profiles' and FlashInfer's and torch's.
KNOWN = load_knowledge()
PACKAGES, MODULES = KNOWN.packages, KNOWN.modules


def shipped_facts(**kw: Any) -> FactsSource:
    """A facts source reading the shipped profiles' packages, as the wiring builds it."""
    return FactsSource(packages=PACKAGES, modules=MODULES, **kw)


SLEEPER = "import time; time.sleep(600)"
Spawn = Callable[..., subprocess.Popen[Any]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[Any]] = []

    def _spawn(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
        full = {"PATH": os.environ.get("PATH", ""), **(env or {})}
        p = subprocess.Popen(argv, env=full)
        started.append(p)
        _wait(lambda: _cmdline(p.pid) == argv)
        return p

    yield _spawn
    for p in started:
        p.kill()
        p.wait(timeout=10)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode() for a in raw.split(b"\0") if a]


def _wait(cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return value


class GatedVersions:
    """A version lookup that answers only when released, and records its calls."""

    def __init__(self, answer: Mapping[str, str | None]) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __call__(
        self, pid: int, python: str, environ: Mapping[str, str]
    ) -> Mapping[str, str | None]:
        self.calls.append((python, dict(environ)))
        assert self.release.wait(30)
        return self.answer


def test_facts_of_a_python_target_without_blocking(spawn: Spawn) -> None:
    argv = [sys.executable, "-c", SLEEPER, "--attention-config.use_trtllm_attention=0"]
    env = {"FLASHINFER_CUBINS_REPOSITORY": "https://mirror.example/cubins/"}
    p = spawn(argv, env)
    versions = GatedVersions({"flashinfer-python": "0.6.7", "vllm": "0.11.0", "torch": None})
    src = shipped_facts(versions=versions)
    early = src.read(p.pid)  # the lookup is blocked: poll still answers
    assert early["python"] == os.path.realpath(sys.executable)
    assert early["cmdline"] == argv and early["flashinfer-python"] is None
    assert early["trtllm_attention"] is False
    assert early["cubins_repository"] == "https://mirror.example/cubins/"
    assert early["flashinfer_no_download"] is False
    assert early["environ"]["FLASHINFER_CUBINS_REPOSITORY"] == env["FLASHINFER_CUBINS_REPOSITORY"]
    versions.release.set()
    done = _wait(lambda: (f := src.read(p.pid))["flashinfer-python"] and f)
    assert (done["flashinfer-python"], done["vllm"], done["torch"]) == ("0.6.7", "0.11.0", None)
    assert done["flashinfer-cubin"] is None and src.health.up
    assert len(versions.calls) == 1  # once per target PID, not once per tick
    assert (
        versions.calls[0][1]["FLASHINFER_CUBINS_REPOSITORY"] == env["FLASHINFER_CUBINS_REPOSITORY"]
    )


def test_new_target_pid_gets_fresh_facts(spawn: Spawn) -> None:
    a = spawn([sys.executable, "-c", SLEEPER], {"FLASHINFER_NO_DOWNLOAD": "1"})
    b = spawn([sys.executable, "-c", SLEEPER, "--attention-config.use_trtllm_attention", "1"])
    versions = GatedVersions({"vllm": "0.9.2"})
    versions.release.set()
    src = shipped_facts(versions=versions)
    fa = src.read(a.pid)
    assert fa["flashinfer_no_download"] is True and fa["trtllm_attention"] is None
    fb = src.read(b.pid)
    assert fb["flashinfer_no_download"] is False and fb["trtllm_attention"] is True
    _wait(lambda: len(versions.calls) == 2)


def test_non_python_target_has_no_versions(spawn: Spawn) -> None:
    sleep = shutil.which("sleep") or "/bin/sleep"
    p = spawn([sleep, "600"], {"VLLM_USE_TRTLLM_ATTENTION": "0"})
    versions = GatedVersions({})
    src = shipped_facts(versions=versions)
    facts = src.read(p.pid)
    assert facts["python"] is None and facts["vllm"] is None
    assert facts["trtllm_attention"] is False
    assert versions.calls == [] and src.health.up


def test_failed_lookup_marks_down_and_keeps_facts(spawn: Spawn) -> None:
    p = spawn([sys.executable, "-c", SLEEPER])

    def broken(pid: int, python: str, environ: Mapping[str, str]) -> Mapping[str, str | None]:
        raise RuntimeError("interpreter exited with status 1")

    src = shipped_facts(versions=broken)
    assert src.read(p.pid)["cmdline"]
    _wait(lambda: not src.health.up)
    assert "status 1" in (src.health.last_error or "")
    assert src.read(p.pid)["torch"] is None


def test_no_target_and_vanished_target() -> None:
    src = shipped_facts(versions=GatedVersions({}))
    assert src.read(None) == {}
    facts = src.read(2**22 + 12345)
    assert facts["cmdline"] == [] and facts["python"] is None and not src.health.up


def test_real_version_lookup_in_the_target_environment(spawn: Spawn, tmp_path: Path) -> None:
    dist = tmp_path / "flashinfer_python-0.6.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.7\n"
    )
    p = spawn([sys.executable, "-c", SLEEPER], {"PYTHONPATH": str(tmp_path)})
    # The default lookup: watchdog.sources.pyenv, run with the target's environment.
    src = shipped_facts()
    facts = _wait(lambda: (f := src.read(p.pid))["flashinfer-python"] and f)
    assert facts["flashinfer-python"] == "0.6.7" and facts["flashinfer-cubin"] is None


def write_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


SIDECAR_PID = 4242


def fake_proc(tmp_path: Path, exe: str, env: Mapping[str, str], argv0: str) -> Path:
    """A captured-style /proc with one process whose filesystem is proc/PID/root."""
    proc = tmp_path / "proc"
    pid_dir = proc / str(SIDECAR_PID)
    (pid_dir / "root").mkdir(parents=True)
    (pid_dir / "exe").symlink_to(exe)  # readlink only: the target need not exist here
    (pid_dir / "cmdline").write_bytes(f"{argv0}\0-m\0vllm.entrypoints.openai.api_server\0".encode())
    (pid_dir / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    return proc


def test_versions_come_from_the_target_root_in_a_sidecar(tmp_path: Path) -> None:
    """The server container's packages, read through /proc/PID/root; the watchdog's own
    environment has none of them and /opt/venv does not exist outside the fake root."""
    proc = fake_proc(tmp_path, "/usr/bin/python3.12", {"PATH": "/opt/venv/bin:/usr/bin"}, "python3")
    venv = proc / str(SIDECAR_PID) / "root" / "opt" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3.12")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.3\n")
    site = venv / "lib" / "python3.12" / "site-packages"
    server = {"vllm": "0.11.2", "flashinfer-python": "0.6.7", "flashinfer-cubin": "0.6.7"}
    for name, version in {**server, "torch": "2.9.0+cu130"}.items():
        write_dist(site, name, version)
    src = shipped_facts(proc_root=str(proc))
    facts = _wait(lambda: (f := src.read(SIDECAR_PID))["vllm"] and f)
    assert {k: facts[k] for k in server} == server and facts["torch"] == "2.9.0+cu130"
    assert facts["flashinfer-jit-cache"] is None and facts["python"] == "/usr/bin/python3.12"
    assert src.health.up


def test_nothing_under_the_root_falls_back_to_the_interpreter(tmp_path: Path) -> None:
    write_dist(tmp_path / "site", "flashinfer-cubin", "0.6.7.post2")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    proc = fake_proc(tmp_path, os.path.realpath(sys.executable), env, sys.executable)
    src = shipped_facts(proc_root=str(proc))
    facts = _wait(lambda: (f := src.read(SIDECAR_PID))["flashinfer-cubin"] and f)
    assert facts["flashinfer-cubin"] == "0.6.7.post2" and src.health.up


def test_another_mount_namespace_never_runs_the_interpreter_here(tmp_path: Path) -> None:
    """An empty root in another mount namespace: running the path here would read our packages."""
    env = {"PYTHONPATH": str(tmp_path / "site")}
    write_dist(tmp_path / "site", "vllm", "0.0.0-ours")
    proc = fake_proc(tmp_path, os.path.realpath(sys.executable), env, sys.executable)
    for pid, ns in ((str(SIDECAR_PID), "mnt:[4026532999]"), ("self", "mnt:[4026531841]")):
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "ns" / "mnt").symlink_to(ns)
    src = shipped_facts(proc_root=str(proc))
    assert src.read(SIDECAR_PID)["cmdline"]
    _wait(lambda: not src.health.up)
    assert "another mount namespace" in (src.health.last_error or "")
    assert src.read(SIDECAR_PID)["vllm"] is None


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, None),
        (["--attention-config.use_trtllm_attention=0"], {}, False),
        (["--attention-config.use_trtllm_attention=false"], {}, False),
        (["--attention-config.use_trtllm_attention", "0"], {}, False),
        (["--attention-config.use-trtllm-attention=1"], {}, True),
        (["--attention-config", '{"use_trtllm_attention": false}'], {}, False),
        (['--attention-config={"use_trtllm_attention": true}'], {}, True),
        (["--attention-config", '{"backend": "FLASHINFER"}'], {}, None),
        (["--attention-config", '{"use_trtllm_attention": null}'], {"X": "1"}, None),
        ([], {"VLLM_USE_TRTLLM_ATTENTION": "1"}, True),
        ([], {"VLLM_USE_TRTLLM_ATTENTION": "True"}, True),
        ([], {"VLLM_USE_TRTLLM_ATTENTION": "0"}, False),
        ([], {"VLLM_USE_TRTLLM_ATTENTION": "yes"}, False),
        (["--attention-config.use_trtllm_attention=1"], {"VLLM_USE_TRTLLM_ATTENTION": "0"}, True),
        (
            [
                "--attention-config.use_trtllm_attention=1",
                "--attention-config.use_trtllm_attention=0",
            ],
            {},
            False,
        ),
    ],
)
def test_trtllm_attention_setting(
    argv: list[str], env: dict[str, str], expected: bool | None
) -> None:
    assert trtllm_attention(["vllm", "serve", "m", *argv], env) is expected


def test_same_target_environment_is_read_again_only_every_recheck_s(tmp_path: Path) -> None:
    """A re-exec (same PID, new environment) is seen at the next recheck, not every tick."""
    env = {"FLASHINFER_CUBINS_REPOSITORY": "https://one.example/"}
    proc = fake_proc(tmp_path, "/nonexistent/bin/true", env, "true")
    now = [100.0]
    src = shipped_facts(
        proc_root=str(proc),
        clock=lambda: now[0],
        recheck_s=10.0,
    )
    assert src.read(SIDECAR_PID)["cubins_repository"] == "https://one.example/"
    environ = proc / str(SIDECAR_PID) / "environ"
    environ.write_bytes(b"FLASHINFER_CUBINS_REPOSITORY=https://two.example/\0")
    now[0] += 9.0
    assert src.read(SIDECAR_PID)["cubins_repository"] == "https://one.example/"
    now[0] += 1.0
    assert src.read(SIDECAR_PID)["cubins_repository"] == "https://two.example/"


def _sglang_root(tmp_path: Path, dists: Mapping[str, str]) -> Path:
    """A sidecar-style /proc whose target runs `sglang serve` from /opt/venv."""
    proc = fake_proc(tmp_path, "/usr/bin/python3.12", {"PATH": "/opt/venv/bin:/usr/bin"}, "python3")
    cmdline = b"/opt/venv/bin/python3\0-m\0sglang.launch_server\0--model-path\0m\0"
    (proc / str(SIDECAR_PID) / "cmdline").write_bytes(cmdline)
    venv = proc / str(SIDECAR_PID) / "root" / "opt" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3.12")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.3\n")
    for name, version in dists.items():
        write_dist(venv / "lib" / "python3.12" / "site-packages", name, version)
    return proc


def test_sglang_environment_reports_the_engine_version(tmp_path: Path) -> None:
    """sglang's dist-info (and its kernel wheel) are read like vllm's; the engine in force is
    named with its version for verdicts and bundles."""
    from watchdog.engines.detect import EngineInForce
    from watchdog.engines.loader import load_engines

    dists = {"sglang": "0.5.23", "sglang-kernel": "0.4.10", "flashinfer-python": "0.7.2"}
    proc = _sglang_root(tmp_path, dists)
    engines = load_engines()
    engine = EngineInForce().observed(engines, "python3 -m sglang.launch_server --model-path m", [])
    src = shipped_facts(proc_root=str(proc))
    facts = _wait(lambda: (f := src.read(SIDECAR_PID, engine))["sglang"] and f)
    assert {k: facts[k] for k in dists} == dists and facts["vllm"] is None
    assert facts["sgl-kernel"] is None and facts["tensorrt_llm"] is None
    assert (facts["engine"], facts["engine_package"], facts["engine_version"]) == (
        "sglang",
        "sglang",
        "0.5.23",
    )


def test_operator_profile_package_is_collected(tmp_path: Path) -> None:
    from watchdog.engines.detect import EngineInForce
    from watchdog.engines.loader import load_engines
    from watchdog.sources.pyenv import packages_for

    profile = tmp_path / "acme.toml"
    profile.write_text(
        'schema = 1\n[[engine]]\nname = "acme"\nversion_package = "acme-serve"\n'
        'packages = ["acme-kernels"]\n[engine.detect]\ncmdline = ["acme-serve"]\n'
    )
    engines = load_engines([profile])
    dists = {"acme-serve": "1.2.3", "acme-kernels": "0.9", "torch": "2.9.0"}
    proc = _sglang_root(tmp_path, dists)
    src = FactsSource(proc_root=str(proc), packages=packages_for(engines))
    acme = EngineInForce.at_start(engines, "acme")
    facts = _wait(lambda: (f := src.read(SIDECAR_PID, acme))["acme-serve"] and f)
    assert (facts["acme-serve"], facts["acme-kernels"], facts["torch"]) == ("1.2.3", "0.9", "2.9.0")
    assert facts["engine"] == "acme" and facts["engine_version"] == "1.2.3"
    # Without the operator's list the shipped one has no idea of acme's packages.
    plain = shipped_facts(proc_root=str(proc))
    assert "acme-serve" not in _wait(lambda: (f := plain.read(SIDECAR_PID))["torch"] and f)


def test_a_retitled_server_environment_comes_from_the_child_that_keeps_it(tmp_path: Path) -> None:
    """setproctitle wrote `VLLM::APIServer` over the API server's environment block; its
    untitled child (multiprocessing's resource tracker) keeps the whole environment."""
    env = {"FLASHINFER_CUBINS_REPOSITORY": "http://127.0.0.1:9/", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = fake_proc(tmp_path, "/nonexistent/bin/python3", env, "python3")
    pid_dir = proc / str(SIDECAR_PID)
    kept = (pid_dir / "environ").read_bytes()
    (pid_dir / "environ").write_bytes(b"ngine\0")  # the title's leftovers
    child = proc / "4343"
    child.mkdir()
    (child / "environ").write_bytes(kept)
    (pid_dir / "task" / str(SIDECAR_PID)).mkdir(parents=True)
    (pid_dir / "task" / str(SIDECAR_PID) / "children").write_text("4343 ")
    now = [0.0]
    src = shipped_facts(
        proc_root=str(proc),
        clock=lambda: now[0],
        recheck_s=10.0,
    )
    facts = src.read(SIDECAR_PID)
    assert facts["cubins_repository"] == "http://127.0.0.1:9/"
    assert facts["server_env"] == env
    # The child gone later, a fragment re-read is no new environment: what was read is kept.
    (child / "environ").write_bytes(b"")
    now[0] += 20
    assert src.read(SIDECAR_PID)["server_env"] == env


@pytest.mark.parametrize(
    ("argv", "on"),
    [
        (["vllm", "serve", "m", "--speculative-config", '{"method": "mtp"}'], True),
        (["vllm", "serve", "m", '--speculative_config={"method":"eagle3"}'], True),
        (["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE"], True),
        (["vllm", "serve", "m", "--speculative-config", "null"], False),
        (["vllm", "serve", "m", "--max-model-len", "8192"], False),
    ],
)
def test_speculative_decoding_read_from_the_command_line(argv: list[str], on: bool) -> None:
    assert speculative_decoding(argv) is on
