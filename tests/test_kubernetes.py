"""Kubernetes manifests validate strictly, agree with each other, and the vLLM entrypoint works."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes import KV, VERSIONS
from watchdog.config import load_config
from watchdog.preflight.checks_watchdog import flashinfer_cache_dir

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "kubernetes"
ENTRYPOINT = K8S / "vllm-entrypoint.sh"
ALERTS = ROOT / "prometheus" / "alerts.yml"
CORE_MANIFESTS = ["deployment.yaml", "service.yaml"]
CRD_MANIFESTS = ["servicemonitor.yaml", "prometheusrule.yaml"]


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def kubernetes_validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KV, "--strict", "-k", version, str(path)], capture_output=True, text=True, timeout=120
    )


def pod_spec() -> dict[str, Any]:
    (deployment,) = docs("deployment.yaml")
    return deployment["spec"]["template"]["spec"]


def container(name: str) -> dict[str, Any]:
    return next(c for c in pod_spec()["containers"] if c["name"] == name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", CORE_MANIFESTS)
def test_core_manifests_pass_strict_validation(name: str, version: str) -> None:
    result = kubernetes_validate(K8S / name, version)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout and "WARN" not in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("shareProcessNamespace: true", "shareProcessNamespace: yes-please"),
        ("readOnlyRootFilesystem: true", "readOnlyRootFilesystm: true"),
        ("containerPort: 9433", "containerPort: watchdog"),
    ],
)
def test_strict_validation_fails_on_a_broken_copy(tmp_path: Path, old: str, new: str) -> None:
    text = (K8S / "deployment.yaml").read_text()
    assert old in text
    broken = tmp_path / "deployment.yaml"
    broken.write_text(text.replace(old, new, 1))
    result = kubernetes_validate(broken, VERSIONS[-1])
    assert result.returncode != 0
    assert "ERROR" in result.stdout


@pytest.mark.parametrize("name", CRD_MANIFESTS)
def test_crds_are_not_schema_checked_but_are_well_formed(name: str) -> None:
    """kubernetes-validate ships no Prometheus Operator schemas: it warns and we check the shape."""
    result = kubernetes_validate(K8S / name, VERSIONS[-1])
    assert result.returncode == 0
    assert "Couldn't find schema" in result.stdout
    (doc,) = docs(name)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert doc["metadata"]["name"]


def test_servicemonitor_scrapes_the_watchdog_port_of_the_service() -> None:
    (service,) = docs("service.yaml")
    (monitor,) = docs("servicemonitor.yaml")
    labels = monitor["spec"]["selector"]["matchLabels"]
    assert labels.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    watchdog_port = next(p for p in container("hang-watchdog")["ports"] if p["name"] == "watchdog")
    assert port["targetPort"] == "watchdog" and watchdog_port["containerPort"] == 9433
    assert service["spec"]["selector"].items() <= pod_labels().items()


def pod_labels() -> dict[str, str]:
    (deployment,) = docs("deployment.yaml")
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_sidecar_security_and_probes() -> None:
    assert pod_spec()["shareProcessNamespace"] is True
    sidecar = container("hang-watchdog")
    sc = sidecar["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    cfg = load_config(K8S / "config.toml")
    expected = {"SYS_PTRACE", "KILL"} if cfg.remediate and not cfg.dry_run else {"SYS_PTRACE"}
    assert set(sc["capabilities"]["add"]) == expected
    probe = sidecar["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "watchdog"}
    for c in [*pod_spec()["containers"], *pod_spec()["initContainers"]]:
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
    assert "livenessProbe" not in container("vllm")  # /health lies during hangs


def test_config_and_volumes_agree() -> None:
    cfg = load_config(K8S / "config.toml")
    assert cfg.metrics_addr.startswith("0.0.0.0:") and cfg.restarter == "kubernetes"
    sidecar_mounts = {m["mountPath"]: m for m in container("hang-watchdog")["volumeMounts"]}
    vllm_mounts = {m["mountPath"]: m for m in container("vllm")["volumeMounts"]}
    vllm_env = {e["name"]: e["value"] for e in container("vllm")["env"]}
    fallback_dir = str(Path(str(cfg.fallback_file)).parent)
    assert vllm_env["HANG_WATCHDOG_FALLBACK_FILE"] == cfg.fallback_file
    assert not sidecar_mounts[fallback_dir].get("readOnly")
    assert vllm_mounts[fallback_dir]["readOnly"] is True
    assert sidecar_mounts[fallback_dir]["name"] == vllm_mounts[fallback_dir]["name"]
    (log_file,) = cfg.log_files
    log_dir = str(Path(log_file).parent)
    assert vllm_env["HANG_WATCHDOG_LOG_FILE"] == log_file
    assert sidecar_mounts[log_dir]["name"] == vllm_mounts[log_dir]["name"]
    for path in (cfg.state_dir, str(cfg.incident_dir)):
        assert any(path.startswith(p) for p, m in sidecar_mounts.items() if not m.get("readOnly"))
    assert container("vllm")["command"] == ["/opt/hang-watchdog/vllm-entrypoint.sh"]


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def test_preflight_init_container_measures_what_vllm_gets() -> None:
    """The shm and cache_space checks look at vLLM's /dev/shm and FlashInfer cache, not the
    init container's own (64 MiB runtime default; uid 10001's $HOME)."""
    (init,) = [c for c in pod_spec()["initContainers"] if c["name"] == "preflight"]
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    vllm_mounts = {m["mountPath"]: m["name"] for m in container("vllm")["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert init_mounts.get("/dev/shm") == vllm_mounts["/dev/shm"]
    assert volumes[vllm_mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    base = env_of(init)["FLASHINFER_WORKSPACE_BASE"]
    assert env_of(container("vllm"))["FLASHINFER_WORKSPACE_BASE"] == base
    assert init_mounts.get(base) == vllm_mounts[base]
    assert str(flashinfer_cache_dir(env_of(init))).startswith(base + "/")
    gpus = [c["resources"]["limits"]["nvidia.com/gpu"] for c in (init, container("vllm"))]
    assert gpus[0] == gpus[1]  # the shm check needs the server's GPU count


def test_kustomization_lists_every_manifest_and_generated_file() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kust["resources"]) == set(CORE_MANIFESTS + CRD_MANIFESTS)
    generated = {g["name"]: g["files"] for g in kust["configMapGenerator"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert generated == {
        volumes["config"]["configMap"]["name"]: ["config.toml"],
        volumes["entrypoint"]["configMap"]["name"]: ["vllm-entrypoint.sh"],
    }
    for name in [*kust["resources"], "config.toml", "vllm-entrypoint.sh"]:
        assert (K8S / name).is_file(), name


def make_rule(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(K8S / "make_prometheusrule.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_shipped_prometheusrule_wraps_alerts_yml_exactly() -> None:
    result = make_rule("--check")
    assert result.returncode == 0, result.stderr
    (rule,) = docs("prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_prometheusrule_generator_round_trip_and_check(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.yml"
    alerts.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n    for: 1m\n"
    )
    out = tmp_path / "rule.yaml"
    assert make_rule("--alerts", str(alerts), "--output", str(out)).returncode == 0
    assert make_rule("--alerts", str(alerts), "--output", str(out), "--check").returncode == 0
    (rule,) = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert rule["spec"]["groups"][0]["rules"][0] == {"alert": "A", "expr": "up == 0", "for": "1m"}
    alerts.write_text(alerts.read_text().replace("up == 0", "up == 2"))
    stale = make_rule("--alerts", str(alerts), "--output", str(out), "--check")
    assert stale.returncode == 1 and "out of date" in stale.stderr
    alerts.write_text("rules: []\n")
    bad = make_rule("--alerts", str(alerts), "--output", str(out))
    assert bad.returncode == 2 and "groups" in bad.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    (rule,) = docs("prometheusrule.yaml")
    extracted = tmp_path / "rules.yml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(extracted)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- vllm-entrypoint.sh, run for real with bash ---------------------------------------------

REPORTER = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(),"
    " 'env': {k: os.environ.get(k) for k in ('NCCL_NVLS_ENABLE', 'X_QUOTED')}}), flush=True)\n"
)


def run_entrypoint(tmp_path: Path, fallback: str | None, *args: str) -> subprocess.Popen[str]:
    fallback_file = tmp_path / "fallback.env"
    if fallback is not None:
        fallback_file.write_text(fallback)
    env = {
        **os.environ,
        "HANG_WATCHDOG_FALLBACK_FILE": str(fallback_file),
        "HANG_WATCHDOG_LOG_FILE": str(tmp_path / "logs" / "vllm.log"),
    }
    return subprocess.Popen(
        ["bash", str(ENTRYPOINT), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_text(path: Path, needle: str, deadline_s: float = 30.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in {path}")


def test_entrypoint_applies_the_file_the_watchdog_writes_once(tmp_path: Path) -> None:
    """The file carries the new and the old name with one value: the arguments go in once."""
    from watchdog.remediation.restarters import env_file_text

    flag = "--attention-backend=flashinfer"
    fallback = env_file_text([flag], {"NCCL_NVLS_ENABLE": "0"}, ["disable_trtllm_attention"])
    assert f'HANG_WATCHDOG_FALLBACK_ARGS="{flag}"' in fallback
    assert f'VLLM_WATCHDOG_ARGS="{flag}"' in fallback
    proc = run_entrypoint(tmp_path, fallback, sys.executable, "-c", REPORTER, "serve", "m")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["argv"] == ["serve", "m", flag]
    assert report["env"]["NCCL_NVLS_ENABLE"] == "0"


def test_entrypoint_applies_fallback_and_execs(tmp_path: Path) -> None:
    """A file an older watchdog wrote (only the old name) still applies."""
    fallback = (
        "# written by hang-watchdog\n"
        'VLLM_WATCHDOG_ARGS="--attention-config.use_trtllm_attention=0"\n'
        "NCCL_NVLS_ENABLE=0\n"
        "X_QUOTED='a b'\n"
    )
    proc = run_entrypoint(tmp_path, fallback, sys.executable, "-c", REPORTER, "serve", "m")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["argv"] == ["serve", "m", "--attention-config.use_trtllm_attention=0"]
    assert report["env"] == {"NCCL_NVLS_ENABLE": "0", "X_QUOTED": "a b"}
    assert report["pid"] == proc.pid  # exec: the server is the container's main process
    log = wait_for_text(tmp_path / "logs" / "vllm.log", '"argv"')
    assert "fallback applied" in log


def test_entrypoint_without_fallback_runs_command_unchanged(tmp_path: Path) -> None:
    proc = run_entrypoint(tmp_path, None, sys.executable, "-c", REPORTER, "serve")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["argv"] == ["serve"] and report["env"]["NCCL_NVLS_ENABLE"] is None


def test_entrypoint_treats_fallback_as_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    fallback = f'VLLM_WATCHDOG_ARGS="--x=$(touch {marker})"\nnot an assignment\n'
    proc = run_entrypoint(tmp_path, fallback, sys.executable, "-c", REPORTER)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not marker.exists()
    assert json.loads(out.splitlines()[-1])["argv"] == ["--x=$(touch", f"{marker})"]
    log = wait_for_text(tmp_path / "logs" / "vllm.log", "not KEY=VALUE")
    assert "fallback.env:2" in log


def test_entrypoint_sigterm_reaches_the_server(tmp_path: Path) -> None:
    server = "import signal, sys, time\nprint('up', flush=True)\ntime.sleep(120)\n"
    proc = run_entrypoint(tmp_path, None, sys.executable, "-c", server)
    wait_for_text(tmp_path / "logs" / "vllm.log", "up")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM


def test_entrypoint_without_command_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_entrypoint(tmp_path, None)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "usage" in err
