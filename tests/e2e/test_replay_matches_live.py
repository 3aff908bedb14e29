"""Replay = live: the same spans give the same alarms, at the same runs, whether a real
``assaywatch monitor`` process receives them over OTLP/gRPC or ``assaywatch replay`` reads
them from a JSON Lines file. One TracerProvider feeds both: a BatchSpanProcessor with the
real OTLP exporter, and a SimpleSpanProcessor with an in-memory exporter whose spans are
written to the file afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run, make_provider

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEARN = 200
CONFIG = f"""
assembler:
  grace_seconds: 0.5
detectors:
  learn_runs: {LEARN}
  arl0: 2000
  hotelling_window: 60
  hotelling_every: 10
checkpoint_seconds: 1
"""


def runs_total(mon: MonitorProcess) -> float:
    with urllib.request.urlopen(mon.url("/metrics"), timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "assaywatch_runs_total")


def alarm_keys(events: list[dict]) -> list[tuple[str, str, str, str, int]]:
    return sorted((e["agent"], e["version"], e["scenario"], e["detector"], e["run_index"])
                  for e in events)


def test_replay_reproduces_the_live_alarms(tmp_path: Path) -> None:
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(CONFIG)
    state = tmp_path / "state"
    mon = MonitorProcess("--config", str(cfg), "--state-dir", str(state)).start()
    spans_file = tmp_path / "recorded.jsonl"
    try:
        provider, _ = make_provider(mon.addresses["otlp_grpc"], "grpc")
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("replay-live")
        rng = np.random.default_rng(20261202)
        good = AgentBehaviour(pass_rate=0.9)
        streams = {  # agent -> behaviour after the switch
            "drop-agent": AgentBehaviour(pass_rate=0.55),
            "mix-agent": AgentBehaviour(pass_rate=0.9, tools={
                "lookup_order": 0.05, "search_kb": 0.75, "refund": 0.2}),
            "steady-agent": good,
        }
        # the mix change alarms 41-134 runs after the switch over 16 bootstrap seeds (the
        # baseline id, hence the seed, holds the runs' wall-clock start times): 370 runs
        # after it leave room (120 missed once in CI)
        n = LEARN + 400
        for i in range(n):  # interleave the streams, one run of each per round
            for agent, after in streams.items():
                b = after if i >= LEARN + 30 else good
                emit_run(tracer, rng, agent, "1.0", "refund", b, time.time_ns())
        provider.shutdown()  # flushes the OTLP exporter
        write_otlp_json_lines(str(spans_file), memory.get_finished_spans())
        deadline = time.monotonic() + 60
        while runs_total(mon) < n * len(streams):
            assert time.monotonic() < deadline, f"monitor saw {runs_total(mon)} runs"
            time.sleep(0.3)
    finally:
        code, err = mon.stop()
    assert code == 0, err[-2000:]
    log = state / "events.jsonl"
    live = [json.loads(line) for line in log.read_text().splitlines() if line]
    res = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "replay",
                          str(spans_file), "--config", str(cfg), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    replayed = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    # the comparison is not vacuous: both regressions alarmed, the steady stream did not
    agents = {e["agent"] for e in live}
    assert {"drop-agent", "mix-agent"} <= agents and "steady-agent" not in agents, live
    assert alarm_keys(replayed) == alarm_keys(live)
    # same runs, not only the same indices
    assert sorted(e["run_id"] for e in replayed) == sorted(e["run_id"] for e in live)
