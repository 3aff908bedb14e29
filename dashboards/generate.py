"""Generate the shipped Grafana dashboards and alert rules from one definition.

Run ``python dashboards/generate.py`` after editing this file; it rewrites
``assaywatch-overview.json``, ``assaywatch-agent.json``, ``alerts/assaywatch.rules.yaml`` and
``grafana-alerting/assaywatch-alerts.yaml`` next to it. ``tests/dashboards`` fails when the
committed files differ from what this script writes, so the generated files never drift.

Why a generator: the Prometheus rules and the Grafana-managed rules must stay equivalent
(same expression, threshold, ``for``, labels and texts), and the panels share one label filter
and one datasource reference. Writing each once here makes those properties true by
construction; the tests then check them on the written files.

Every metric name used below is a family of the DESIGN.md contract
(``assaywatch.dashboards.grafana.METRIC_FAMILIES``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from assaywatch.dashboards.alert_rules import (
    STREAM,
    grafana_rules,
    prometheus_rules,
)

HERE = Path(__file__).resolve().parent

#: Grafana dashboard JSON schema version written (Grafana 10.3 / 11.x).
SCHEMA_VERSION = 39
#: The templated datasource every panel and query variable uses.
DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
#: The stream filter of every stream-level query. ``=~`` so that "All" (".*") also matches
#: the empty scenario label.
F = 'agent=~"$agent", version=~"$version", scenario=~"$scenario"'
RATE = "[$__rate_interval]"
FAIL = 'verdict="fail"'
INCONCLUSIVE = 'verdict="inconclusive"'


def sel(metric: str, extra: str = "") -> str:
    """``metric{<stream filter>[, extra]}``."""
    return f"{metric}{{{F}{', ' + extra if extra else ''}}}"


# Verdict encoded as one number so a stat or table cell can colour it: the monitor exports
# the verdict one-hot over pass/fail/inconclusive, so fail*2 + inconclusive is 0, 1 or 2.
def verdict_code(by: str) -> str:
    return (
        f"max by ({by}) ({sel('assaywatch_verdict', FAIL)}) * 2"
        f" + max by ({by}) ({sel('assaywatch_verdict', INCONCLUSIVE)})"
    )


VERDICT_MAPPINGS = [
    {"type": "value", "options": {
        "0": {"text": "pass", "color": "green", "index": 0},
        "1": {"text": "inconclusive", "color": "yellow", "index": 1},
        "2": {"text": "FAIL", "color": "red", "index": 2},
    }},
]
ALARM_MAPPINGS = [
    {"type": "value", "options": {
        "0": {"text": "ok", "color": "green", "index": 0},
        "1": {"text": "ALARM", "color": "red", "index": 1},
    }},
]


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to new lines."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0
        self._row_h = 0

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self._x + w > 24:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        pos = {"h": h, "w": w, "x": self._x, "y": self._y}
        self._x += w
        self._row_h = max(self._row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self._x:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                            "id": len(self.panels) + 1, "gridPos": self._place(24, 1)})
        self._x, self._y, self._row_h = 0, self._y + 1, 0

    def add(self, kind: str, title: str, description: str, targets: list[tuple[str, str]],
            w: int, h: int, unit: str = "short", instant: bool = False, table: bool = False,
            **defaults: Any) -> dict[str, Any]:
        """Add a panel; ``targets`` are (expr, legendFormat) pairs."""
        panel: dict[str, Any] = {
            "id": len(self.panels) + 1, "type": kind, "title": title,
            "description": description, "datasource": DS, "gridPos": self._place(w, h),
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr,
                 "legendFormat": legend, "range": not instant, "instant": instant,
                 "format": "table" if table else "time_series"}
                for i, (expr, legend) in enumerate(targets)
            ],
            "fieldConfig": {"defaults": {"unit": unit, **defaults}, "overrides": []},
            "options": {},
        }
        if kind in ("stat", "bargauge"):
            panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                                  "values": False}}
        self.panels.append(panel)
        return panel


def variables(multi_agent: bool) -> list[dict[str, Any]]:
    def query_var(name: str, label: str, source: str, multi: bool) -> dict[str, Any]:
        definition = f"label_values({source}, {name})"
        return {"name": name, "label": label, "type": "query", "datasource": DS,
                "definition": definition, "query": {"query": definition, "refId": name},
                "refresh": 2, "sort": 1, "multi": multi, "includeAll": True,
                "allValue": ".*", "current": {}, "hide": 0, "regex": "", "options": []}

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
         "options": []},
        query_var("agent", "Agent", "assaywatch_runs_total", multi_agent),
        query_var("version", "Version", 'assaywatch_runs_total{agent=~"$agent"}', True),
        query_var("scenario", "Scenario",
                  'assaywatch_runs_total{agent=~"$agent", version=~"$version"}', True),
    ]


def dashboard(uid: str, title: str, description: str, layout: Layout,
              multi_agent: bool) -> dict[str, Any]:
    onsets = {
        "name": "Alarm onsets", "datasource": DS, "enable": True, "iconColor": "red",
        # alarms_total counts onsets, so an increase over one step marks the step where an
        # alarm started (the 0/1 gauge would mark the whole time it is raised).
        "expr": "sum by (agent, version, scenario, detector) "
                f"(increase({sel('assaywatch_alarms_total')}[$__interval])) > 0",
        "step": "$__interval", "titleFormat": "{{detector}} alarm",
        "textFormat": "{{agent}} {{version}} {{scenario}}",
        "tagKeys": "agent,version,scenario,detector", "useValueForTime": False,
    }
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
               "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
               "name": "Annotations & Alerts", "type": "dashboard"}
    return {
        "uid": uid, "title": title, "description": description, "tags": ["assaywatch"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
        "timezone": "browser", "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
        "links": [{"type": "dashboards", "tags": ["assaywatch"], "asDropdown": False,
                   "includeVars": True, "keepTime": True, "title": "assaywatch"}],
        "annotations": {"list": [builtin, onsets]},
        "templating": {"list": variables(multi_agent)},
        "panels": layout.panels,
    }


DRILL = ("/d/assaywatch-agent/assaywatch-agent?var-agent=${__data.fields.agent}"
         "&var-version=${__data.fields.version}&var-scenario=${__data.fields.scenario}"
         "&${__url_time_range}")


def overview() -> dict[str, Any]:
    lay = Layout()
    red1: dict[str, Any] = {"thresholds": {"mode": "absolute", "steps": [
        {"color": "green", "value": None}, {"color": "red", "value": 1}]}}
    lay.add("stat", "Streams", "Streams (agent, version, scenario) with runs.",
            [(f"count(count by ({STREAM}) ({sel('assaywatch_runs_total')}))", "")], 4, 4)
    lay.add("stat", "Active alarms", "Detector alarms currently raised.",
            [(f"sum({sel('assaywatch_alarm')})", "")], 4, 4, **red1)
    lay.add("stat", "Failing verdicts", "Tests whose current verdict is fail.",
            [(f"sum({sel('assaywatch_verdict', FAIL)})", "")], 4, 4, **red1)
    lay.add("stat", "Runs/s", "Completed agent runs per second.",
            [(f"sum(rate({sel('assaywatch_runs_total')}{RATE}))", "")], 4, 4, unit="reqps")
    passed = sel("assaywatch_runs_total", 'outcome="pass"')
    judged = sel("assaywatch_runs_total", 'outcome=~"pass|fail"')
    lay.add("stat", "Observed pass rate",
            "Share of judged runs that passed (unknown outcomes excluded).",
            [(f"sum(rate({passed}{RATE})) / sum(rate({judged}{RATE}))", "")], 4, 4,
            unit="percentunit", min=0, max=1)
    lay.add("stat", "Spans received/s", "Spans accepted by all receivers of all monitors.",
            [(f"sum(rate(assaywatch_spans_received_total{RATE}))", "")], 4, 4, unit="reqps")
    lay.row("Streams")
    links = [{"title": "Open drill-down", "url": DRILL}]
    lay.add(
        "table", "Verdicts by stream",
        "Current verdict per test (pass_rate, fingerprint, sprt). Click a row to drill down.",
        [(verdict_code(f"{STREAM}, test"), "")], 12, 9, instant=True, table=True,
        mappings=VERDICT_MAPPINGS, links=links, custom={"cellOptions": {"type": "color-text"}})
    lay.add("table", "Alarm state by stream and detector",
            "1 while a detector's alarm is raised (sprt, cusum_pass_rate, cusum_fingerprint, "
            "hotelling).",
            [(f"max by ({STREAM}, detector) ({sel('assaywatch_alarm')})", "")], 12, 9,
            instant=True, table=True, mappings=ALARM_MAPPINGS, links=links,
            custom={"cellOptions": {"type": "color-background"}})
    lay.add("timeseries", "Runs/s by stream", "Completed runs per second per stream.",
            [(f"sum by ({STREAM}) (rate({sel('assaywatch_runs_total')}{RATE}))",
              "{{agent}} {{version}} {{scenario}}")], 12, 8, unit="reqps")
    lay.add("timeseries", "Recent pass rate with Wilson 95% band",
            "Pass rate over the recent window; dashed lines are the Wilson score bounds.",
            [(sel("assaywatch_pass_rate", 'window="recent"'), "{{agent}} {{version}} {{scenario}}"),
             (sel("assaywatch_pass_rate_lower", 'window="recent"'), "lower {{agent}} {{version}}"),
             (sel("assaywatch_pass_rate_upper", 'window="recent"'), "upper {{agent}} {{version}}")],
            12, 8, unit="percentunit", min=0, max=1)
    overall = sel("assaywatch_coverage_ratio", 'dimension="overall"')
    lay.add("bargauge", "Coverage (overall)", "Overall coverage ratio of each stream.",
            [(f"max by ({STREAM}) ({overall})", "{{agent}} {{version}} {{scenario}}")], 12, 8,
            unit="percentunit", min=0, max=1)
    lay.add("table", "Alarm onsets in range", "Alarm onsets per detector in the time range.",
            [(f"sum by ({STREAM}, detector) (increase({sel('assaywatch_alarms_total')}"
              "[$__range]))", "")], 12, 8, instant=True, table=True, links=links)
    lay.add("timeseries", "Streams by phase",
            "Streams learning their baseline, calibrating their detectors (the baseline "
            "froze; runs are buffered in order until the thresholds arrive) and monitoring.",
            [(f"sum by (state) ({sel('assaywatch_stream_state')})", "{{state}}")], 12, 8)
    lay.add("timeseries", "Calibrations pending",
            "Frozen baselines waiting for their detectors' thresholds, per monitor; a "
            "backlog that does not drain means baselines freeze faster than the "
            "calibration worker (monitor/README.md, \"Freezing never stalls ingestion\").",
            [("sum by (instance) (assaywatch_calibrations_pending)", "{{instance}}")], 12, 8)
    lay.add("timeseries", "Streams removed/s",
            "Streams forgotten: idle (no run for limits.stream_idle_seconds), replaced (an "
            "idle stream gave its place to a new one at limits.max_streams), deleted "
            "(POST /api/streams/delete). A steady rate of replaced means more live "
            "stream names than max_streams.",
            [(f"sum by (instance, reason) (rate(assaywatch_streams_removed_total{RATE}))",
              "{{instance}} {{reason}}")], 12, 6, unit="reqps")
    lay.add("timeseries", "Status refreshes waiting",
            "Streams whose status (verdicts, fingerprint shifts, recommended trials) is due "
            "for a refresh and still shows an earlier one, per monitor: a scrape computes "
            "them for at most 0.1 s, the longest due first. A level that does not fall "
            "means more busy streams than one scrape interval refreshes.",
            [("sum by (instance) (assaywatch_status_refresh_backlog)", "{{instance}}")],
            12, 6)
    return dashboard("assaywatch-overview", "assaywatch / Overview",
                     "Every agent stream with its verdicts, alarms, throughput, pass rate and "
                     "coverage.", lay, multi_agent=True)


def drilldown() -> dict[str, Any]:
    lay = Layout()
    lay.row("Verdicts and alarms")
    lay.add("stat", "Verdicts", "Current verdict per test (0 pass, 1 inconclusive, 2 fail).",
            [(verdict_code("version, scenario, test"), "{{test}} {{version}} {{scenario}}")],
            8, 5, mappings=VERDICT_MAPPINGS)
    lay.add("stat", "Alarms by detector", "1 while the detector's alarm is raised.",
            [(f"max by (detector) ({sel('assaywatch_alarm')})", "{{detector}}")], 8, 5,
            mappings=ALARM_MAPPINGS)
    lay.add("stat", "Recommended trials",
            "Adaptive budget n*: runs needed for a conclusive pass-rate verdict.",
            [(f"max by (version, scenario) ({sel('assaywatch_recommended_trials')})",
              "{{version}} {{scenario}}")], 4, 5)
    lay.add("stat", "Baseline runs", "Runs in the frozen baseline.",
            [(f"max by (version, scenario) ({sel('assaywatch_baseline_runs')})",
              "{{version}} {{scenario}}")], 4, 5)
    lay.row("Pass rate")
    lay.add("timeseries", "Pass rate vs baseline (Wilson 95% bands)",
            "Recent-window pass rate against the baseline's, each with Wilson score bounds.",
            [(sel(f"assaywatch_pass_rate{s}", f'window="{w}"'), f"{w}{s} {{{{version}}}}")
             for w in ("baseline", "recent") for s in ("", "_lower", "_upper")],
            16, 8, unit="percentunit", min=0, max=1)
    lay.add("timeseries", "Runs/s by outcome", "Completed runs per second by oracle outcome.",
            [(f"sum by (outcome) (rate({sel('assaywatch_runs_total')}{RATE}))", "{{outcome}}")],
            8, 8, unit="reqps")
    lay.row("Sequential tests")
    lay.add("timeseries", "SPRT log-likelihood ratio",
            "Warm-start SPRT log-likelihood ratio; crossing the upper boundary accepts the "
            "regression hypothesis, the lower boundary accepts no regression.",
            [(sel("assaywatch_sprt_log_likelihood_ratio"), "LLR {{version}} {{scenario}}"),
             (sel("assaywatch_sprt_lower_boundary"), "lower boundary"),
             (sel("assaywatch_sprt_upper_boundary"), "upper boundary")], 8, 8)
    lay.add("timeseries", "CUSUM on pass rate", "Bernoulli CUSUM statistic and its threshold.",
            [(sel("assaywatch_cusum_statistic", 'feature="pass_rate"'), "S {{version}}"),
             (sel("assaywatch_cusum_threshold", 'detector="cusum_pass_rate"'), "threshold")],
            8, 8)
    lay.add("timeseries", "CUSUM on fingerprint features",
            "Per-feature CUSUM statistics of the fingerprint and their threshold.",
            [(sel("assaywatch_cusum_statistic", 'feature!="pass_rate",feature!~"evaluation:.*"'),
              "{{feature}}"),
             (sel("assaywatch_cusum_threshold", 'detector="cusum_fingerprint"'), "threshold")],
            8, 8)
    lay.row("Evaluations")
    EVAL_ALARM = sel("assaywatch_alarm", 'detector="evaluation"')  # noqa: N806
    lay.add("timeseries", "Evaluation scores",
            "Mean of each evaluator's most recent scores (on the trace or joined late).",
            [(sel("assaywatch_evaluation_score"), "{{evaluator}} {{version}} {{scenario}}")],
            8, 8)
    lay.add("timeseries", "Score detectors (e-CUSUM)",
            "Each evaluator's e-CUSUM statistic; it alarms at log(ARL0 of its share).",
            [(sel("assaywatch_cusum_statistic", 'feature=~"evaluation:.*"'), "{{feature}}")],
            8, 8)
    lay.add("stat", "Evaluation alarms", "1 while an evaluator's score-drop alarm is raised.",
            [(f"max by (evaluator) ({EVAL_ALARM})", "{{evaluator}}")], 4, 8,
            mappings=ALARM_MAPPINGS)
    lay.add("timeseries", "Evaluations/s", "Scores received per second per evaluator.",
            [(f"sum by (evaluator) (rate({sel('assaywatch_evaluations_total')}{RATE}))",
              "{{evaluator}}")], 4, 8, unit="reqps")
    lay.row("Fingerprint")
    lay.add("timeseries", "Fingerprint shift (Mahalanobis distance)",
            "Mahalanobis distance of the recent mean fingerprint to the baseline.",
            [(sel("assaywatch_fingerprint_shift"), "{{version}} {{scenario}}")], 8, 8)
    lay.add("bargauge", "Features that moved",
            "Standardised shift of each fingerprint feature, largest first.",
            [(f"sort_desc(max by (feature) (abs({sel('assaywatch_fingerprint_feature_shift')})))",
              "{{feature}}")], 8, 8, instant=True)
    lay.add("timeseries", "Hotelling T² p-value",
            "p-value of the two-sample Hotelling T² test against the baseline (log scale).",
            [(sel("assaywatch_hotelling_p_value"), "{{version}} {{scenario}}")], 8, 8,
            custom={"scaleDistribution": {"type": "log", "log": 10}})
    lay.row("Coverage")
    lay.add("bargauge", "Coverage per dimension",
            "Coverage ratio per dimension (tool, path, state, boundary, model, overall).",
            [(f"max by (dimension) ({sel('assaywatch_coverage_ratio')})", "{{dimension}}")],
            8, 8, unit="percentunit", min=0, max=1, instant=True)
    lay.add("timeseries", "Coverage over time", "Coverage ratio per dimension over time.",
            [(f"max by (dimension) ({sel('assaywatch_coverage_ratio')})", "{{dimension}}")],
            16, 8, unit="percentunit", min=0, max=1)
    lay.row("Ingest health (per monitor instance)")
    lay.add("timeseries", "Spans received/s", "Spans accepted per receiver.",
            [(f"sum by (instance, receiver) (rate(assaywatch_spans_received_total{RATE}))",
              "{{instance}} {{receiver}}")], 6, 8, unit="reqps")
    lay.add("timeseries", "Spans rejected/s", "Spans rejected per receiver and reason.",
            [(f"sum by (instance, receiver, reason) (rate(assaywatch_spans_rejected_total{RATE}))",
              "{{receiver}} {{reason}}")], 6, 8, unit="reqps")
    lay.add("timeseries", "Spans dropped/s",
            "Spans dropped after acceptance: late spans, evicted traces, stream limit.",
            [(f"sum by (instance, reason) (rate(assaywatch_spans_dropped_total{RATE}))",
              "{{reason}}")], 6, 8, unit="reqps")
    lay.add("timeseries", "Pending traces", "Traces waiting for completion per instance.",
            [("sum by (instance) (assaywatch_pending_traces)", "{{instance}}")], 6, 8)
    lay.add("timeseries", "Log records/s",
            "OTLP log records accepted: evaluation events (gen_ai.evaluation.result) and "
            "others (discarded).",
            [(f"sum by (instance, receiver, event) "
              f"(rate(assaywatch_log_records_received_total{RATE}))",
              "{{receiver}} {{event}}")], 8, 8, unit="reqps")
    lay.add("timeseries", "Log records rejected/s", "Log records refused at the edge.",
            [(f"sum by (instance, receiver, reason) "
              f"(rate(assaywatch_log_records_rejected_total{RATE}))",
              "{{receiver}} {{reason}}")], 8, 8, unit="reqps")
    lay.add("timeseries", "Evaluation joins/s",
            "What became of evaluations received as log events: on_trace, late (joined a "
            "closed run), unmatched (no run within the join window), invalid, limits.",
            [(f"sum by (instance, outcome) (rate(assaywatch_evaluation_joins_total{RATE}))",
              "{{outcome}}")], 8, 8, unit="reqps")
    lay.add("timeseries", "Values sanitised/s",
            "Strings repaired (invalid UTF-8, over-long names and labels) and span times "
            "checked at the edge, per receiver and reason: a sender emitting junk.",
            [(f"sum by (instance, receiver, reason) "
              f"(rate(assaywatch_values_sanitised_total{RATE}))",
              "{{receiver}} {{reason}}")], 24, 6, unit="reqps")
    lay.add("table", "Monitor builds", "Running monitor instances per assaywatch version.",
            [("count by (version) (assaywatch_build_info)", "")], 24, 4, instant=True,
            table=True)
    return dashboard("assaywatch-agent", "assaywatch / Agent drill-down",
                     "One agent's statistics against their boundaries, its coverage and the "
                     "monitor's ingest health.", lay, multi_agent=False)


HEADER = "# Generated by dashboards/generate.py: edit that file, then run it.\n"


def render() -> dict[str, str]:
    """Every generated file as ``{path relative to dashboards/: text}``."""
    def dump_yaml(data: Any) -> str:
        return HEADER + yaml.safe_dump(data, sort_keys=False, width=10**6, allow_unicode=True)

    return {
        "assaywatch-overview.json": json.dumps(overview(), indent=2, ensure_ascii=False) + "\n",
        "assaywatch-agent.json": json.dumps(drilldown(), indent=2, ensure_ascii=False) + "\n",
        "alerts/assaywatch.rules.yaml": dump_yaml(prometheus_rules()),
        "grafana-alerting/assaywatch-alerts.yaml": dump_yaml(grafana_rules()),
    }


def main(out: Path = HERE) -> None:
    for rel, text in render().items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
