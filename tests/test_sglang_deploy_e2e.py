"""SGLang under the shipped systemd unit and Kubernetes entrypoint, end to end.

A real `hang-watchdog run` with the shipped SGLang config watches the SGLang simulator started
by the shipped command line (systemd/sglang.service's ExecStart=, or the container command of
kubernetes/sglang through vllm-entrypoint.sh). The simulator hangs in FlashInfer's TRTLLM-gen
attention (GB300, FlashInfer 0.6.7); the watchdog's remediation writes the fallback file and
restarts it; the shipped command line then starts SGLang with `--attention-backend flashinfer`
(checked in the argv the server received) and it makes progress again. Only `systemctl`, the
kubelet and the `sglang` executable are stand-ins (tests/deploystandins.py).

Run under the shared lock:
`flock /tmp/e2e.lock python3 -m pytest -q tests/test_sglang_deploy_e2e.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploystandins import write_sglang, write_systemctl
from tests.simfixtures import sim_env
from watchdog.sim.cdn import free_port
from watchdog.sim.versions import write_dist_infos

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
FALLBACK_ARGS = ["--attention-backend", "flashinfer"]
# GB300 (the simulator's default, CC 10.3) with FlashInfer 0.6.7: SGLang's default trtllm_mha
# attention deadlocks (hang_unless_fallback), any other backend serves.
VERSIONS = {"sglang": "0.5.23", "flashinfer-python": "0.6.7"}
FAST = ["--no-cdn-default", "--tick-s", "0.5", "--stall-after-s", "3", "--suspect-after-s", "2",
        "--stack-second-after-s", "1", "--gpu-spin-for-s", "2", "--stop-grace-s", "5",
        "--cooldown-s", "0", "--recover-within-s", "60",
        "--metrics-addr", "127.0.0.1:0"]  # fmt: skip


class Rig:
    """Paths, stand-ins and environment shared by the server and the watchdog."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bindir = tmp / "bin"
        write_sglang(self.bindir)
        self.argv_log = tmp / "sglang-argv.jsonl"
        self.gpu = tmp / "gpu.jsonl"
        self.log = tmp / "server.log"
        self.fallback = tmp / "fallback" / "fallback.env"
        self.port = free_port()
        fake = tmp / "versions"
        write_dist_infos(str(fake), VERSIONS)  # the server's interpreter reports these
        sim = ["--engine", "sglang", "--scenario", "hang_unless_fallback", "--startup-s", "1",
               "--gpu-file", str(self.gpu), "--stats-interval", "1", "--health-timeout-s", "5",
               "--workdir", str(tmp)]  # fmt: skip
        self.env = sim_env(
            {
                "SGLANG_STANDIN_ARGV_LOG": str(self.argv_log),
                "SGLANG_STANDIN_SIM_ARGS": json.dumps(sim),
            }
        )
        self.env["PYTHONPATH"] = f"{fake}{os.pathsep}{self.env['PYTHONPATH']}"
        self.env["PATH"] = f"{self.bindir}{os.pathsep}{self.env['PATH']}"
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.err = tmp / "watchdog.err"

    def start_watchdog(self, config: Path, *extra: str) -> None:
        argv = [sys.executable, "-m", "watchdog", "run", "--config", str(config),
                "--gpu-source", f"file:{self.gpu}", "--server-url", f"http://127.0.0.1:{self.port}",
                "--state-dir", str(self.tmp / "state"), "--incident-dir", str(self.tmp / "inc"),
                "--fallback-file", str(self.fallback), "--remediate", *FAST, *extra]  # fmt: skip
        with open(self.err, "wb") as fh:
            self.watchdog = subprocess.Popen(argv, env=self.env, stdout=fh, stderr=fh, cwd=self.tmp)

    def text(self) -> str:
        return self.err.read_bytes().decode("utf-8", "replace") if self.err.exists() else ""

    def digest(self) -> str:
        """The watchdog's log with repeats of one message (timestamp aside) counted, not shown."""
        out: list[str] = []
        last, repeats = "", 0
        for line in self.text().splitlines():
            body = line.split(" ", 1)[-1]
            if body == last:
                repeats += 1
                continue
            if repeats:
                out.append(f"    (x{repeats} more)")
            out.append(line)
            last, repeats = body, 0
        if repeats:
            out.append(f"    (x{repeats} more)")
        return "\n".join(out)[-6000:]

    def wait_for(self, regex: str, timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while True:
            match = re.search(regex, self.text())
            if match:
                return match
            if time.monotonic() > end or (self.watchdog and self.watchdog.poll() is not None):
                raise AssertionError(f"no {regex!r}; watchdog log:\n{self.digest()}")
            time.sleep(0.2)

    def argvs(self) -> list[list[str]]:
        if not self.argv_log.exists():
            return []
        return [json.loads(line) for line in self.argv_log.read_text().splitlines()]

    def stop_watchdog(self) -> None:
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.send_signal(signal.SIGTERM)
            try:
                self.watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()

    def check_recovered(self, first: list[str], restarter: str) -> None:
        """Two starts: the shipped command line, then the same with the fallback appended; the
        restarted SGLang reports decode batches again."""
        self.wait_for(r"remediation: recovered", timeout=150)
        starts = self.argvs()
        assert len(starts) == 2, starts
        assert starts[0] == first and not set(FALLBACK_ARGS) & set(starts[0]), starts
        assert starts[1] == [*first, *FALLBACK_ARGS], starts
        assert (
            'HANG_WATCHDOG_FALLBACK_ARGS="--attention-backend flashinfer"'
            in self.fallback.read_text()
        )
        record = next(
            r for p in sorted((self.tmp / "inc").glob("*/incident.json"))
            if (r := json.loads(p.read_text()).get("remediation"))
        )  # fmt: skip
        assert record["plan"]["args"] == FALLBACK_ARGS, record
        assert record["plan"]["signature"] == "trtllm_attention_deadlock", record
        assert record["outcome"] == "recovered" and record["restarter"] == restarter, record


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.stop_watchdog()


# --- systemd -------------------------------------------------------------------------------
def _sglang_config(tmp: Path) -> Path:
    """systemd/sglang-config.toml, minus the journal (no journald here: the log is a file)."""
    text = (ROOT / "systemd" / "sglang-config.toml").read_text()
    assert 'journal_unit = "sglang.service"\n' in text
    out = tmp / "config.toml"
    out.write_text(text.replace('journal_unit = "sglang.service"\n', ""))
    return out


def test_systemd_unit_restarts_sglang_with_its_fallback(rig: Rig) -> None:
    unit = ROOT / "systemd" / "sglang.service"
    state = rig.tmp / "systemd"
    state.mkdir()
    write_systemctl(rig.bindir)
    operator_env = rig.tmp / "sglang.env"
    operator_env.write_text(f'SGLANG_MODEL=my-model\nSGLANG_SERVE_ARGS="--port {rig.port}"\n')
    paths = {
        "/etc/sglang/sglang.env": str(operator_env),
        "/var/lib/hang-watchdog/fallback.env": str(rig.fallback),
        "/opt/sglang/bin/sglang": str(rig.bindir / "sglang"),
    }
    rig.env.update(
        SYSTEMCTL_STANDIN_UNIT=str(unit), SYSTEMCTL_STANDIN_DIR=str(state),
        SYSTEMCTL_STANDIN_PATHS=json.dumps(paths),
    )  # fmt: skip
    systemctl = [str(rig.bindir / "systemctl")]
    subprocess.run([*systemctl, "start", "sglang.service"], env=rig.env, check=True, timeout=30)
    try:
        rig.start_watchdog(_sglang_config(rig.tmp), "--log-file", str(state / "sglang.service.log"))
        rig.check_recovered(
            ["serve", "--model-path", "my-model", "--port", str(rig.port)], "systemd"
        )
        assert "systemctl restart sglang.service" in rig.text()
        tail = (state / "sglang.service.log").read_text().rsplit("fired up and ready", 1)[-1]
        assert "Decode batch" in tail  # progress after the restart
    finally:
        rig.stop_watchdog()
        subprocess.run([*systemctl, "stop", "sglang.service"], env=rig.env, timeout=60)


# --- Kubernetes ----------------------------------------------------------------------------
def _built(kind: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone",
         str(ROOT / "kubernetes" / "sglang")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == kind]


class Kubelet:
    """Restarts the container's command whenever it exits, as restartPolicy: Always does."""

    def __init__(self, argv: list[str], env: dict[str, str], out: Path) -> None:
        self.argv, self.env, self.out = argv, env, out
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopped.is_set():
            with open(self.out, "ab") as fh:
                self.proc = subprocess.Popen(
                    self.argv, env=self.env, stdout=fh, stderr=fh, start_new_session=True
                )
            self.proc.wait()
            self.stopped.wait(0.5)

    def stop(self) -> None:
        self.stopped.set()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.thread.join(timeout=30)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kubernetes_entrypoint_restarts_sglang_with_its_fallback(rig: Rig) -> None:
    (deployment,) = _built("Deployment")
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "sglang"]  # fmt: skip
    assert server["command"] == ["/opt/hang-watchdog/vllm-entrypoint.sh"]
    args = list(server["args"])
    assert args[:2] == ["sglang", "serve"] and args[args.index("--port") + 1] == "8000"
    args[args.index("--port") + 1] = str(rig.port)  # a free port on this shared host
    env = {**rig.env, "HANG_WATCHDOG_LOG_FILE": str(rig.log),
           "HANG_WATCHDOG_FALLBACK_FILE": str(rig.fallback)}  # fmt: skip
    argv = ["bash", str(ROOT / "kubernetes" / "vllm-entrypoint.sh"), *args]
    kubelet = Kubelet(argv, env, rig.tmp / "container.out")
    try:
        rig.start_watchdog(
            ROOT / "kubernetes" / "sglang" / "config.toml", "--log-file", str(rig.log)
        )
        rig.check_recovered(args[1:], "kubernetes")
        assert "hang-watchdog fallback applied" in (rig.tmp / "container.out").read_text()
        tail = rig.log.read_text().rsplit("fired up and ready", 1)[-1]
        assert "Decode batch" in tail  # progress after the restart
    finally:
        rig.stop_watchdog()
        kubelet.stop()
