"""End to end with real parts: the real OTel SDK and OTLP exporters (gRPC and HTTP) send a
simulated tool-using agent's runs to a real ``assaywatch monitor`` process; the test
scrapes /metrics over HTTP and reads the alarm event log."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.trace import get_tracer
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run, make_provider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEARN = 150
CONFIG = f"""
assembler:
  grace_seconds: 0.5
detectors:
  learn_runs: {LEARN}
  hotelling_window: 100
  hotelling_every: 20
checkpoint_seconds: 1
"""


def scrape(mon: MonitorProcess, since: float | None = None
           ) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``/metrics``; with ``since`` (``time.monotonic()``), of the first
    answer whose stream families were read after it: an answer may serve a snapshot up to
    2 s old (its ``X-Assaywatch-Snapshot-Age``), which under load can predate the state the
    test waited for."""
    while True:
        with urllib.request.urlopen(mon.url("/metrics"), timeout=10) as resp:
            text = resp.read().decode()
            age = float(resp.headers.get("X-Assaywatch-Snapshot-Age") or 0.0)
        if since is None or time.monotonic() - age >= since:
            break
        time.sleep(0.2)
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


def wait_runs(mon: MonitorProcess, expected: dict[str, int], timeout: float = 90.0) -> list:
    deadline = time.monotonic() + timeout
    samples: list = []
    while time.monotonic() < deadline:
        samples = scrape(mon)
        if all(value(samples, "assaywatch_runs_total", agent=a) >= n
               for a, n in expected.items()):
            # runs are counted as they arrive; a stream whose baseline froze feeds them to
            # its detectors once the calibration worker is done: wait for that too, then
            # for a snapshot read after it
            if not calibrating(mon):
                return scrape(mon, since=time.monotonic())
        time.sleep(0.5)
    got = {a: value(samples, "assaywatch_runs_total", agent=a) for a in expected}
    raise AssertionError(f"runs not assembled in time: expected {expected}, got {got}")


def calibrating(mon: MonitorProcess) -> bool:
    with urllib.request.urlopen(mon.url("/api/streams"), timeout=10) as resp:
        return any(s.get("calibrating") for s in json.load(resp)["streams"])


def emit(provider, agent: str, n: int, behaviour: AgentBehaviour, rng,
         after: AgentBehaviour | None = None, switch_at: int = LEARN + 50) -> None:
    tracer = get_tracer("e2e-agent", tracer_provider=provider)
    for i in range(n):
        b = after if after is not None and i >= switch_at else behaviour
        emit_run(tracer, rng, agent, "1.0", "refund", b, time.time_ns())


def events(state: Path) -> list[dict]:
    path = state / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    p = tmp_path / "monitor.yaml"
    p.write_text(CONFIG)
    return p


def test_monitor_alarms_on_regressions_and_not_on_a_stable_stream(
        tmp_path: Path, config_file: Path) -> None:
    state = tmp_path / "state"
    mon = MonitorProcess("--config", str(config_file), "--state-dir", str(state)).start()
    try:
        rng = np.random.default_rng(20261201)
        grpc_provider, _ = make_provider(mon.addresses["otlp_grpc"], "grpc")
        http_provider, _ = make_provider(mon.addresses["otlp_http"], "http")
        stable = AgentBehaviour(pass_rate=0.9)
        n_stable, n_drop, n_mix = LEARN + 600, LEARN + 250, LEARN + 300
        emit(grpc_provider, "stable-agent", n_stable, stable, rng)
        emit(grpc_provider, "dropping-agent", n_drop, stable, rng,
             after=AgentBehaviour(pass_rate=0.6))
        # The paper's "invisible to pass/fail" case: same pass rate, same number of tool
        # calls, but the agent stops looking orders up and searches the knowledge base.
        emit(http_provider, "mixing-agent", n_mix, stable, rng,
             after=AgentBehaviour(pass_rate=0.9, tools={"lookup_order": 0.05,
                                                        "search_kb": 0.75, "refund": 0.2}))
        grpc_provider.shutdown()
        http_provider.shutdown()
        samples = wait_runs(mon, {"stable-agent": n_stable, "dropping-agent": n_drop,
                                  "mixing-agent": n_mix})
        assert value(samples, "assaywatch_spans_received_total", receiver="otlp_grpc") > 0
        assert value(samples, "assaywatch_spans_received_total", receiver="otlp_http") > 0
        # runs by outcome add up, and coverage is exported per dimension
        for agent, n in (("stable-agent", n_stable), ("dropping-agent", n_drop)):
            total = sum(value(samples, "assaywatch_runs_total", agent=agent, outcome=o)
                        for o in ("pass", "fail", "unknown"))
            assert total == n
        # no tool inventory on the wire: tool coverage is not measured, so not exported
        dims = {lab["dimension"] for n, lab, _ in samples
                if n == "assaywatch_coverage_ratio" and lab.get("agent") == "stable-agent"}
        assert "tool" not in dims and {"path", "state", "overall"} <= dims
        assert value(samples, "assaywatch_baseline_runs", agent="stable-agent") == LEARN
        # no alarm over the long unchanged stream
        assert value(samples, "assaywatch_alarms_total", agent="stable-agent") == 0
        # a pass-rate drop alarms on a pass-rate detector, within a bounded number of runs
        ev = events(state)
        drop = [e for e in ev if e["agent"] == "dropping-agent"]
        assert {e["detector"] for e in drop} & {"sprt", "cusum_pass_rate"}, drop
        first = min(e["run_index"] for e in drop
                    if e["detector"] in ("sprt", "cusum_pass_rate"))
        assert 50 < first <= 50 + 150, f"pass-rate alarm at monitored run {first}"
        # a tool-mix change with the pass rate unchanged alarms on a fingerprint detector
        mix = [e for e in ev if e["agent"] == "mixing-agent"]
        fp_runs = [e["run_index"] for e in mix
                   if e["detector"] in ("cusum_fingerprint", "hotelling")]
        assert fp_runs, mix
        assert 50 < min(fp_runs) <= 50 + 150, f"fingerprint alarm at run {min(fp_runs)}"
        assert value(samples, "assaywatch_alarm", agent="mixing-agent",
                     detector="cusum_fingerprint") + value(
            samples, "assaywatch_alarm", agent="mixing-agent", detector="hotelling") >= 1
        # evidence is written beside each alarm
        assert all(e["baseline_id"] and "baseline_runs" in e["evidence"] for e in ev)
    finally:
        code, err = mon.stop()
    assert code == 0, err[-2000:]


def test_restart_resumes_counts_without_repeating_alarms(tmp_path: Path,
                                                         config_file: Path) -> None:
    state = tmp_path / "state"
    rng = np.random.default_rng(7)
    mon = MonitorProcess("--config", str(config_file), "--state-dir", str(state)).start()
    n1 = LEARN + 200
    try:
        provider, _ = make_provider(mon.addresses["otlp_grpc"], "grpc")
        emit(provider, "restart-agent", n1, AgentBehaviour(), rng,
             after=AgentBehaviour(pass_rate=0.5), switch_at=LEARN + 20)
        provider.shutdown()
        before = wait_runs(mon, {"restart-agent": n1})
    finally:
        code, err = mon.stop()
    assert code == 0, err[-2000:]
    onsets_before = events(state)
    assert onsets_before, "the regression should have alarmed before the restart"
    alarms_before = value(before, "assaywatch_alarms_total", agent="restart-agent")

    mon = MonitorProcess("--config", str(config_file), "--state-dir", str(state)).start()
    try:
        after = scrape(mon)
        assert value(after, "assaywatch_runs_total", agent="restart-agent") == n1
        assert value(after, "assaywatch_alarms_total", agent="restart-agent") == alarms_before
        provider, _ = make_provider(mon.addresses["otlp_grpc"], "grpc")
        emit(provider, "restart-agent", 40, AgentBehaviour(pass_rate=0.5), rng)
        provider.shutdown()
        wait_runs(mon, {"restart-agent": n1 + 40})
    finally:
        code, err = mon.stop()
    assert code == 0, err[-2000:]
    onsets_after = events(state)
    # the alarm that was active stays active: no new onset for the same detectors
    assert [(e["detector"], e["run_index"]) for e in onsets_after] == [
        (e["detector"], e["run_index"]) for e in onsets_before]
