"""The load-balancing topology on real parts: agents on the real OTel SDK -> the real
Collector (deploy/collector, its ``loadbalancing`` exporter with ``routing_key: service``,
``pipelines/loadbalancing-static.yaml``) -> three ``assaywatch monitor`` processes, all
scraped by one real Prometheus job with the shipped rules.

Shown (issue 17): each agent's streams live on exactly one monitor, whole (every stream of
the agent, every run sent), and no run is counted twice; the hashing spreads the agents over
at least two monitors; every shipped dashboard and rule expression runs across the three
instances without a matching error, and the fleet-level panels read the sums of the three
monitors' own ``/metrics`` and the numbers of runs, streams and monitors sent and started.

The runs go out in two halves with a scrape in between, so every ``runs_total`` series has
an increase after its first sample and the ``rate()`` panels read above zero.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import get_tracer
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.dashboards.grafana import PromQL, iter_promql
from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run, make_provider
from tests.infra.otelcol import otel_collector
from tests.infra.prometheus import PROMETHEUS, get_json, prometheus_server, query, wait

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
LB_CONFIG = ROOT / "deploy" / "collector" / "pipelines" / "loadbalancing-static.yaml"
OTELCOL = Path(os.environ.get("ASSAYWATCH_OTELCOL",
                              ROOT / "deploy" / "collector" / "bin" / "assaywatch-otelcol"))
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not on PATH "
                       "(apt-get install prometheus; .ci/run installs it)"),
    pytest.mark.skipif(not OTELCOL.is_file(),
                       reason="no Collector binary (deploy/collector/build.sh)"),
]

# The routing key is service.name, and each agent is its own service, named like the agent.
# The exporter hashes "service.name=<name>|" (CRC-32) onto a ring where each backend holds
# 200 points hashed from its endpoint; the monitors listen on free ports picked at each run,
# so the placement changes from run to run. Twelve agents rather than eight: a model of that
# ring put all twelve on one monitor in none of 20,000 random port draws (eight: 13 times),
# and that is the only way the spread check can fail.
AGENTS = ("checkout", "refunds", "search", "billing", "onboarding", "triage", "shipping",
          "returns", "catalog", "loyalty", "fraud", "support")
SCENARIOS = ("refund", "status")
RUNS = 40   # per stream; sent in two halves of RUNS // 2
LEARN = 20  # baselines freeze on the first half, so the detectors run on the second
N_MONITORS = 3
CONFIG = f"""
assembler:
  grace_seconds: 0.5
detectors:
  learn_runs: {LEARN}
  hotelling_window: 10
  hotelling_every: 5
  bootstrap_reps: 10
checkpoint_seconds: 1
"""


class _SpanCount(SpanProcessor):
    """Counts the spans the SDK ended: what the agents sent, measured at the source."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


def _by(base: str, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1])
            for r in query(base, expr)}


def _scalar(base: str, expr: str) -> float | None:
    result = query(base, expr)
    assert len(result) <= 1, (expr, result)
    return float(result[0]["value"][1]) if result else None


