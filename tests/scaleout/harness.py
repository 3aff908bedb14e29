"""What the scale-out tests share: topics, the Collector config, the worker processes, the
simulated agents (the real OTel SDK), and reading back alarms and checkpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.prometheus import MonitorCollector
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.scaleout.detector import EngineGroup
from assaywatch.monitor.scaleout.records import (
    PartitionState,
    alarm_id,
    chain_step,
    decode_state,
    state_key,
)

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "deploy" / "collector" / "pipelines" / "kafka-pipeline.yaml"


def make_topics(bootstrap: str, prefix: str, spans_parts: int = 4, runs_parts: int = 6) -> dict:
    """Create the five topics of one test (names prefixed, so tests share a broker); the
    logs topic has the spans topic's partition count, as the assembler requires."""
    from confluent_kafka.admin import AdminClient, NewTopic

    names = {"spans": f"{prefix}.spans", "runs": f"{prefix}.runs", "logs": f"{prefix}.logs",
             "state": f"{prefix}.state", "alarms": f"{prefix}.alarms"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([
        NewTopic(names["spans"], spans_parts, 1),
        NewTopic(names["logs"], spans_parts, 1),
        NewTopic(names["runs"], runs_parts, 1),
        NewTopic(names["state"], runs_parts, 1, config={"cleanup.policy": "compact"}),
        NewTopic(names["alarms"], 1, 1)], operation_timeout=20)
    for fut in futs.values():
        fut.result()
    return names


def collector_config(folder: Path, spans_topic: str, logs_topic: str) -> Path:
    """deploy/collector/pipelines/kafka-pipeline.yaml with the test's spans and logs topics."""
    text = PIPELINE.read_text()
    assert "topic: assaywatch.spans" in text and "topic: assaywatch.logs" in text
    out = folder / "kafka-pipeline.yaml"
    out.write_text(text.replace("topic: assaywatch.spans", f"topic: {spans_topic}")
                   .replace("topic: assaywatch.logs", f"topic: {logs_topic}"))
    return out


class Worker:
    """``assaywatch kafka assemble|detect`` in a subprocess."""

    def __init__(self, stage: str, bootstrap: str, names: dict, instance: str,
                 config: Path, *extra: str, group: str = "") -> None:
        self.stage = stage
        self.instance = instance
        self.args = [sys.executable, "-m", "assaywatch.monitor.commands.cli", "kafka", stage,
                     "--bootstrap", bootstrap, "--runs-topic", names["runs"],
                     "--group", group or f"{names['runs']}-{stage}", "--instance-id", instance,
                     "--config", str(config), "--metrics", "127.0.0.1:0",
                     "--session-timeout-ms", "6000", "--log-level", "INFO", *extra]
        if stage == "assemble":
            self.args += ["--spans-topic", names["spans"], "--logs-topic", names["logs"]]
        else:
            self.args += ["--state-topic", names["state"], "--alarms-topic", names["alarms"]]
        self.proc: subprocess.Popen[str] | None = None
        self.metrics = ""
        self._err = tempfile.NamedTemporaryFile(mode="w+", prefix=f"aw-{instance}-",
                                                suffix=".log", delete=False)

    def start(self, timeout: float = 60.0) -> Worker:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"metrics=(\S+)", line)
            if "running" in line and m:
                self.metrics = m.group(1)
                return self
        self.kill()
        raise RuntimeError(f"{self.instance} did not start:\n{self.log()[-3000:]}")

    def log(self) -> str:
        self._err.flush()
        return Path(self._err.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 40.0) -> int:
        assert self.proc is not None
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def scrape(self) -> dict[tuple[str, tuple], float]:
        try:
            with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=30) as r:
                text = r.read().decode()
        except TimeoutError:
            if self.alive():
                assert self.proc is not None
                os.kill(self.proc.pid, signal.SIGUSR1)  # its threads' stacks, to its log
                time.sleep(0.5)
            raise AssertionError(f"{self.instance}: /metrics timed out\n"
                                 f"{self.log()[-6000:]}") from None
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric_sum(workers: Iterable[Worker], name: str) -> float:
    total = 0.0
    for w in workers:
        if w.alive():
            try:
                total += sum(v for (n, _), v in w.scrape().items() if n == name)
            except OSError:
                pass
    return total


