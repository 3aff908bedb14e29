"""Evaluations over Kafka, on a real broker: OTLP span records on the spans topic and OTLP
``ExportLogsServiceRequest`` records carrying ``gen_ai.evaluation.result`` events on a logs
topic with the same partition count, both keyed by trace id with one partitioner (as the
Collector's kafka exporter writes them); one assembler and one detector worker in
subprocesses (``assaywatch kafka assemble|detect``).

(a) an evaluation produced after its run closed reaches the detector (an evaluation record);
(b) one produced before its run closed (or before its spans) rides in the run record;
(c) a second copy of an evaluation record is dropped and counted;
(d) kill -9 of the assembler while evaluations wait for their traces loses none of them:
    the logs offset stays below them, and its successor reads them again.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.scaleout import harness as h

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
assembler:
  grace_seconds: 1.5
detectors:
  learn_runs: 40
kafka:
  commit_seconds: 0.5
  checkpoint_seconds: 0.5
"""
SPANS_PARTS = 4
JUDGE = "judge"


class Producer:
    """Spans and logs keyed by trace id hex with one partitioner (Java's murmur2, as the
    Collector's exporter); remembers where each record landed."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.p = KafkaProducer({"bootstrap.servers": bootstrap, "acks": "all",
                                "partitioner": "murmur2_random", "linger.ms": 0})
        self.landed: list[tuple[str, int, int]] = []  # (topic, partition, offset)

    def _send(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        got: list[Any] = []
        self.p.produce(topic, key=key.encode(), value=value,
                       on_delivery=lambda err, msg: got.append((err, msg)))
        self.p.flush(30)
        err, msg = got[0]
        assert err is None, err
        self.landed.append((topic, msg.partition(), msg.offset()))
        return msg.partition(), msg.offset()

    def trace(self, topic: str, spans: list[Any]) -> int:
        """One record holding every span of one trace; returns its partition."""
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        tid = f"{spans[0].context.trace_id:032x}"
        return self._send(topic, tid, encode_spans(spans).SerializeToString())[0]

    def evaluation(self, topic: str, root: Any, score: float) -> tuple[int, int]:
        """A ``gen_ai.evaluation.result`` event judging ``root`` (its trace and span id)."""
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
            ExportLogsServiceRequest,
        )
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        rl.resource.attributes.append(KeyValue(key="service.name",
                                               value=AnyValue(string_value="judge-svc")))
        lr = rl.scope_logs.add().log_records.add()
        lr.event_name = "gen_ai.evaluation.result"
        lr.time_unix_nano = time.time_ns()
        lr.trace_id = root.context.trace_id.to_bytes(16, "big")
        lr.span_id = root.context.span_id.to_bytes(8, "big")
        lr.attributes.extend([
            KeyValue(key="gen_ai.evaluation.name", value=AnyValue(string_value=JUDGE)),
            KeyValue(key="gen_ai.evaluation.score.value", value=AnyValue(double_value=score)),
            # content: must never reach a record
            KeyValue(key="gen_ai.evaluation.explanation",
                     value=AnyValue(string_value="SECRET the answer cited the policy"))])
        tid = f"{root.context.trace_id:032x}"
        return self._send(topic, tid, req.SerializeToString())


def traces_of(agent: str, n: int, seed: int) -> list[list[Any]]:
    """``n`` runs of ``agent`` on the real OTel SDK, one span list per trace (root last)."""
    from tests.e2e.otel_agent import AgentBehaviour, sdk_runs

    by_trace: dict[int, list[Any]] = defaultdict(list)
    for sp in sdk_runs(n, AgentBehaviour(pass_rate=0.9), seed, agent=agent,
                       t0_ns=time.time_ns() - 600_000_000_000):
        by_trace[sp.context.trace_id].append(sp)
    out = list(by_trace.values())
    assert len(out) == n
    return out


def root_of(spans: list[Any]) -> Any:
    return next(s for s in spans if s.parent is None)


def run_id(spans: list[Any]) -> str:
    r = root_of(spans)
    return f"{r.context.trace_id:032x}:{r.context.span_id:016x}"


def sample(w: h.Worker, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in w.scrape().items()
               if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def runs_topic_records(bootstrap: str, topic: str) -> list[Any]:
    return sorted(h.read_topic(bootstrap, topic), key=lambda m: (m.partition(), m.offset()))


def committed(bootstrap: str, group: str, topic: str, parts: list[int]) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in
                c.committed([TopicPartition(topic, p) for p in parts], timeout=10)}
    finally:
        c.close()


def visible(admin: Any, topic: str) -> None:
    """Until the broker's metadata lists the topic just created."""
    h.wait_for(lambda: topic in admin.list_topics(timeout=5).topics, 20, f"topic {topic}",
               poll=0.1)


