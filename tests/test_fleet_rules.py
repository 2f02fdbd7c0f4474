"""The shipped fleet rules and Alertmanager config: promtool/amtool accept them, their unit tests
pass (and fail without the `for:` guards), and they use only exported series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fakes import FLEET_DASHBOARD, ROOT
from watchdog.outputs.metrics_table import METRICS

FLEET = ROOT / "prometheus" / "fleet.yml"
FLEET_TESTS = ROOT / "prometheus" / "fleet_test.yml"
ALERTMANAGER = ROOT / "prometheus" / "alertmanager.yml"
DOC = ROOT / "docs" / "fleet.md"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install prometheus prometheus-alertmanager")
    return path


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(FLEET.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_and_unit_tests_pass() -> None:
    checked = _run(_tool("promtool"), "check", "rules", str(FLEET))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout
    tested = _run(_tool("promtool"), "test", "rules", str(FLEET_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_unit_tests_fail_without_the_for_guards(tmp_path: Path) -> None:
    text = re.sub(r"^\s+for: .*\n", "", FLEET.read_text(), flags=re.M)
    (tmp_path / "fleet.yml").write_text(text)
    shutil.copy(FLEET_TESTS, tmp_path / "fleet_test.yml")
    result = _run(_tool("promtool"), "test", "rules", "fleet_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    for name in ("InferenceDeploymentHung", "InferenceNodeHung"):
        assert f"alertname: {name}" in result.stdout + result.stderr


def test_unit_tests_fail_when_priority_is_ignored(tmp_path: Path) -> None:
    """topk -> bottomk picks the lowest-priority cause: the multi-node cases must catch it."""
    text = FLEET.read_text().replace("topk by (deployment)", "bottomk by (deployment)")
    (tmp_path / "fleet.yml").write_text(text)
    shutil.copy(FLEET_TESTS, tmp_path / "fleet_test.yml")
    result = _run(_tool("promtool"), "test", "rules", "fleet_test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "higher priority wins" in result.stdout + result.stderr


def test_amtool_accepts_the_config_and_it_inhibits_by_deployment() -> None:
    result = _run(_tool("amtool"), "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load(ALERTMANAGER.read_text())
    rules = doc["inhibit_rules"]
    root = next(r for r in rules if 'alertname="InferenceDeploymentHung"' in r["source_matchers"])
    assert root["equal"] == ["deployment"]
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts == {"InferenceDeploymentHung", "InferenceNodeHung"}


def test_rules_use_only_exported_series_and_have_runbooks() -> None:
    exported = {m.name for m in METRICS}
    recorded = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        used = set(re.findall(r"\bhang_watchdog[_:][a-z_:0-9]+", rule["expr"]))
        assert used <= exported | recorded, used - exported - recorded
    for rule in _rules():
        if "alert" in rule:
            page = f"docs/runbooks/{rule['alert'].lower()}.md"
            assert rule["annotations"]["runbook_url"] == page
            assert (ROOT / page).is_file(), page


def test_fleet_dashboard_shape_and_series() -> None:
    import json

    dash = json.loads(FLEET_DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "hang_watchdog_deployment_info" in variables["deployment"]["query"]["query"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exported = {m.name for m in METRICS}
    recorded = {r["record"] for r in _rules() if "record" in r}
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["description"]
        for target in panel["targets"]:
            assert 'deployment=~"$deployment"' in target["expr"], panel["title"]
            used = set(re.findall(r"\bhang_watchdog[_:][a-z_:0-9]+", target["expr"]))
            assert used <= exported | recorded, used - exported - recorded
    kinds = {p["type"] for p in dash["panels"]}
    assert "state-timeline" in kinds  # ranks on a timeline
    ras = [t["expr"] for p in dash["panels"] for t in p["targets"] if "nccl_ras" in t["expr"]]
    # RAS series have no deployment label: each is joined to it through deployment_info, and
    # each query, as Grafana expands All, is evaluated by a promtool case in fleet_test.yml
    promtool_cases = FLEET_TESTS.read_text()
    assert all(e.replace("$deployment", ".+") in promtool_cases for e in ras)
    assert ras and all(
        "group_left (deployment, node) hang_watchdog_deployment_info" in e for e in ras
    )
