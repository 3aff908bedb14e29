"""End to end with real parts: every shipped PromQL expression runs on real monitor data.

A simulated tool-using agent (tests/e2e/otel_agent.py: the real OTel SDK and OTLP
exporters, gRPC and HTTP) feeds a real ``assaywatch monitor`` process; a real ``prometheus``
(Debian's package, installed by .ci/run; the test skips only when the binary is not on
PATH) scrapes it every second and evaluates the shipped alert rules. Then

* after an injected regression, ``AssaywatchRegressionAlarm`` goes pending/firing, read from
  Prometheus's ``/api/v1/alerts``, and it was inactive before the injection;
* every PromQL expression of every dashboard panel, annotation, query variable, alert rule
  and Grafana-managed rule (``iter_promql``) runs through ``/api/v1/query`` and returns data.
  An alert whose condition is false here by design (ingesting, monitor up, coverage above
  the floor...) must still run, and every series selector it reads must return data.

The run is staged so that every family has series: two streams learn baselines (one with an
empty scenario, which ``scenario=~".*"`` must still select), a third stream is over the
stream limit (``spans_dropped_total{reason="stream_limit"}``), one malformed OTLP/HTTP
request is rejected (``spans_rejected_total``), and the alarm counters are scraped at 0
before the regression so the onset annotation's ``increase()`` sees the step.

A second test runs the same checks against a STAND-IN ``/metrics`` written from the DESIGN.md
contract (``METRIC_FAMILIES``): deterministic and fast, it proves the harness, the names,
labels and PromQL, and the alert's pending transition even while the monitor is changing;
it does not prove what the monitor exports, which is the first test's job.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.trace import get_tracer

from assaywatch.dashboards.grafana import METRIC_FAMILIES, iter_promql, metric_names, selectors
from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run, make_provider
from tests.infra.prometheus import PROMETHEUS, get_json, prometheus_server, query, wait

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not on PATH "
                       "(apt-get install prometheus; .ci/run installs it)"),
]

LEARN = 100  # 40 gave an SPRT alarm on the healthy stream (seed 20261201)
CONFIG = f"""
assembler:
  grace_seconds: 0.5
detectors:
  learn_runs: {LEARN}
  hotelling_window: 30
  hotelling_every: 10
limits:
  max_streams: 2