class Agents:
    """Simulated agents on the real OTel SDK: OTLP/gRPC to the Collector, and every span
    also kept in memory for the replay file."""

    def __init__(self, endpoint: str, seed: int = 20261217) -> None:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        from tests.e2e.otel_agent import make_provider

        self.provider, _ = make_provider(endpoint, "grpc")
        self.memory = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("scaleout")
        self.rng = np.random.default_rng(seed)
        self.emitted = 0

    def round(self, streams: dict[str, Any], i: int) -> None:
        """One run of every stream (one after another in span time)."""
        from tests.e2e.otel_agent import emit_run

        for agent, behaviour in streams.items():
            b = behaviour(i) if callable(behaviour) else behaviour
            emit_run(self.tracer, self.rng, agent, "1.0", "refund", b, time.time_ns())
            self.emitted += 1

    def close(self, spans_file: Path) -> None:
        from assaywatch.monitor.receivers.files import write_otlp_json_lines

        self.provider.shutdown()
        write_otlp_json_lines(str(spans_file), self.memory.get_finished_spans())


def read_topic(bootstrap: str, topic: str, timeout: float = 20.0) -> list[Any]:
    """Every committed record of ``topic`` (all partitions) up to its end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    md = c.list_topics(topic, timeout=10)
    parts = list(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    deadline = time.monotonic() + timeout
    while len(eof) < len(parts) and time.monotonic() < deadline:
        for m in c.consume(200, timeout=0.5):
            if m.error() is not None:
                eof.add(m.partition())
            else:
                out.append(m)
    c.close()
    return out


def alarms_from_topic(bootstrap: str, topic: str) -> tuple[list[dict], int]:
    """Alarm records with duplicates (same id) dropped, and how many were dropped."""
    seen: dict[str, dict] = {}
    dups = 0
    for m in read_topic(bootstrap, topic):
        rec = json.loads(m.value())
        if rec["id"] in seen:
            dups += 1
            assert seen[rec["id"]] == rec, "a re-emitted alarm must be identical"
        else:
            seen[rec["id"]] = rec
    return list(seen.values()), dups


def final_states(bootstrap: str, names: dict) -> dict[int, PartitionState]:
    out: dict[int, PartitionState] = {}
    for m in read_topic(bootstrap, names["state"]):
        if not (m.key() or b"").startswith(f"{names['runs']}:".encode()):
            continue
        st = decode_state(m.value())
        assert m.key() == state_key(names["runs"], st.partition)
        out[st.partition] = st  # later offsets win
    return out


def replay_reference(spans_file: Path, cfg: MonitorConfig) -> dict[str, Any]:
    """The single-process replay: its alarms, engine and per-stream run-id chains."""
    from assaywatch.monitor.offline.load import iter_runs
    from assaywatch.monitor.pipeline.outcome import ContractRules

    alarms: list[Any] = []
    engine = Engine(cfg.detectors, (), on_alarm=alarms.append,
                    max_streams=cfg.limits.max_streams)
    rules = ContractRules.from_dict(cfg.contracts) if cfg.contracts else None
    chains: dict[StreamKey, tuple[int, str]] = {}
    episodes: dict[tuple[StreamKey, str], int] = {}
    records = []
    for run in iter_runs([str(spans_file)], rules=rules,
                         score_threshold=cfg.evaluation_threshold):
        chains[run.key] = chain_step(chains.get(run.key), run.run_id)
        for ev in engine.process(run):
            episodes[(ev.key, ev.alarm_key)] = episodes.get((ev.key, ev.alarm_key), 0) + 1
            records.append({**ev.to_dict(), "episode": episodes[(ev.key, ev.alarm_key)],
                            "id": alarm_id(ev.key, ev.alarm_key, episodes[(ev.key, ev.alarm_key)])})
    return {"alarms": records, "engine": engine, "chains": chains}


def alarm_keys(records: Iterable[dict]) -> list[tuple]:
    return sorted((r["agent"], r["version"], r["scenario"], r["detector"], r["run_index"],
                   r["episode"], r["run_id"], r["id"]) for r in records)


def stream_samples(engine: Any) -> list[tuple]:
    """Every per-stream sample the exporters' collector gives for ``engine``, every
    stream's status computed first (a snapshot's time budget would leave some due)."""
    engine.settle()
    col = MonitorCollector(engine, IngestCounters())
    out = []
    for fam in col.stream_metrics():
        for s in fam.samples:
            if "agent" in s.labels:  # the engine-wide families differ per partition
                out.append((s.name, tuple(sorted(s.labels.items())), s.value))
    return sorted(out)


def group_of(states: dict[int, PartitionState], cfg: MonitorConfig) -> EngineGroup:
    engines = {}
    for p, st in states.items():
        eng = Engine(cfg.detectors, max_streams=cfg.limits.max_streams)
        eng.load_streams(st.streams, st.latest_frozen)
        engines[p] = eng
    return EngineGroup(cfg.detectors, engines)


def wait_for(cond: Any, timeout: float, what: str, poll: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def order_report(bootstrap: str, names: dict, spans_file: Path) -> str:
    """Where each stream's runs in the runs topic differ from replay's order (diagnostic)."""
    from assaywatch.monitor.offline.load import iter_runs
    from assaywatch.monitor.scaleout.records import decode_record

    ref: dict[StreamKey, list[str]] = {}
    ends: dict[str, int] = {}
    for run in iter_runs([str(spans_file)]):
        ref.setdefault(run.key, []).append(run.run_id)
        ends[run.run_id] = run.end_ns
    got: dict[StreamKey, list[str]] = {}
    for m in sorted(read_topic(bootstrap, names["runs"]), key=lambda m: (m.partition(),
                                                                         m.offset())):
        run = decode_record(m.value())
        if not isinstance(run, Run):  # an evaluation record
            continue
        if run.run_id not in got.setdefault(run.key, []):
            got[run.key].append(run.run_id)
    lines = []
    for key, ids in ref.items():
        mine = got.get(key, [])
        if mine != ids:
            i = next((j for j, (a, b) in enumerate(zip(ids, mine, strict=False)) if a != b),
                     min(len(ids), len(mine)))
            lines.append(f"{key}: replay {len(ids)} runs, topic {len(mine)}; first "
                         f"difference at {i}: replay {ids[i:i + 2]} topic {mine[i:i + 2]} "
                         f"ends {[ends.get(r) for r in mine[i:i + 2]]}")
    return "\n".join(lines) or "same order"


class RunsWatcher:
    """Distinct run ids published to the runs topic so far (a background reader), so a test
    emits a stream's next run only once its previous run is in the topic: the runs of a
    stream then land in the order they ran, the order ``replay`` processes them in."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        import threading

        from confluent_kafka import Consumer, TopicPartition

        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"watch-{time.time_ns()}",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 20})
        parts = self.c.list_topics(topic, timeout=10).topics[topic].partitions
        self.c.assign([TopicPartition(topic, p, 0) for p in parts])
        self.ids: set[bytes] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.c.consume(500, timeout=0.05):
                if m.error() is None:
                    rid = dict(m.headers() or []).get("run_id")
                    if rid:
                        self.ids.add(rid)

    def wait(self, n: int, timeout: float = 30.0) -> None:
        wait_for(lambda: len(self.ids) >= n, timeout, f"{n} runs published", poll=0.02)

    def close(self) -> None:
        self._stop.set()
        self._t.join(5)
        self.c.close()
