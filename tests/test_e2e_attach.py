"""End to end, attach mode: `diagnose --pid` against a real simulated vLLM process tree.

Real processes, real loopback sockets (the stand-in CDN), real py-spy; only the GPU is a fake
(the simulator's JSON Lines file). Every run passes `--no-cdn-default`, so nothing ever resolves
or contacts the real CDN host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import simfixtures
from tests.simfixtures import SimHandle, sim_env

pytestmark = pytest.mark.slow  # real watchdog and simulator processes

sim_factory = simfixtures.sim_factory  # fixtures, used by name
cdn_factory = simfixtures.cdn_factory

# Short thresholds for the tests that are not about default timing.
SHORT = [
    "--stall-after-s",
    "6",
    "--suspect-after-s",
    "3",
    "--stack-second-after-s",
    "1",
    "--gpu-spin-for-s",
    "4",
]
DEADLINE_S = 150.0  # generous: a loaded 2-core machine must not fail a run that works


def watchdog_argv(*args: str) -> list[str]:
    """`python -m watchdog ...` with the real-CDN default always off."""
    return [sys.executable, "-m", "watchdog", *args, "--no-cdn-default"]


def sim_sources(sim: SimHandle) -> list[str]:
    """The flags that point the watchdog at a sim's GPU file and log."""
    return ["--gpu-source", f"file:{sim.gpu_file}", "--log-file", str(sim.log_file)]


