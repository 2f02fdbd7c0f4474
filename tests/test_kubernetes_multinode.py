"""The multi-node Kubernetes shape (a LeaderWorkerSet, one sidecar per pod) validates strictly.

kubernetes-validate has no LeaderWorkerSet schema, so the LWS object is checked against the
CRD's own v1 schema (tests/data/lws, from kubernetes-sigs/lws v0.10.0) with unknown fields
refused, and its two pod templates are validated strictly by kubernetes-validate as Pods.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from watchdog.config import load_config

ROOT = Path(__file__).resolve().parents[1]
MULTI = ROOT / "kubernetes" / "multinode"
LWS = MULTI / "leaderworkerset.yaml"
SCHEMA = ROOT / "tests" / "data" / "lws" / "leaderworkerset-v1-schema.json"
VERSIONS = ["1.29.0", "1.37.0"]
TEMPLATES = ("leaderTemplate", "workerTemplate")


def lws() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(LWS.read_text()) if d]
    return doc


def strict(schema: Any) -> Any:
    """additionalProperties: false wherever the schema lists properties (as --strict does)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        open_ended = "additionalProperties" in out or out.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        if "properties" in out and not open_ended:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate_lws(doc: dict[str, Any]) -> None:
    schema = strict(json.loads(SCHEMA.read_text())["schema"])
    jsonschema.validate(doc, schema)


def as_pod(doc: dict[str, Any], template: str) -> dict[str, Any]:
    tpl = doc["spec"]["leaderWorkerTemplate"][template]
    meta = {"name": f"vllm-{template.lower()}", **tpl.get("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tpl["spec"]}


def kubernetes_validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_lws_object_matches_the_crd_schema_strictly() -> None:
    validate_lws(lws())
    broken = copy.deepcopy(lws())
    broken["spec"]["leaderWorkerTemplate"]["restartPolcy"] = "None"
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(broken)
    wrong = copy.deepcopy(lws())
    wrong["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(wrong)


def test_kubernetes_validate_has_no_lws_schema() -> None:
    """Why the two checks here exist: the tool only warns about the custom resource."""
    result = kubernetes_validate(LWS, VERSIONS[-1])
    assert "Couldn't find schema for kind LeaderWorkerSet" in result.stdout + result.stderr


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_pod_templates_pass_strict_validation(tmp_path: Path, template: str, version: str) -> None:
    path = tmp_path / f"{template}.yaml"
    path.write_text(yaml.safe_dump(as_pod(lws(), template)))
    result = kubernetes_validate(path, version)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout and "WARN" not in result.stdout, result.stdout


@pytest.mark.parametrize("template", TEMPLATES)
def test_broken_pod_template_fails(tmp_path: Path, template: str) -> None:
    pod = as_pod(lws(), template)
    pod["spec"]["shareProcessNamespace"] = "yes-please"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = kubernetes_validate(path, VERSIONS[-1])
    assert result.returncode != 0 and "ERROR" in result.stdout


def _sidecar(template: str) -> dict[str, Any]:
    spec = lws()["spec"]["leaderWorkerTemplate"][template]["spec"]
    assert spec["shareProcessNamespace"] is True
    return next(c for c in spec["containers"] if c["name"] == "hang-watchdog")


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_pod_has_a_sidecar_with_fleet_labels(template: str) -> None:
    side = _sidecar(template)
    args = side["args"]
    assert args[args.index("--deployment") + 1] == "$(LWS_NAME)-$(LWS_GROUP_INDEX)"
    assert args[args.index("--node") + 1] == "$(POD_NAME)"
    refs = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in side["env"]
    }
    assert refs["LWS_NAME"] == "metadata.labels['leaderworkerset.sigs.k8s.io/name']"
    assert refs["LWS_GROUP_INDEX"] == "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"
    assert refs["POD_NAME"] == "metadata.name"
    assert "SYS_PTRACE" in side["securityContext"]["capabilities"]["add"]
    assert side["ports"][0]["containerPort"] == 9433


def test_configs_load_and_only_the_leader_may_remediate() -> None:
    spec = lws()["spec"]["leaderWorkerTemplate"]
    assert spec["restartPolicy"] == "RecreateGroupOnPodRestart" and spec["size"] >= 2
    leader = load_config(MULTI / "config-leader.toml", {"deployment": "vllm-0", "node": "vllm-0"})
    worker = load_config(MULTI / "config-worker.toml", {"deployment": "vllm-0", "node": "vllm-0-1"})
    assert leader.restarter == "kubernetes" and leader.server_url
    assert worker.remediate is False and worker.server_url is None
    for template, name in (("leaderTemplate", "leader"), ("workerTemplate", "worker")):
        assert f"/etc/hang-watchdog/config-{name}.toml" in _sidecar(template)["args"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomization_builds() -> None:
    argv = ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(MULTI)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(result.stdout) if d)
    assert kinds == ["ConfigMap", "ConfigMap", "LeaderWorkerSet", "PodMonitor"]
