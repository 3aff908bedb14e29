"""Prometheus alert rules: promtool checks, unit tests, and Grafana-managed equivalents.

``promtool check rules`` / ``test rules`` / ``check config`` and ``amtool check-config`` are
the real tools (Debian's prometheus and prometheus-alertmanager packages, installed by
.ci/run); tests skip with the reason only when a binary is not on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "alerts" / "assaywatch.rules.yaml"
RULE_TESTS = DASHBOARDS / "alerts" / "tests" / "assaywatch.rules.test.yaml"
GRAFANA_RULES = DASHBOARDS / "grafana-alerting" / "assaywatch-alerts.yaml"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "assaywatch.yaml"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH "
                                    "(apt-get install prometheus; .ci/run installs it)")
#: What the issue requires an alert for, by alert name.
REQUIRED = {"AssaywatchRegressionAlarm", "AssaywatchVerdictFail", "AssaywatchCoverageLow",
            "AssaywatchNotIngesting", "AssaywatchSpansRejected"}


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


@needs_promtool
def test_promtool_check_rules() -> None:
    result = _run(str(PROMTOOL), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = _run(str(PROMTOOL), "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("mutation", [
    ("for: 1m", "for: 0m"),          # the regression alarm would page without its delay
    ("< 0.5", "< 0.2"),              # the coverage floor would move
    ("rate(assaywatch_spans_rejected_total[5m])) > 0",
     "rate(assaywatch_spans_rejected_total[5m])) > 1"),
])
def test_promtool_unit_tests_catch_a_changed_rule(tmp_path: Path,
                                                  mutation: tuple[str, str]) -> None:
    """The unit tests are not vacuous: each of these edits to the rules makes them fail."""
    old, new = mutation
    text = RULES.read_text(encoding="utf-8")
    assert old in text
    (tmp_path / "alerts" / "tests").mkdir(parents=True)
    (tmp_path / "alerts" / RULES.name).write_text(text.replace(old, new, 1))
    shutil.copy(RULE_TESTS, tmp_path / "alerts" / "tests" / RULE_TESTS.name)
    result = _run(str(PROMTOOL), "test", "rules", RULE_TESTS.name,
                  cwd=tmp_path / "alerts" / "tests")
    assert result.returncode != 0, f"unit tests still pass after {old!r} -> {new!r}"


def test_every_alert_has_a_unit_test_and_the_required_alerts_exist() -> None:
    names = {a["alert"] for a in _alerts()}
    assert names >= REQUIRED
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == names, f"alerts without a firing unit test: {names - tested}"


def _readme_anchors() -> set[str]:
    anchors = set()
    for line in (DASHBOARDS / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):  # GitHub's heading slugs
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


def test_every_alert_has_texts_severity_and_a_runbook_section() -> None:
    anchors = _readme_anchors()
    for alert in _alerts():
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert set(alert["annotations"]) == {"summary", "description", "runbook_url"}
        url = alert["annotations"]["runbook_url"]
        assert url.split("#")[0].endswith("dashboards/README.md"), url
        assert url.split("#")[1] in anchors, f"{alert['alert']}: no README section for {url}"


def test_grafana_managed_rules_are_equivalent_to_the_prometheus_rules() -> None:
    data = yaml.safe_load(GRAFANA_RULES.read_text(encoding="utf-8"))
    assert data["apiVersion"] == 1
    rules = {r["title"]: r for g in data["groups"] for r in g["rules"]}
    provisioned = {d["uid"] for d in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    uids = [r["uid"] for r in rules.values()]
    assert len(uids) == len(set(uids)) and all(len(u) <= 40 for u in uids)
    assert set(rules) == {a["alert"] for a in _alerts()}
    for alert in _alerts():
        rule = rules[alert["alert"]]
        data_by_ref = {d["refId"]: d for d in rule["data"]}
        query, condition = data_by_ref["A"], data_by_ref[rule["condition"]]
        assert query["datasourceUid"] in provisioned
        op_threshold = condition["model"]["expression"].removeprefix("$B ")
        assert f"{query['model']['expr']} {op_threshold}" == alert["expr"]
        assert data_by_ref["B"]["model"] == {"refId": "B", "type": "reduce", "expression": "A",
                                            "reducer": "last"}
        assert rule["for"] == alert["for"] and rule["labels"] == alert["labels"]
        for key, text in alert["annotations"].items():
            assert rule["annotations"][key] == text.replace("$value", "$values.B.Value")


@needs_promtool
@pytest.mark.parametrize("config", ["deploy/prometheus/prometheus.yml",
                                    "deploy/kubernetes/prometheus-scrape.yml"])
def test_promtool_check_config_on_shipped_prometheus_configs(config: str) -> None:
    result = _run(str(PROMTOOL), "check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(AMTOOL is None, reason="amtool not on PATH "
                    "(apt-get install prometheus-alertmanager; .ci/run installs it)")
def test_amtool_check_config_on_shipped_alertmanager_config() -> None:
    result = _run(str(AMTOOL), "check-config", "deploy/alertmanager/alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr
