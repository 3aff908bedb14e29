"""The shipped alert rules, defined once and written two ways by ``generate.py``: as a
Prometheus rule file and as Grafana-managed rules (same expression, threshold, ``for``,
labels and texts, so the two stay equivalent by construction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: uid of the Prometheus datasource provisioned by deploy/grafana (Grafana-managed alerts
#: cannot use a template variable, so they name the provisioned datasource).
PROVISIONED_DS_UID = "assaywatch-prometheus"
#: Base of the runbook links; the anchors are headings of dashboards/README.md.
RUNBOOK_BASE = "https://github.com/assaywatch/assaywatch/blob/main/dashboards/README.md"
#: The labels of a stream, for ``by (...)`` clauses.
STREAM = "agent, version, scenario"


@dataclass(frozen=True)
class Alert:
    """One alert, written both as a Prometheus rule and as a Grafana-managed rule.

    The condition is ``base op threshold``: Prometheus evaluates it as one expression,
    Grafana as query A = ``base``, B = last value of A, C = math ``$B op threshold``.
    """

    name: str
    base: str
    op: str
    threshold: str
    for_: str
    severity: str
    summary: str
    description: str
    anchor: str

    @property
    def expr(self) -> str:
        return f"{self.base} {self.op} {self.threshold}"

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE}#{self.anchor}"


STREAM_TEXT = ('agent="{{ $labels.agent }}" version="{{ $labels.version }}" '
               'scenario="{{ $labels.scenario }}"')
ALERTS = (
    # The detectors already control their false-alarm rates (SPRT alpha, CUSUM run length);
    # `for` only keeps a one-scrape blip of a restarting instance from paging.
    Alert("AssaywatchRegressionAlarm",
          f"max by ({STREAM}, detector, evaluator) (assaywatch_alarm)", ">", "0", "1m",
          "critical",
          "Regression alarm ({{ $labels.detector }}{{ if $labels.evaluator }} "
          "{{ $labels.evaluator }}{{ end }}) on {{ $labels.agent }} {{ $labels.version }}",
          "The {{ $labels.detector }} detector{{ if $labels.evaluator }} (evaluator "
          "{{ $labels.evaluator }}: its scores dropped){{ end }} finds that stream "
          + STREAM_TEXT + " departs from its frozen baseline.", "regression-alarm"),
    # Verdicts are recomputed per run over a rolling window and may flip between fail and
    # inconclusive near a boundary; five minutes of fail is a settled verdict.
    Alert("AssaywatchVerdictFail",
          f'max by ({STREAM}, test) (assaywatch_verdict{{verdict="fail"}})', ">", "0", "5m",
          "warning", "Verdict fail for {{ $labels.test }} on {{ $labels.agent }} "
          "{{ $labels.version }}",
          "The {{ $labels.test }} test of stream " + STREAM_TEXT + " has returned fail "
          "for 5 minutes.", "verdict-fail"),
    # Coverage only grows with runs, so a stream that stays below the floor for 30 minutes is
    # not exercising what the baseline exercised; 0.5 is a starting floor, tune per fleet.
    Alert("AssaywatchCoverageLow",
          f'min by ({STREAM}) (assaywatch_coverage_ratio{{dimension="overall"}})', "<", "0.5",
          "30m", "warning", "Coverage below floor on {{ $labels.agent }} {{ $labels.version }}",
          "Overall coverage of stream " + STREAM_TEXT
          + ' is {{ printf "%.2f" $value }}, below the floor 0.5.', "coverage-low"),
    # `or build_info * 0` makes an instance that never received a span count as zero too:
    # its received counter may have no series at all.
    Alert("AssaywatchNotIngesting",
          "(sum by (job, instance) (rate(assaywatch_spans_received_total[10m])) "
          "or sum by (job, instance) (assaywatch_build_info) * 0)", "==", "0", "15m",
          "warning", "Monitor {{ $labels.instance }} receives no spans",
          "The assaywatch monitor {{ $labels.instance }} has accepted no span for 25 minutes "
          "(10m rate window, 15m for).", "not-ingesting"),
    Alert("AssaywatchMonitorDown", 'min by (job, instance) (up{job=~"assaywatch.*"})', "==",
          "0", "5m", "critical", "Monitor {{ $labels.instance }} is down",
          "Prometheus cannot scrape the assaywatch monitor {{ $labels.instance }} (job "
          "{{ $labels.job }}) for 5 minutes.", "monitor-down"),
    Alert("AssaywatchSpansRejected",
          "sum by (job, instance, receiver, reason) (rate(assaywatch_spans_rejected_total[5m]))",
          ">", "0", "10m", "warning",
          "Monitor {{ $labels.instance }} rejects spans ({{ $labels.reason }})",
          "The {{ $labels.receiver }} receiver of {{ $labels.instance }} rejects "
          '{{ printf "%.3g" $value }} spans/s with reason {{ $labels.reason }}.',
          "spans-rejected"),
    Alert("AssaywatchSpansDropped",
          "sum by (job, instance, reason) (rate(assaywatch_spans_dropped_total[5m]))", ">", "0",
          "15m", "warning", "Monitor {{ $labels.instance }} drops spans ({{ $labels.reason }})",
          "{{ $labels.instance }} drops "
          '{{ printf "%.3g" $value }} accepted spans/s with reason {{ $labels.reason }}.',
          "spans-dropped"),
)


def prometheus_rules() -> dict[str, Any]:
    return {"groups": [{"name": "assaywatch", "rules": [
        {"alert": a.name, "expr": a.expr, "for": a.for_,
         "labels": {"severity": a.severity},
         "annotations": {"summary": a.summary, "description": a.description,
                         "runbook_url": a.runbook_url}}
        for a in ALERTS]}]}


def grafana_rules() -> dict[str, Any]:
    def to_grafana(text: str) -> str:
        # Grafana's template data names the value of query B instead of $value.
        return text.replace("$value", "$values.B.Value")

    def rule(a: Alert) -> dict[str, Any]:
        return {
            "uid": "assaywatch-" + a.anchor, "title": a.name, "condition": "C",
            "data": [
                {"refId": "A", "relativeTimeRange": {"from": 900, "to": 0},
                 "datasourceUid": PROVISIONED_DS_UID,
                 "model": {"refId": "A", "expr": a.base, "instant": True, "range": False}},
                {"refId": "B", "datasourceUid": "__expr__",
                 "model": {"refId": "B", "type": "reduce", "expression": "A",
                           "reducer": "last"}},
                {"refId": "C", "datasourceUid": "__expr__",
                 "model": {"refId": "C", "type": "math",
                           "expression": f"$B {a.op} {a.threshold}"}},
            ],
            "noDataState": "OK", "execErrState": "Error", "for": a.for_,
            "labels": {"severity": a.severity},
            "annotations": {"summary": to_grafana(a.summary),
                            "description": to_grafana(a.description),
                            "runbook_url": a.runbook_url},
            "isPaused": False,
        }

    return {"apiVersion": 1, "groups": [{"orgId": 1, "name": "assaywatch",
                                         "folder": "assaywatch", "interval": "1m",
                                         "rules": [rule(a) for a in ALERTS]}]}