def diagnose(tmp_path: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run `diagnose` to completion; stdout and stderr as text."""
    return subprocess.run(
        watchdog_argv("diagnose", *args),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=sim_env(),
        cwd=tmp_path,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line as a JSON object; fails naming the first line that is not one."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"stderr line is not JSON: {line!r}") from exc
        assert isinstance(obj, dict), line
        out.append(obj)
    return out


def evidence_sources(verdict: dict[str, Any]) -> set[str]:
    return {e["source"] for e in verdict["evidence"]}


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `cond` until it holds; AssertionError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def test_cubin_stall_serve_reported_on_defaults(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """The headline case on default thresholds: verdict, evidence, bundle, JSON stderr, latency."""
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        mode="serve",
        extra_args=["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"],
    )
    args = ["--pid", str(sim.pid), "--server-url", f"http://127.0.0.1:{sim.port}"]
    args += [*sim_sources(sim), "--cdn-host", f"127.0.0.1:{cdn}"]
    args += ["--duration", "100", "--until-hang"]
    args += ["--incident-dir", str(tmp_path / "inc"), "--log-format", "json", "--json"]
    err_path = tmp_path / "diagnose.err"
    with open(err_path, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            watchdog_argv("diagnose", *args),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=sim_env(),
            cwd=tmp_path,
        )
        onset = hung = None
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline:
            if onset is None and "flashinfer.jit: Fetching" in sim.log_text():
                onset = time.monotonic()
            if hung is None and '"new": "hung"' in err_path.read_text(encoding="utf-8"):
                hung = time.monotonic()
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=30)
    stderr = err_path.read_text(encoding="utf-8")
    if hung is None and '"new": "hung"' in stderr:
        hung = time.monotonic()  # --until-hang exited between two polls: an upper bound
    assert proc.returncode == 1, (
        f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{stderr[-3000:]}"
    )
    verdict = json.loads(out)
    assert verdict["state"] == "hung" and verdict["signature"] == "cubin_download_stall", verdict
    sources = evidence_sources(verdict)
    assert sources & {"gpu", "progress", "server"}, sources
    assert {"conns", "log"} <= sources, sources
    assert any(
        f"127.0.0.1:{cdn}" in e["detail"] for e in verdict["evidence"] if e["source"] == "conns"
    )
    bundles = list((tmp_path / "inc").iterdir())
    assert len(bundles) == 1 and (bundles[0] / "incident.json").is_file(), bundles
    recorded = json.loads((bundles[0] / "incident.json").read_text(encoding="utf-8"))
    assert "cubin_download_stall" in json.dumps(recorded)
    events = json_lines(stderr)
    states = [e for e in events if e.get("event") == "state"]
    assert states and all("new" in e and "verdict" in e for e in states), states
    assert (
        states[-1]["new"] == "hung" and states[-1]["verdict"]["signature"] == "cubin_download_stall"
    )
    assert any(e.get("event") == "verdict" for e in events)
    assert onset is not None and hung is not None, (onset, hung)
    print(
        f"cubin_download_stall reported {hung - onset:.1f} s after the first fetch line (defaults)"
    )
    assert hung - onset < 60


def test_cubin_stall_bench_attach(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """`vllm bench throughput` stuck on the cubin download is named, with a bundle."""
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall", extra_args=["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/"]
    )
    args = ["--pid", str(sim.pid), *sim_sources(sim), "--cdn-host", f"127.0.0.1:{cdn}", *SHORT]
    args += ["--duration", "30", "--until-hang", "--incident-dir", str(tmp_path / "inc")]
    done = diagnose(tmp_path, args)
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"
    assert "HUNG  cubin_download_stall (confidence" in done.stdout, done.stdout
    assert list((tmp_path / "inc").iterdir())


def no_trouble_lines(stderr: str) -> list[str]:
    """Stderr state lines that entered hung or stalled (a finished bench may end `dead`)."""
    return [
        e["message"]
        for e in json_lines(stderr)
        if e.get("event") == "state" and e.get("new") in ("hung", "stalled")
    ]


def test_healthy_bench_no_hang(tmp_path: Path, sim_factory: Callable[..., SimHandle]) -> None:
    """A benchmark that runs and finishes is never called hung or stalled. Once it has exited
    the target is gone, so diagnose ends `dead` with exit 1 (one rule: dead is not ok)."""
    sim = sim_factory("healthy", extra_args=["--bench-s", "4"])
    args = [
        "--pid",
        str(sim.pid),
        *sim_sources(sim),
        *SHORT,
        "--duration",
        "25",
        "--log-format",
        "json",
    ]
    done = diagnose(tmp_path, args)
    assert sim.process.poll() == 0, "the healthy bench should have finished within the run"
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.stdout.startswith("DEAD\n") and "the server process is gone" in done.stdout
    assert no_trouble_lines(done.stderr) == []
    assert "Throughput:" in sim.log_text()


def test_healthy_serve_with_load_no_hang(
    tmp_path: Path, sim_factory: Callable[..., SimHandle]
) -> None:
    """A server answering steady load for 25 s is reported serving, never hung or stalled."""
    sim = sim_factory("healthy", mode="serve", extra_args=["--load", "4"])
    # Kept on the old flag on purpose: `--vllm-url` still works for one release, with one
    # deprecation line (the other attach tests use `--server-url`).
    args = ["--pid", str(sim.pid), "--vllm-url", f"http://127.0.0.1:{sim.port}", *sim_sources(sim)]
    args += [*SHORT, "--duration", "25", "--log-format", "json"]
    done = diagnose(tmp_path, args)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert no_trouble_lines(done.stderr) == []
    assert any(e.get("new") == "serving" for e in json_lines(done.stderr)), done.stderr[-2000:]
    notes = [e["message"] for e in json_lines(done.stderr) if "deprecated" in e.get("message", "")]
    assert notes == [
        "command line: --vllm-url is deprecated and kept for one release; use --server-url instead"
    ]


@pytest.mark.parametrize(
    ("cc", "expected"),
    [("10.3", "trtllm_attention_deadlock"), ("10.0", "gpu_kernel_spin")],
)
def test_kernel_deadlock_by_compute_capability(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cc: str, expected: str
) -> None:
    """The same spinning kernel is the SM103 FlashInfer deadlock only on CC 10.3."""
    extra = ["--fake-versions", "flashinfer-python=0.6.7"] + ([] if cc == "10.3" else ["--cc", cc])
    sim = sim_factory("kernel_deadlock", extra_args=extra)
    args = [
        "--pid",
        str(sim.pid),
        *sim_sources(sim),
        *SHORT,
        "--duration",
        "60",
        "--until-hang",
        "--json",
    ]
    done = diagnose(tmp_path, args)
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    verdict = json.loads(done.stdout)
    assert verdict["state"] == "hung" and verdict["signature"] == expected, verdict
    assert {"gpu", "progress"} <= evidence_sources(verdict), verdict["evidence"]


def test_secrets_in_the_servers_environment_and_argv_never_reach_disk(
    tmp_path: Path, sim_factory: Callable[..., SimHandle], cdn_factory: Callable[[str], int]
) -> None:
    """Plant secrets in the simulated server; nothing the watchdog writes may contain them."""
    secrets = {
        "HF_TOKEN": "hf_plantedSecretValue0001",
        "VLLM_API_KEY": "planted-api-key-0002",
        "FLASHINFER_CUBINS_REPOSITORY": "https://user:planted-pass-0003@127.0.0.1:9/artifactory/",
    }
    argv_secret = "planted-argv-key-0004"
    cdn = cdn_factory("blackhole")
    sim = sim_factory(
        "cubin_download_stall",
        extra_args=["--cdn-url", f"http://127.0.0.1:{cdn}/artifactory/", "--api-key", argv_secret],
        env=secrets,
    )
    args = ["--pid", str(sim.pid), *sim_sources(sim), "--cdn-host", f"127.0.0.1:{cdn}", *SHORT]
    args += ["--duration", "60", "--until-hang", "--incident-dir", str(tmp_path / "inc")]
    done = diagnose(tmp_path, args)
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"
    files = [p for p in (tmp_path / "inc").rglob("*") if p.is_file()]
    assert any(p.parent.name == "stacks" for p in files), files  # the dumps were written
    env = json.loads(next(p for p in files if p.name == "incident.json").read_text())
    assert env["environment"]["env"]["HF_TOKEN"] == "<redacted>"
    planted = [*(v.split("@")[0].split(":")[-1] for v in secrets.values()), argv_secret]
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for secret in planted:
            assert secret not in text, f"{secret!r} reached {path}"
    for secret in planted:
        assert secret not in done.stdout and secret not in done.stderr