def test_evaluations_over_kafka(broker: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    bs = broker.bootstrap
    names = h.make_topics(bs, "evals", spans_parts=SPANS_PARTS, runs_parts=6)
    admin = AdminClient({"bootstrap.servers": bs})  # logs: the spans topic's partition count
    visible(admin, names["logs"])
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(CONFIG)
    asm = h.Worker("assemble", bs, names, "asm-0", cfg)
    det = h.Worker("detect", bs, names, "det-0", cfg)
    logs_group = f"{names['runs']}-assemble-logs"
    prod = Producer(bs)
    workers = [asm, det]
    try:
        asm.start()
        det.start()
        h.wait_for(lambda: sample(asm, "assaywatch_kafka_partitions") == SPANS_PARTS
                   and sample(det, "assaywatch_kafka_partitions") == 6, 60, "assignment")

        def runs_at_detector(agent: str) -> float:
            return sample(det, "assaywatch_runs_total", agent=agent)

        def evaluations(agent: str) -> float:
            return sample(det, "assaywatch_evaluations_total", agent=agent, evaluator=JUDGE)

        # (a) late: the runs first, at the detector; then one evaluation each
        late = traces_of("late-agent", 5, seed=1)
        for spans in late:
            prod.trace(names["spans"], spans)
        h.wait_for(lambda: runs_at_detector("late-agent") == 5, 60, "5 late-agent runs")
        assert evaluations("late-agent") == 0
        scores = [0.25, 0.5, 0.75, 1.0, 0.125]
        for spans, score in zip(late, scores, strict=True):
            prod.evaluation(names["logs"], root_of(spans), score)
        h.wait_for(lambda: evaluations("late-agent") == 5, 60, "5 late evaluations")
        assert sample(asm, "assaywatch_kafka_evaluations_published_total") == 5
        # (the engine families are served from a snapshot up to 2 s old)
        h.wait_for(lambda: sample(asm, "assaywatch_evaluation_joins_total", outcome="late")
                   == 5, 10, "the assembler's join counts")
        # the evaluation records: on the runs topic, on their run's partition, no content
        recs = runs_topic_records(bs, names["runs"])
        run_part = {json.loads(m.value())["trace"] + ":" + json.loads(m.value())["root"]:
                    m.partition() for m in recs if "t" not in json.loads(m.value())}
        ev_recs = [m for m in recs if json.loads(m.value()).get("t") == "evaluation"]
        assert sorted(json.loads(m.value())["scores"][JUDGE] for m in ev_recs) == \
            sorted(scores)
        for m in ev_recs:
            assert m.partition() == run_part[json.loads(m.value())["run"]]
            assert b"SECRET" not in m.value()

        # (b) early: evaluations before the run closed (one even before its spans)
        early = traces_of("early-agent", 3, seed=2)
        prod.evaluation(names["logs"], root_of(early[0]), 0.3)  # the judge overtook
        prod.trace(names["spans"], early[0])
        for spans, score in zip(early[1:], (0.6, 0.9), strict=True):
            prod.trace(names["spans"], spans)
            prod.evaluation(names["logs"], root_of(spans), score)  # within the grace
        h.wait_for(lambda: runs_at_detector("early-agent") == 3, 60, "3 early-agent runs")
        h.wait_for(lambda: evaluations("early-agent") == 3, 30, "3 early evaluations")
        recs = runs_topic_records(bs, names["runs"])
        carried = {}
        for m in recs:
            doc = json.loads(m.value())
            if doc.get("agent") == "early-agent":
                assert "t" not in doc, "an early evaluation travels in its run record"
                carried[f"{doc['trace']}:{doc['root']}"] = doc["scores"]
        assert carried == {run_id(s): {JUDGE: v} for s, v in zip(early, (0.3, 0.6, 0.9),
                                                                   strict=True)}
        assert sample(asm, "assaywatch_kafka_evaluations_published_total") == 5

        # (c) a second copy of an evaluation record (an assembler re-publishing it)
        dup = ev_recs[0]
        from confluent_kafka import Producer as KafkaProducer

        p2 = KafkaProducer({"bootstrap.servers": bs})
        p2.produce(names["runs"], key=dup.key(), value=dup.value(), partition=dup.partition())
        p2.flush(30)
        h.wait_for(lambda: sample(det, "assaywatch_spans_dropped_total",
                                  reason="duplicate_evaluation") == 1, 30,
                   "the duplicate evaluation dropped")
        assert evaluations("late-agent") == 5

        # (d) kill -9 while evaluations wait for their traces
        kill = traces_of("kill-agent", 2, seed=3)
        waiting = [prod.evaluation(names["logs"], root_of(s), v)
                   for s, v in zip(kill, (0.2, 0.4), strict=True)]
        received = 5 + 3 + 2
        h.wait_for(lambda: sample(asm, "assaywatch_log_records_received_total",
                                  receiver="kafka", event="gen_ai.evaluation.result")
                   == received, 30, "the waiting evaluations read")
        time.sleep(4 * 0.5)  # several commits since
        first: dict[int, int] = {}
        for p, off in waiting:
            first[p] = min(off, first.get(p, off))
        # the logs group's offset stays at the first waiting evaluation of its partition
        assert committed(bs, logs_group, names["logs"], sorted(first)) == first
        asm.kill()
        asm.start()
        h.wait_for(lambda: sample(asm, "assaywatch_kafka_partitions") == SPANS_PARTS, 60,
                   "the restarted assembler's partitions")
        for spans in kill:
            prod.trace(names["spans"], spans)
        h.wait_for(lambda: runs_at_detector("kill-agent") == 2, 60, "2 kill-agent runs")
        h.wait_for(lambda: evaluations("kill-agent") == 2, 30, "2 evaluations after kill")
        recs = runs_topic_records(bs, names["runs"])
        kill_scores = {f"{d['trace']}:{d['root']}": d.get("scores") for d in
                       (json.loads(m.value()) for m in recs) if d.get("agent") == "kill-agent"}
        assert kill_scores == {run_id(kill[0]): {JUDGE: 0.2}, run_id(kill[1]): {JUDGE: 0.4}}
        # nothing counted twice anywhere
        assert (evaluations("late-agent"), evaluations("early-agent")) == (5, 3)
        codes = {w.instance: w.stop() for w in workers}
        assert codes == {"asm-0": 0, "det-0": 0}, (asm.log()[-3000:], det.log()[-3000:])
    except BaseException:
        for w in workers:
            print(f"--- {w.instance}\n{w.log()[-6000:]}")
            w.kill()
        raise


def test_logs_topic_partitions_must_equal_the_spans_topics(broker: Any, tmp_path: Path
                                                         ) -> None:
    """A logs topic of another partition count is refused: by the worker, and by the CLI at
    start with exit 3 and both counts named."""
    import subprocess
    import sys

    from confluent_kafka.admin import AdminClient, NewTopic

    from assaywatch.monitor.config import MonitorConfig
    from assaywatch.monitor.scaleout.assembler import AssemblerWorker, TopicMismatch
    from assaywatch.monitor.scaleout.settings import KafkaSettings

    names = h.make_topics(broker.bootstrap, "mismatch", spans_parts=4)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.create_topics([NewTopic("mismatch.logs3", 3, 1)],
                                   operation_timeout=20).values():
        fut.result()
    visible(admin, "mismatch.logs3")
    ks = KafkaSettings(bootstrap=broker.bootstrap, spans_topic=names["spans"],
                       runs_topic=names["runs"], logs_topic="mismatch.logs3",
                       assemble_group="mismatch-asm")
    with pytest.raises(TopicMismatch, match=r"mismatch.logs3 has 3 partitions and spans "
                                            r"topic mismatch.spans 4"):
        AssemblerWorker(ks, MonitorConfig()).run()
    res = subprocess.run(
        [sys.executable, "-m", "assaywatch.monitor.commands.cli", "kafka", "assemble",
         "--bootstrap", broker.bootstrap, "--spans-topic", names["spans"],
         "--runs-topic", names["runs"], "--logs-topic", "mismatch.logs3",
         "--metrics", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr[-2000:]
    assert "mismatch.logs3 has 3 partitions and spans topic mismatch.spans 4" in res.stderr
