"""kubernetes/sglang builds with kustomize, validates strictly, and agrees with its config."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes import KV, VERSIONS
from watchdog.config import load_config
from watchdog.engines.detect import detect_engine
from watchdog.engines.loader import load_engines

ROOT = Path(__file__).resolve().parents[1]
OVERLAY = ROOT / "kubernetes" / "sglang"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def built() -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(OVERLAY)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in built() if d["kind"] == kind]
    return doc


def containers() -> dict[str, dict[str, Any]]:
    spec = one("Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec["containers"], *spec["initContainers"]]}


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["Deployment", "Service"])
def test_built_manifests_pass_strict_validation(tmp_path: Path, kind: str, version: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(one(kind)))
    result = subprocess.run(
        [*KV, "--strict", "-k", version, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout and "WARN" not in result.stdout, result.stdout


def test_server_runs_sglang_through_the_entrypoint() -> None:
    server = containers()["sglang"]
    assert server["command"] == ["/opt/hang-watchdog/vllm-entrypoint.sh"]
    args = server["args"]
    assert args[:2] == ["sglang", "serve"], args
    # SGLang binds 127.0.0.1 by default: the Service needs --host 0.0.0.0; /metrics needs
    # --enable-metrics; the port is the one the Service and the watchdog use.
    assert args[args.index("--host") + 1] == "0.0.0.0" and "--enable-metrics" in args
    port = int(args[args.index("--port") + 1])
    assert [p["containerPort"] for p in server["ports"]] == [port]
    cfg = load_config(OVERLAY / "config.toml")
    assert str(cfg.server_url).endswith(f":{port}")
    assert "livenessProbe" not in server  # SGLang's /health is 503 while warming up


def test_config_finds_sglang_and_not_the_sidecar() -> None:
    cfg = load_config(OVERLAY / "config.toml")
    assert cfg.engine == "sglang" and cfg.restarter == "kubernetes" and cfg.remediate is False
    match = re.compile(str(cfg.match))
    server = containers()["sglang"]
    assert match.search(" ".join(server["args"]))
    assert match.search("/usr/bin/python3 -m sglang.launch_server --model-path /models/model")
    sidecar = containers()["hang-watchdog"]
    assert not match.search(" ".join(["hang-watchdog", *sidecar["args"]]))
    assert not match.search("python3 -u -c import os, sys /shared/logs/sglang.log 104857600")
    server_env = env_of(server)
    assert cfg.log_files == [server_env["HANG_WATCHDOG_LOG_FILE"]]
    assert cfg.fallback_file == server_env["HANG_WATCHDOG_FALLBACK_FILE"]
    # Without `engine`, the profile would be detected from the same command line.
    profile, _ = detect_engine(load_engines(), "/bin/sglang " + " ".join(server["args"][1:]))
    assert profile.name == "sglang"


def test_preflight_checks_what_sglang_gets() -> None:
    init = containers()["preflight"]
    assert "--engine=sglang" in init["args"]
    (server_args,) = [a.split("=", 1)[1] for a in init["args"] if a.startswith("--server-args=")]
    served = containers()["sglang"]["args"]
    assert shlex.split(server_args) == served[served.index("/models/model") + 1 :]


def test_names_and_selectors_agree() -> None:
    deployment, service, monitor = one("Deployment"), one("Service"), one("ServiceMonitor")
    pod = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "sglang"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod.items()
    assert service["spec"]["selector"].items() <= pod.items()
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    maps = {d["metadata"]["name"] for d in built() if d["kind"] == "ConfigMap"}
    assert volumes["config"]["configMap"]["name"] in maps
    assert volumes["entrypoint"]["configMap"]["name"] in maps
    assert "vllm" not in " ".join(pod.values())