checkpoint_seconds: 1
"""
AGENT = "checkout"

# Families the monitor does not export yet (the engine never sets them). Expressions that
# read only these are reported, not failed; the test fails once they return data, so that
# this set is emptied as soon as the monitor catches up.
MONITOR_GAPS: set[str] = set()
# Prometheus alert conditions expected to hold after the regression.
EXPECTED_FIRING = {"alert: AssaywatchRegressionAlarm"}


def _alerts(base: str, name: str) -> list[dict[str, Any]]:
    return [a for a in get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
            if a["labels"]["alertname"] == name]


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[MonitorProcess]:
    config = tmp_path / "monitor.yaml"
    config.write_text(CONFIG)
    mon = MonitorProcess("--config", str(config), "--state-dir", str(tmp_path / "state"))
    mon.start()
    yield mon
    code, err = mon.stop()
    print("monitor stderr (tail):\n" + err[-3000:])  # shown by pytest when the test failed
    assert code == 0, err[-2000:]


def _emit(provider: Any, scenario: str, n: int, behaviour: AgentBehaviour,
          rng: np.random.Generator, agent: str = AGENT) -> None:
    tracer = get_tracer("dashboards-e2e-agent", tracer_provider=provider)
    for _ in range(n):
        emit_run(tracer, rng, agent, "1.0", scenario, behaviour, time.time_ns())
    provider.force_flush()


def _post_malformed(monitor: MonitorProcess, path: str = "/v1/traces") -> int:
    request = urllib.request.Request(f"http://{monitor.addresses['otlp_http']}{path}",
                                     data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _check_expressions(prometheus: str, gaps_allowed: set[str]) -> list[str]:
    """Run every shipped expression; return the gap lines, fail on any other empty one."""
    exprs = iter_promql(DASHBOARDS)
    assert len(exprs) > 40, "iter_promql found too few expressions"
    empty: list[str] = []
    gaps: list[str] = []
    for item in exprs:
        if item.name.startswith("alert:") and item.name not in EXPECTED_FIRING:
            query(prometheus, item.expr)  # runs without error
            probes = selectors(item.expr)
            assert probes, f"{item.file} {item.name}: no selector found in {item.expr}"
        else:
            probes = [item.expr]
        for probe in probes:
            has_data = bool(query(prometheus, probe))
            line = f"{item.file} | {item.name} | {probe}"
            if metric_names(probe) and metric_names(probe) <= gaps_allowed:
                assert not has_data, f"remove from MONITOR_GAPS, it returns data now: {line}"
                gaps.append(line)
            elif not has_data:
                empty.append(line)
    assert not empty, "expressions returning no data:\n" + "\n".join(empty)
    return gaps


def test_real_monitor_every_expression_returns_data_and_regression_alert_fires(
        tmp_path: Path, monitor: MonitorProcess) -> None:
    with prometheus_server(tmp_path, monitor.addresses["metrics"]) as prometheus:
        _drive_real_monitor(monitor, prometheus)
        gaps = _check_expressions(prometheus, MONITOR_GAPS)
    print("not exported by the monitor yet:\n" + "\n".join(gaps))


def _drive_real_monitor(monitor: MonitorProcess, prometheus: str) -> None:
    rng = np.random.default_rng(20261201)
    grpc, _ = make_provider(monitor.addresses["otlp_grpc"], "grpc")
    http, _ = make_provider(monitor.addresses["otlp_http"], "http")
    # a judge's helpfulness score on every run: the evaluation panels have an evaluator
    healthy = AgentBehaviour(pass_rate=0.9, helpfulness=0.8)
    try:
        # baselines, then a full Hotelling window, for two streams; a third stream is over
        # the stream limit of 2, and its 300-character agent name is cut at the edge
        # (assaywatch_values_sanitised_total)
        _emit(grpc, "refund", LEARN + 30, healthy, rng)
        _emit(http, "", LEARN + 30, healthy, rng)
        _emit(grpc, "overflow", 2, healthy, rng, agent="other-agent-" + "x" * 300)
        assert _post_malformed(monitor) == 400
        assert _post_malformed(monitor, "/v1/logs") == 400  # log_records_rejected_total
        wait("both baselines and a Hotelling test scraped", lambda: len(query(
            prometheus, f'assaywatch_hotelling_p_value{{agent="{AGENT}"}}')) == 2)
        # two more scrapes, so the alarm counters have samples at 0 before the regression
        time.sleep(2.5)
        assert _alerts(prometheus, "AssaywatchRegressionAlarm") == [], "alarm before regression"

        # the regression: pass rate 0.9 -> 0.3 and a different tool mix, on one stream
        regressed = AgentBehaviour(pass_rate=0.3, tools={"lookup_order": 0.05,
                                                         "search_kb": 0.75, "refund": 0.2})
        _emit(grpc, "refund", 60, regressed, rng)
        alerts = wait("AssaywatchRegressionAlarm pending or firing",
                       lambda: _alerts(prometheus, "AssaywatchRegressionAlarm"))
    finally:
        grpc.shutdown()
        http.shutdown()
    assert {a["state"] for a in alerts} <= {"pending", "firing"}
    assert {(a["labels"]["agent"], a["labels"]["scenario"]) for a in alerts} == {
        (AGENT, "refund")}, alerts
    # the onset counter must have moved within the annotation's step before it is queried
    wait("alarm onset scraped", lambda: query(
        prometheus, "increase(assaywatch_alarms_total[1m]) > 0"))
    wait("the regressed stream's runs scraped", lambda: query(
        prometheus, f'sum(assaywatch_runs_total{{scenario="refund"}}) >= {LEARN + 90}'))



# Label values of the stand-in; the empty scenario checks that `scenario=~".*"` (the "All"
# value) also selects a stream whose scenario label is absent.
VALUES: dict[str, list[str]] = {
    "agent": [AGENT], "version": ["1.0"], "scenario": ["refund", ""],
    "outcome": ["pass", "fail", "unknown"],
    "detector": ["sprt", "cusum_pass_rate", "cusum_fingerprint", "hotelling", "evaluation"],
    "evaluator": ["", "helpfulness"], "event": ["gen_ai.evaluation.result", "other"],
    "test": ["pass_rate", "fingerprint", "sprt"], "verdict": ["pass", "fail", "inconclusive"],
    "window": ["baseline", "recent"], "feature": ["pass_rate", "n_steps", "tool_entropy",
                                                      "evaluation:helpfulness"],
    "dimension": ["tool", "path", "state", "boundary", "model", "overall"],
    "receiver": ["otlp_grpc", "otlp_http"], "reason": ["invalid_argument", "late_span", "idle"],
    "state": ["learning", "calibrating", "monitoring"],
}


class StandIn:
    """Contract-shaped /metrics: counters grow per scrape; ``regressed`` raises an alarm."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.regressed = False

    def value(self, family: str, labels: dict[str, str]) -> float:
        alarmed = (self.regressed and labels.get("scenario") == "refund"
                   and labels.get("detector") == "sprt" and not labels.get("evaluator"))
        if family in ("assaywatch_alarm", "assaywatch_alarms_total"):
            return float(alarmed)
        if family.endswith("_total"):
            return float(self.scrapes * 3)
        if family == "assaywatch_verdict":
            return float(labels["verdict"] == "pass")
        return 1.0 if family == "assaywatch_build_info" else 0.8

    def render(self) -> str:
        self.scrapes += 1
        lines: list[str] = []
        for family, names in METRIC_FAMILIES.items():
            for combo in itertools.product(*(VALUES.get(n, ["0.1.0"]) for n in names)):
                labels = dict(zip(names, combo, strict=True))
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{family}{{{text}}} {self.value(family, labels)}")
        return "\n".join(lines) + "\n"


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, str]]:
    source = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            body = source.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield source, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_stand_in_every_expression_returns_data_and_regression_alert_fires(
        tmp_path: Path, stand_in: tuple[StandIn, str]) -> None:
    source, target = stand_in
    with prometheus_server(tmp_path, target) as prometheus:
        wait("three scrapes", lambda: query(
            prometheus, "count_over_time(assaywatch_build_info[1m]) >= 3"))
        assert _alerts(prometheus, "AssaywatchRegressionAlarm") == []
        source.regressed = True
        alerts = wait("AssaywatchRegressionAlarm pending",
                       lambda: _alerts(prometheus, "AssaywatchRegressionAlarm"))
        assert [(a["state"], a["labels"]["scenario"], a["labels"]["detector"])
                for a in alerts] == [("pending", "refund", "sprt")]  # `for: 1m` not yet over
        wait("alarm onset scraped", lambda: query(
            prometheus, "increase(assaywatch_alarms_total[1m]) > 0"))
        assert _check_expressions(prometheus, set()) == []
