"""What the monitor acknowledges survives ``kill -9`` and ``SIGTERM`` (DESIGN.md "Reliability
rules"; monitor/README.md "Durability").

A real ``assaywatch monitor`` process with a state dir; an agent emitting its runs through
the real OpenTelemetry SDK and sending each run as one export of the real OTLP exporter, so
a run is *acknowledged* exactly when that export returned SUCCESS. Failed exports are sent
again later, as a Collector's retry queue would.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEARN = 40
CONFIG = f"""
assembler:
  grace_seconds: 0.3
detectors:
  learn_runs: {LEARN}
  arl0: 2000
  hotelling_window: 40
  hotelling_every: 10
checkpoint_seconds: 3
"""
GOOD = AgentBehaviour(pass_rate=0.9)
BAD = AgentBehaviour(pass_rate=0.2)
#: counter families that must never go backwards across a restart
COUNTERS = ("assaywatch_spans_received_total", "assaywatch_spans_rejected_total",
            "assaywatch_spans_dropped_total", "assaywatch_runs_total",
            "assaywatch_alarms_total")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """Runs emitted by the real SDK into memory, each sent as one OTLP export."""

    def __init__(self, endpoint: str, protocol: str, seed: int) -> None:
        self.provider = TracerProvider(resource=Resource.create(
            {"service.name": "support-svc", "service.version": "1.0"}))
        self.memory = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("crash-recovery")
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter,
            )
            self.exporter: Any = OTLPSpanExporter(endpoint=f"http://{endpoint}",
                                                  insecure=True, timeout=2)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )
            self.exporter = HttpExporter(endpoint=f"http://{endpoint}/v1/traces", timeout=2)
        self.rng = np.random.default_rng(seed)
        self.sent: dict[str, str] = {}  # trace id -> agent
        self.acked: set[str] = set()
        self.failed: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def run(self, agent: str, behaviour: AgentBehaviour) -> None:
        emit_run(self.tracer, self.rng, agent, "1.0", "refund", behaviour, time.time_ns())
        spans = self.memory.get_finished_spans()
        self.memory.clear()
        tid = format(spans[0].context.trace_id, "032x")
        with self.lock:
            self.sent[tid] = agent
        self._send(tid, spans)

    def _send(self, tid: str, spans: Any) -> None:
        ok = self.exporter.export(spans) is SpanExportResult.SUCCESS
        with self.lock:
            if ok:
                self.acked.add(tid)
            else:
                self.failed.append((tid, spans))

    def resend_failed(self) -> None:
        for _ in range(5):
            with self.lock:
                todo, self.failed = self.failed, []
            if not todo:
                return
            for tid, spans in todo:
                self._send(tid, spans)

    def acked_by_agent(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for tid in self.acked:
                out[self.sent[tid]] = out.get(self.sent[tid], 0) + 1
            return out


def sender(agent: Agent, rounds: int, stop: threading.Event, pace_s: float = 0.008) -> None:
    """One run of each stream per round; ``regress-agent`` turns bad after the baseline."""
    for i in range(rounds):
        if stop.is_set():
            return
        agent.run("steady-agent", GOOD)
        agent.run("regress-agent", GOOD if i < LEARN + 5 else BAD)
        time.sleep(pace_s)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def counter_samples(samples: dict[Any, float]) -> dict[Any, float]:
    return {k: v for k, v in samples.items() if k[0] in COUNTERS}


def runs_of(samples: dict[Any, float], agent: str) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "assaywatch_runs_total" and ("agent", agent) in labels)


def onsets(state: Path) -> list[dict[str, Any]]:
    path = state / "events.jsonl"
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in out if e.get("event") == "alarm"]


def assert_no_duplicate_onset(events: list[dict[str, Any]]) -> None:
    ids = [e["onset_id"] for e in events]
    assert len(ids) == len(set(ids)), events
    last: dict[tuple[str, ...], int] = {}
    for e in events:
        ep = (e["agent"], e["version"], e["scenario"], e["detector"], e["baseline_id"])
        assert e["run_index"] > last.get(ep, 0), f"onset repeated or backwards: {e}"
        last[ep] = e["run_index"]


def start_monitor(state: Path, cfg: Path, ports: dict[str, int]) -> MonitorProcess:
    return MonitorProcess(
        "--config", str(cfg), "--state-dir", str(state),
        "--otlp-grpc", f"127.0.0.1:{ports['grpc']}", "--otlp-http",
        f"127.0.0.1:{ports['http']}", "--metrics", f"127.0.0.1:{ports['metrics']}").start()


def wait_counted(mon: MonitorProcess, agent: Agent, timeout: float = 30) -> dict[Any, float]:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(mon.url(""))
        want = agent.acked_by_agent()
        if all(runs_of(samples, a) >= n for a, n in want.items()):
            return samples
        if time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(CONFIG)
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    return tmp_path / "state", cfg, ports


def check_counted(samples: dict[Any, float], agent: Agent) -> None:
    acked = agent.acked_by_agent()
    sent: dict[str, int] = {}
    for a in agent.sent.values():
        sent[a] = sent.get(a, 0) + 1
    counted = {a: runs_of(samples, a) for a in acked}
    # >= 99.9% of the acknowledged runs counted, and none twice
    assert sum(counted.values()) >= 0.999 * sum(acked.values()), (counted, acked)
    assert all(counted[a] <= sent[a] for a in acked), (counted, sent)


def test_kill_9_loses_no_acknowledged_run_repeats_no_onset_and_no_counter_goes_back(
        tmp_path: Path) -> None:
    state, cfg, ports = setup(tmp_path)
    mon = start_monitor(state, cfg, ports)
    agent = Agent(f"127.0.0.1:{ports['grpc']}", "grpc", seed=11)
    stop = threading.Event()
    thread = threading.Thread(target=sender, args=(agent, LEARN + 260, stop), daemon=True)
    try:
        thread.start()
        # the regressed stream's alarm becomes active...
        deadline = time.monotonic() + 30
        while not any(e["agent"] == "regress-agent" for e in onsets(state)):
            assert time.monotonic() < deadline, "the regressed stream never alarmed"
            time.sleep(0.05)
        time.sleep(0.3)
        # ...and the monitor is killed while the agent keeps sending
        before = scrape(mon.url(""))
        assert mon.proc is not None
        mon.proc.kill()
        mon.proc.wait()
        onsets_at_kill = onsets(state)
        acked_at_kill = sum(agent.acked_by_agent().values())
        mon = start_monitor(state, cfg, ports)
        after = scrape(mon.url(""))
        lower = {k: (v, after.get(k, 0.0)) for k, v in counter_samples(before).items()
                 if after.get(k, 0.0) < v}
        assert not lower, f"counters went backwards across kill -9: {lower}"
        # every run acknowledged before the kill is counted at the first scrape
        counted = runs_of(after, "regress-agent") + runs_of(after, "steady-agent")
        assert counted >= 0.999 * acked_at_kill, (counted, acked_at_kill)
        thread.join(timeout=60)
        agent.resend_failed()
        samples = wait_counted(mon, agent)
        check_counted(samples, agent)
        events = onsets(state)
        assert_no_duplicate_onset(events)
        assert events[:len(onsets_at_kill)] == onsets_at_kill
        assert any(e["agent"] == "regress-agent" for e in events)
        # the alarm made active before the kill is still active
        assert any(v == 1 for (n, labels), v in samples.items()
                   if n == "assaywatch_alarm" and ("agent", "regress-agent") in labels)
    finally:
        stop.set()
        thread.join(timeout=30)
        code, err = mon.stop()
    assert code == 0, err[-3000:]


def test_sigterm_counts_every_acknowledged_run_after_restart(tmp_path: Path) -> None:
    state, cfg, ports = setup(tmp_path)
    mon = start_monitor(state, cfg, ports)
    agent = Agent(f"127.0.0.1:{ports['http']}", "http", seed=12)
    stop = threading.Event()
    thread = threading.Thread(target=sender, args=(agent, 200, stop), daemon=True)
    try:
        thread.start()
        while len(agent.acked) < 120:
            assert thread.is_alive()
            time.sleep(0.02)
        code, err = mon.stop()  # SIGTERM while the agent sends over keep-alive HTTP
        assert code == 0, err[-3000:]
        acked_at_stop = set(agent.acked)
        mon = start_monitor(state, cfg, ports)
        samples = wait_counted(mon, agent, timeout=10)
        counted = runs_of(samples, "steady-agent") + runs_of(samples, "regress-agent")
        # every run acknowledged before the stop is counted once the monitor is back
        assert counted >= len(acked_at_stop), (counted, len(acked_at_stop))
        thread.join(timeout=60)
        agent.resend_failed()
        check_counted(wait_counted(mon, agent), agent)
        assert_no_duplicate_onset(onsets(state))
    finally:
        stop.set()
        thread.join(timeout=30)
        code, err = mon.stop()
    assert code == 0, err[-3000:]


class _Planted:
    """A pickle that would create a file when loaded."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _run_monitor(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "assaywatch.monitor.commands.cli", "monitor", "--state-dir",
         str(state), "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
         "--metrics", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)