def _samples(monitor: MonitorProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of the monitor's own ``/metrics``, by sample name (one snapshot)."""
    with urllib.request.urlopen(monitor.url("/metrics"), timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((dict(s.labels), float(s.value)))
    return samples


def _streams(monitor: MonitorProcess) -> list[dict[str, Any]]:
    streams: list[dict[str, Any]] = get_json(monitor.url("/api/streams"))["streams"]
    return streams


def _send_half(tracers: dict[str, Any], rng: np.random.Generator) -> None:
    behaviour = AgentBehaviour(pass_rate=0.9, helpfulness=0.8)
    for _ in range(RUNS // 2):
        for agent in AGENTS:
            for scenario in SCENARIOS:
                emit_run(tracers[agent], rng, agent, "1.0", scenario, behaviour,
                         time.time_ns())


def _panel(exprs: list[PromQL], file: str, name: str) -> str:
    found = [p.expr for p in exprs if p.file == file and p.name == name]
    assert len(found) == 1, f"{file} has {len(found)} '{name}' expressions"
    return found[0]


def test_each_agent_lives_on_one_monitor_and_dashboards_aggregate(tmp_path: Path) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    monitors: list[MonitorProcess] = []
    providers: list[TracerProvider] = []
    stops: list[tuple[int, str]] = []
    try:
        for i in range(N_MONITORS):
            config = tmp_path / f"monitor-{i}.yaml"
            config.write_text(CONFIG)
            monitors.append(MonitorProcess("--config", str(config), "--state-dir",
                                           str(tmp_path / f"state-{i}")).start())
        timings["monitors"] = time.monotonic() - t0
        backends = {f"ASSAYWATCH_MONITOR_{i + 1}": m.addresses["otlp_grpc"]
                    for i, m in enumerate(monitors)}
        with prometheus_server(tmp_path, [m.addresses["metrics"] for m in monitors]) as prom, \
                otel_collector(LB_CONFIG, env=backends) as col:
            timings["collector"] = time.monotonic() - t0
            try:
                _drive(col.grpc_endpoint, prom, monitors, providers, timings, t0)
            finally:  # while the Collector still takes what is left
                for provider in providers:
                    provider.shutdown()
    finally:
        for monitor in monitors:
            stops.append(monitor.stop())
    print("timings (s from start)", {k: round(v, 1) for k, v in timings.items()})
    for code, err in stops:
        assert code == 0, err[-2000:]


def _drive(endpoint: str, prom: str, monitors: list[MonitorProcess],
           providers: list[TracerProvider], timings: dict[str, float], t0: float) -> None:
    """One tracer provider per agent (its service.name) into the Collector; two halves."""
    count = _SpanCount()
    tracers = {}
    for agent in AGENTS:
        provider, _ = make_provider(endpoint, "grpc", service=agent)
        provider.add_span_processor(count)
        providers.append(provider)
        tracers[agent] = get_tracer("loadbalancing-e2e", tracer_provider=provider)
    rng = np.random.default_rng(20261217)
    runs_sum = "sum(assaywatch_runs_total)"
    half = len(AGENTS) * len(SCENARIOS) * (RUNS // 2)
    _send_half(tracers, rng)
    for provider in providers:
        provider.force_flush()
    wait(f"{half} runs scraped", lambda: _scalar(prom, runs_sum) == half,
          last=lambda: _scalar(prom, runs_sum))
    timings["first half scraped"] = time.monotonic() - t0
    _send_half(tracers, rng)
    for provider in providers:
        provider.force_flush()
    _check_placement(monitors)
    timings["runs closed"] = time.monotonic() - t0
    _check_prometheus(prom, monitors, count.ended)
    timings["prometheus checked"] = time.monotonic() - t0


def _check_placement(monitors: list[MonitorProcess]) -> None:
    """Every agent's streams on exactly one monitor, whole; no run counted twice."""
    per_agent = RUNS * len(SCENARIOS)

    def runs_by_monitor() -> list[Counter[str]]:
        """Runs per agent on each monitor, from its ``assaywatch_runs_total``."""
        counts = []
        for monitor in monitors:
            samples = _samples(monitor)
            counted: Counter[str] = Counter()
            for labels, value in samples["assaywatch_runs_total"]:
                counted[labels["agent"]] += int(value)
            # the streams' calibration counts as settled only in the same snapshot
            if any(v for _, v in samples["assaywatch_calibrations_pending"]):
                counted["(calibrating)"] += 1
            counts.append(counted)
        return counts

    # every run closed (grace_seconds) and exported (the /metrics snapshot is refreshed at
    # most every few seconds), and every frozen baseline's detectors calibrated
    wait(f"{per_agent} runs of each agent counted, calibrations done",
          lambda: sum(runs_by_monitor(), Counter()) == dict.fromkeys(AGENTS, per_agent),
          last=runs_by_monitor)
    placement: dict[str, list[int]] = defaultdict(list)
    for i, (monitor, counted) in enumerate(zip(monitors, runs_by_monitor(), strict=True)):
        streams = _streams(monitor)
        agents = sorted({st["agent"] for st in streams})
        print(f"monitor {i + 1} ({monitor.addresses['otlp_grpc']}): "
              f"{', '.join(agents) or '(no agent)'}")
        for agent in agents:
            placement[agent].append(i)
            assert sorted((st["version"], st["scenario"], st["runs"]) for st in streams
                          if st["agent"] == agent) == [("1.0", s, RUNS)
                                                       for s in sorted(SCENARIOS)], agent
        # the monitor's counters say the same: per agent, the runs sent, on this monitor only
        assert counted == dict.fromkeys(agents, per_agent), (i, counted)
    assert sorted(placement) == sorted(AGENTS)
    assert all(len(on) == 1 for on in placement.values()), dict(placement)
    used = {on[0] for on in placement.values()}
    assert len(used) >= 2, f"all agents hashed onto monitor {used}: pick other names"


def _check_prometheus(prom: str, monitors: list[MonitorProcess], spans_sent: int) -> None:
    """The shipped queries across the three instances: no errors, and fleet totals that are
    the runs, streams and monitors started, and the sums of the monitors' own /metrics."""
    total_runs = len(AGENTS) * len(SCENARIOS) * RUNS
    n_streams = len(AGENTS) * len(SCENARIOS)
    runs = "sum by (agent) (assaywatch_runs_total)"
    wait("every agent's runs scraped",
          lambda: _by(prom, runs, "agent") == {(a,): RUNS * len(SCENARIOS) for a in AGENTS},
          last=lambda: _by(prom, runs, "agent"))
    exprs = iter_promql(DASHBOARDS)
    errors, with_data = [], 0
    for item in exprs:
        try:
            with_data += bool(query(prom, item.expr))
        except AssertionError as exc:
            errors.append(f"{item.file} | {item.name} | {exc}")
    assert not errors, "expressions failing across instances:\n" + "\n".join(errors)
    print(f"{len(exprs)} shipped expressions run across {len(monitors)} instances, "
          f"{with_data} with data")

    # the sums of the monitors' own /metrics, read once everything has settled
    def own(name: str, key: str | None = None) -> Counter[str]:
        sums: Counter[str] = Counter()
        for monitor in monitors:
            for labels, value in _samples(monitor)[name]:
                sums[labels.get(key, "") if key else ""] += value
        return sums

    overview = "assaywatch-overview.json"
    alarms, failing = own("assaywatch_alarm")[""], own("assaywatch_verdict", "verdict")["fail"]
    phases = own("assaywatch_stream_state", "state")
    assert sum(phases.values()) == n_streams
    expected: list[tuple[str, float]] = [
        (_panel(exprs, overview, "panel: Streams"), n_streams),
        ("sum(assaywatch_runs_total)", total_runs),
        ("sum(assaywatch_spans_received_total)", spans_sent),
        ("sum(assaywatch_spans_received_total)", own("assaywatch_spans_received_total")[""]),
        (_panel(exprs, overview, "panel: Active alarms"), alarms),
        (_panel(exprs, overview, "panel: Failing verdicts"), failing),
    ]
    for expr, value in expected:
        wait(f"{expr} == {value}", lambda e=expr, v=value: _scalar(prom, e) == v,
              timeout=10, last=lambda e=expr: _scalar(prom, e))
    # by phase: the monitors' own counts once Prometheus has scraped them (its last scrape
    # may predate the last calibration: the totals above are the same in every phase)
    by_phase = _panel(exprs, overview, "panel: Streams by phase")
    own_phases = {(k,): v for k, v in phases.items()}
    wait(f"{by_phase} == {own_phases}",
         lambda: _by(prom, by_phase, "state") == own_phases, timeout=10,
         last=lambda: _by(prom, by_phase, "state"))
    builds = _panel(exprs, "assaywatch-agent.json", "panel: Monitor builds")
    assert list(_by(prom, builds, "version").values()) == [N_MONITORS]
    pending = _panel(exprs, overview, "panel: Calibrations pending")
    assert _by(prom, pending, "instance") == {
        (m.addresses["metrics"],): 0.0 for m in monitors}
    # the rate panels see the second half's runs and spans
    for name in ("panel: Runs/s", "panel: Spans received/s"):
        value = _scalar(prom, _panel(exprs, overview, name))
        assert value is not None and value > 0, (name, value)
    # the agent picker lists every agent, whichever monitor holds it
    picker = _panel(exprs, overview, "variable: agent")
    assert {r["metric"]["agent"] for r in query(prom, picker)} == set(AGENTS)
    # one agent's dashboard: its baselines froze at learn_runs on each scenario
    for agent in AGENTS:
        per_agent = iter_promql(DASHBOARDS, {"agent": agent})
        baseline = _panel(per_agent, "assaywatch-agent.json", "panel: Baseline runs")
        assert _by(prom, baseline, "version", "scenario") == {
            ("1.0", s): LEARN for s in SCENARIOS}, agent
