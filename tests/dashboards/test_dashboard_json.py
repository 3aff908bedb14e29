"""Structural checks of the shipped Grafana dashboards and of ``iter_promql``.

Every panel reads the templated datasource, every variable used is defined, uids are unique
and stable, the JSON declares a current schemaVersion, panels do not overlap, every metric
and label named in a query belongs to the DESIGN.md contract, and the committed files are
exactly what dashboards/generate.py writes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from assaywatch.dashboards.alert_rules import ALERTS
from assaywatch.dashboards.grafana import (
    METRIC_FAMILIES,
    PromQL,
    iter_panels,
    iter_promql,
    load_dashboards,
    metric_names,
    selectors,
    substitute,
)

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
TEMPLATED = {"type": "prometheus", "uid": "${datasource}"}
#: Stable uids: links between the dashboards, users' bookmarks and `dashboards push`
#: (update in place by uid) rely on them never changing.
STABLE_UIDS = {"assaywatch-overview.json": "assaywatch-overview",
               "assaywatch-agent.json": "assaywatch-agent"}
#: Grafana's built-in variables the dashboards may use without defining them.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__url_time_range"}
#: Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"job", "instance"}


def _generator() -> ModuleType:
    """dashboards/generate.py, a script and not a package module, loaded from its path."""
    name = "assaywatch_dashboards_generate"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DASHBOARDS / "generate.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    return load_dashboards(DASHBOARDS)


def _queries(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, object with a datasource) for panels, targets, annotations, variables."""
    found: list[tuple[str, dict[str, Any]]] = []
    for panel in iter_panels(board["panels"]):
        if panel["type"] == "row":
            continue
        found.append((f"panel {panel['title']}", panel))
        found += [(f"panel {panel['title']} target {t['refId']}", t) for t in panel["targets"]]
    found += [(f"annotation {a['name']}", a) for a in board["annotations"]["list"]
              if not a.get("builtIn")]
    found += [(f"variable {v['name']}", v) for v in board["templating"]["list"]
              if v["type"] == "query"]
    return found


def test_committed_files_are_what_the_generator_writes() -> None:
    for rel, text in _generator().render().items():
        assert (DASHBOARDS / rel).read_text(encoding="utf-8") == text, (
            f"dashboards/{rel} is stale: run python dashboards/generate.py")


def test_json_declares_a_current_schema_version_and_stable_unique_uids(
        boards: dict[str, dict[str, Any]]) -> None:
    assert {name: b["uid"] for name, b in boards.items()} == STABLE_UIDS
    for name, board in boards.items():
        assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39, name
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"]), name
        ids = [p["id"] for p in iter_panels(board["panels"])]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"


def test_every_panel_and_query_uses_the_templated_datasource(
        boards: dict[str, dict[str, Any]]) -> None:
    for name, board in boards.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        wrong = [where for where, obj in _queries(board) if obj.get("datasource") != TEMPLATED]
        assert not wrong, f"{name}: not on ${{datasource}}: {wrong}"


def _variable_uses(board: dict[str, Any]) -> set[str]:
    text = repr([board["panels"], board["annotations"], board["templating"], board["links"]])
    uses = set(re.findall(r"\$\{([\w.]+)(?::\w+)?\}", text)) | set(re.findall(r"\$(\w+)", text))
    # ${__data.fields.agent} and friends are Grafana's data-link variables
    return {u for u in uses if not u.startswith("__data.")}


def test_every_variable_used_is_defined_and_every_defined_one_is_used(
        boards: dict[str, dict[str, Any]]) -> None:
    for name, board in boards.items():
        defined = {v["name"] for v in board["templating"]["list"]}
        assert defined == {"datasource", "agent", "version", "scenario"}, name
        used = _variable_uses(board)
        assert used - defined - GRAFANA_BUILTINS == set(), name
        assert defined <= used, f"{name}: defined but unused: {defined - used}"


def test_panels_fit_the_grid_without_overlapping(boards: dict[str, dict[str, Any]]) -> None:
    for name, board in boards.items():
        cells: dict[tuple[int, int], str] = {}
        for panel in iter_panels(board["panels"]):
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, (name, panel["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, (name, panel["title"], cells.get((x, y)))
                    cells[(x, y)] = panel["title"]


def test_metrics_and_labels_in_every_expression_belong_to_the_contract() -> None:
    exprs = iter_promql(DASHBOARDS)
    for item in exprs:
        names = metric_names(item.expr)
        assert names, f"{item.file} {item.name}: reads no assaywatch metric: {item.expr}"
        assert names <= set(METRIC_FAMILIES) | {"up"}, (item, names - set(METRIC_FAMILIES))
        allowed = TARGET_LABELS.union(*(METRIC_FAMILIES.get(n, ()) for n in names))
        for selector in selectors(item.expr):
            matchers = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector.partition("{")[2]))
            assert matchers <= allowed, (item.name, selector, matchers - allowed)
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", item.expr):
            labels = {g.strip() for g in group.split(",") if g.strip()}
            assert labels <= allowed, (item.name, labels - allowed)


def test_dashboards_show_every_family_of_the_contract() -> None:
    used = set().union(*(metric_names(p.expr) for p in iter_promql(DASHBOARDS)
                         if p.file.endswith(".json")))
    assert set(METRIC_FAMILIES) - used == set()


def test_iter_promql_extracts_every_expression_with_variables_substituted(
        boards: dict[str, dict[str, Any]]) -> None:
    exprs = iter_promql(DASHBOARDS)
    assert all(isinstance(p, PromQL) and len(p) == 3 for p in exprs)
    expected = sum(len(p.get("targets", [])) for b in boards.values()
                   for p in iter_panels(b["panels"]))
    expected += sum(1 for b in boards.values() for a in b["annotations"]["list"] if "expr" in a)
    expected += sum(1 for b in boards.values() for v in b["templating"]["list"]
                    if v["type"] == "query")
    rules = ALERTS
    expected += 2 * len(rules)  # Prometheus rule + Grafana-managed rule query
    assert len(exprs) == expected
    assert not [p for p in exprs if "$" in p.expr and "$__" not in p.expr], "unsubstituted"
    assert not [p for p in exprs if "$__" in p.expr]
    kinds = {p.name.split(":")[0] for p in exprs}
    assert kinds == {"panel", "annotation", "variable", "alert", "grafana-alert"}
    # label_values(selector, label) yields the selector
    variable = next(p for p in exprs if p.name == "variable: version")
    assert variable.expr == 'assaywatch_runs_total{agent=~".*"}'
    # overrides apply
    one = iter_promql(DASHBOARDS, {"agent": "checkout", "__rate_interval": "2m"})
    assert any('agent=~"checkout"' in p.expr and "[2m]" in p.expr for p in one)


def test_substitute_refuses_an_undefined_variable() -> None:
    assert substitute('x{a=~"$agent"}[${__range}]', {"agent": "b", "__range": "1h"}) == (
        'x{a=~"b"}[1h]')
    with pytest.raises(KeyError, match=r"\$nope"):
        substitute("rate(x[$nope])", {})


def test_selectors_find_metric_selectors_but_not_label_values() -> None:
    expr = ('sum by (job) (rate(assaywatch_runs_total{agent="assaywatch_x"}[5m])) '
            'or up{job=~"assaywatch.*"} * assaywatch_build_info')
    assert selectors(expr) == ['assaywatch_runs_total{agent="assaywatch_x"}',
                               'up{job=~"assaywatch.*"}', "assaywatch_build_info"]