def _files(state: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in state.iterdir()
            if p.is_file() and not p.name.endswith(("-wal", "-shm"))}


def _plant(db: Path, payload: bytes) -> None:
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        con.execute("CREATE TABLE IF NOT EXISTS blobs (name TEXT PRIMARY KEY, value BLOB)")
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema', '2')")
        con.execute("INSERT OR REPLACE INTO meta VALUES ('mac', ?)", ("0" * 64,))
        con.execute("INSERT OR REPLACE INTO blobs VALUES ('engine', ?)", (payload,))


def test_a_crafted_pickle_in_the_state_dir_is_refused_with_exit_3(tmp_path: Path) -> None:
    from assaywatch.monitor.service.state import StateStore

    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Planted(str(marker)))
    # 1) no key beside the checkpoint: not written by this state dir's monitor
    alone = tmp_path / "alone"
    alone.mkdir()
    _plant(alone / "state.sqlite", payload)
    # 2) a real state dir (with its key) whose engine blob was replaced
    real = tmp_path / "real"
    StateStore(real).save({"engine": ({}, {}, {}), "counters": None})
    _plant(real / "state.sqlite", payload)
    for state in (alone, real):
        files = _files(state)
        res = _run_monitor(state)
        assert res.returncode == 3, res.stderr[-2000:]
        assert "not written by this state dir's monitor" in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        assert not marker.exists(), "the planted pickle was executed"
        assert _files(state) == files, "a refused state dir must be left as it was"
