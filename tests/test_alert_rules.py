"""The shipped alert rules, their promtool tests, the Grafana copies and the runbooks agree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from watchdog.outputs.metrics_table import METRICS

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "prometheus" / "alerts_test.yml"
GRAFANA_ALERTS = ROOT / "grafana" / "alerting" / "hang-watchdog-alerts.yaml"
DASHBOARD = ROOT / "grafana" / "hang-watchdog-dashboard.json"
README_PART = ROOT / "docs" / "metrics-and-alerts.md"
RUNBOOKS = ROOT / "docs" / "runbooks"
REQUIRED = {
    "InferenceServerHung",
    "InferenceCubinDownloadStall",
    "InferenceServerStalled",
    "HangWatchdogDown",
    "HangWatchdogStale",
    "HangWatchdogBlind",
    "HangWatchdogRemediationFailed",
    "HangWatchdogRemediationExhausted",
}


def promtool() -> str:
    """The real promtool binary; CI installs Debian's `prometheus` package for it."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install it (apt-get install prometheus) and rerun")
    return path


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules():
    result = run_promtool("check", "rules", str(RULES), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = run_promtool("test", "rules", str(RULE_TESTS), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_catch_rules_without_for(tmp_path: Path):
    """Blip and not-yet cases must fail if a rule loses its `for:` (they can fail)."""
    text = re.sub(r"^\s+for: .*\n", "", RULES.read_text(), flags=re.M)
    (tmp_path / "alerts.yml").write_text(text)
    shutil.copy(RULE_TESTS, tmp_path / "alerts_test.yml")
    result = run_promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    for name in ("InferenceServerHung", "InferenceServerStalled", "HangWatchdogDown"):
        assert f"alertname: {name}" in result.stdout + result.stderr


def test_every_required_rule_exists_with_summary_fix_runbook():
    by_name = {r["alert"]: r for r in rules()}
    assert set(by_name) >= REQUIRED
    for name, rule in by_name.items():
        ann = rule["annotations"]
        assert ann.get("summary") and ann.get("fix"), name
        assert ann["runbook_url"] == f"docs/runbooks/{name.lower()}.md", name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name


def test_hung_rule_keeps_the_signature_label():
    hung = next(r for r in rules() if r["alert"] == "InferenceServerHung")
    assert "by" not in hung["expr"] and "hang_watchdog_hang" in hung["expr"]
    assert "$labels.signature" in hung["annotations"]["summary"]


def test_every_rule_fires_and_stays_quiet_in_some_case():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {r["alert"] for r in rules()}
    assert fired == names
    assert quiet == names
    case_names = " ".join(c["name"] for c in tests)
    for word in ("loading", "idle", "blip"):
        assert word in case_names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bhang_watchdog_[a-z_]+", expr))


def _known_series() -> set[str]:
    names = {m.name for m in METRICS}
    for m in METRICS:
        if m.type == "histogram":
            names |= {m.name + s for s in ("_bucket", "_sum", "_count")}
    return names


def test_rules_and_dashboard_use_only_exported_metrics():
    exprs = [r["expr"] for r in rules()] + dashboard_exprs()
    used = set().union(*(_metric_names(e) for e in exprs))
    assert used <= _known_series(), used - _known_series()
    assert "hang_watchdog_hang" in used and "hang_watchdog_state" in used


def test_shipped_queries_read_the_new_source_name():
    """`source="vllm"` is an alias exported for one release: nothing shipped may select it, and
    the dashboard's per-source panel leaves it out so each server source shows once."""
    shipped = [RULES, GRAFANA_ALERTS, ROOT / "kubernetes" / "prometheusrule.yaml", DASHBOARD]
    shipped.append(ROOT / "grafana" / "hang-watchdog-fleet-dashboard.json")
    for path in shipped:
        text = path.read_text().replace('\\"', '"')
        assert not re.search(r'source\s*=~?\s*"[^"]*\bvllm\b', text), path.name
    per_source = [e for e in dashboard_exprs() if "by (instance, source)" in e]
    assert per_source and all('source!="vllm"' in e for e in per_source), per_source


def dashboard_exprs() -> list[str]:
    """Every PromQL expression in the dashboard: panels, variables, annotations."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def test_dashboard_shape():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["type"] == "query"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], panel["title"]
    incidents = [a for a in dash["annotations"]["list"] if "expr" in a]
    assert incidents and "hang_watchdog_incidents_total" in incidents[0]["expr"]


def grafana_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(GRAFANA_ALERTS.read_text())
    assert doc["apiVersion"] == 1
    return [r for g in doc["groups"] for r in g["rules"]]


def test_grafana_rules_equal_the_prometheus_rules():
    prom = {r["alert"]: r for r in rules()}
    graf = {r["title"]: r for r in grafana_rules()}
    assert set(graf) == set(prom)
    for name, rule in graf.items():
        want = prom[name]
        data = {d["refId"]: d for d in rule["data"]}
        expr = " ".join(want["expr"].split())
        assert data["A"]["model"]["expr"] == f"({expr}) * 0 + 1", name
        assert data["C"]["model"]["type"] == "threshold", name
        assert data["C"]["model"]["expression"] == "A", name
        assert rule["condition"] == "C", name
        assert rule["for"] == want.get("for", "0s"), name
        assert rule["labels"] == want["labels"], name
        assert rule["annotations"] == want["annotations"], name
        assert rule["noDataState"] == "OK", name


def test_every_alert_has_its_own_runbook_page():
    pages = {p.name for p in RUNBOOKS.glob("*.md")}
    for rule in rules():
        page = RUNBOOKS / f"{rule['alert'].lower()}.md"
        assert page.name in pages, rule["alert"]
        text = page.read_text()
        assert text.startswith(f"# Runbook: {rule['alert']}\n"), rule["alert"]
        assert "## What to do" in text and "\n1. " in text, rule["alert"]
    linked = set(re.findall(r"\(runbooks/([a-z]+\.md)\)", README_PART.read_text()))
    assert linked == {f"{r['alert'].lower()}.md" for r in rules()}


def test_readme_metric_table_matches_the_code_table():
    # The fleet series are documented with the fleet rules that use them, in docs/fleet.md.
    text = README_PART.read_text() + (ROOT / "docs" / "fleet.md").read_text()
    rows = re.findall(r"^\| `(hang_watchdog_[a-z_]+)` \| (\w+) \| ([^|]*) \|", text, flags=re.M)
    got = {name: (mtype, labels.strip()) for name, mtype, labels in rows}
    want = {
        m.name: (m.type, ", ".join(f"`{label}`" for label in m.labels) or "none") for m in METRICS
    }
    assert got == want


def test_the_stages_are_told_apart_and_a_soft_stall_pages_nobody() -> None:
    """`stage: stalled` (work pending, cause unproven) and `stage: hung` (cause proven) are
    labels on the alerts; the shipped Alertmanager routes the soft stage to a receiver with no
    notifier, the hard one to on-call (checked with the real amtool)."""
    by_name = {r["alert"]: r for r in rules()}
    assert by_name["InferenceServerStalled"]["labels"]["stage"] == "stalled"
    for name in ("InferenceServerHung", "InferenceCubinDownloadStall"):
        assert by_name[name]["labels"]["stage"] == "hung", name
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool not found: install it (apt-get install prometheus-alertmanager)")
    config = str(ROOT / "prometheus" / "alertmanager.yml")

    def receiver(*labels: str) -> str:
        done = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", *labels],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    soft = receiver("alertname=InferenceServerStalled", "stage=stalled", "severity=warning")
    hard = receiver("alertname=InferenceServerHung", "stage=hung", "severity=critical")
    assert (soft, hard) == ("no-page", "on-call")
    doc = yaml.safe_load((ROOT / "prometheus" / "alertmanager.yml").read_text())
    quiet = next(r for r in doc["receivers"] if r["name"] == soft)
    assert not any(k.endswith("_configs") for k in quiet), quiet
