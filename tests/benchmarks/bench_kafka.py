"""The Kafka scale-out: throughput of each stage with 1, 2 (assemblers) and 1, 2, 3 (detector
workers) processes, on a real Kafka 4.4 broker (tests/infra/kafka.py), and consumer lag.

Input: ``RUNS`` runs of ``STREAMS`` streams from the simulated agent on the real OTel SDK
(tests/e2e/otel_agent.py: an ``invoke_agent`` root, 1-3 tools, ~6 spans a run), encoded as the
Collector's kafka exporter writes them (``TracesData`` protobuf, one record per trace, key =
the trace id) and loaded into a 12-partition spans topic before the clock starts.

Stage 1: ``assaywatch kafka assemble`` processes read the whole topic and publish run
records; the rate is measured from the first run record to the last (the group join and
the Python start-up are not in it). Stage 2: ``assaywatch kafka detect`` processes (fresh
group and state topic each time) read the 12-partition runs topic stage 1 wrote; measured
from the first processed run to the last, with the group's lag (high watermark minus
committed offsets, i.e. the last checkpoint) sampled every 0.25 s. Every process is a
separate Python; on a machine with fewer cores than processes they share cores, which the
table's core count shows.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

RUNS = 20_000
STREAMS = 100
PARTITIONS = 12
CONFIG = """
assembler:
  grace_seconds: 0.2
detectors:
  learn_runs: 40
  hotelling_window: 50
  hotelling_every: 25
kafka:
  checkpoint_seconds: 1.0
  commit_seconds: 1.0
"""


def make_records() -> tuple[list[tuple[bytes, bytes]], int]:
    """(trace id key, TracesData bytes) per trace, and the number of spans."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.e2e.otel_agent import AgentBehaviour, emit_run

    provider = TracerProvider(resource=Resource.create({"service.name": "bench-svc"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    rng = np.random.default_rng(7)
    good = AgentBehaviour()
    for i in range(RUNS):
        emit_run(tracer, rng, f"agent-{i % STREAMS}", "1.0", "refund", good, time.time_ns())
    by_trace = defaultdict(list)
    for span in memory.get_finished_spans():
        by_trace[span.context.trace_id].append(span)
    records = [(f"{tid:032x}".encode(), encode_spans(spans).SerializeToString())
               for tid, spans in by_trace.items()]
    return records, sum(len(s) for s in by_trace.values())


def topic_total(consumer: object, topic: str) -> int:
    from confluent_kafka import TopicPartition

    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]  # type: ignore[attr-defined]
               for p in range(PARTITIONS))


class GroupLag:
    """Lag of a consumer group: high watermarks minus committed offsets (a checkpoint's)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self.topic = topic

    def __call__(self) -> int:
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        lag = 0
        for tp in self.c.committed(tps, timeout=5):
            hi = self.c.get_watermark_offsets(TopicPartition(self.topic, tp.partition),
                                              timeout=5)[1]
            lag += hi - max(tp.offset, 0)
        return lag

    def close(self) -> None:
        self.c.close()


def start_all(workers: list, total_parts: int) -> None:
    """Start the processes in parallel and wait until every partition is assigned and every
    process has some (the input is loaded only then: no rebalance inside the timing)."""
    import concurrent.futures as cf

    from tests.scaleout import harness as h

    with cf.ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda w: w.start(), workers))

    def stable() -> bool:
        n = [h.metric_sum([w], "assaywatch_kafka_partitions") for w in workers]
        return sum(n) == total_parts and all(n)

    h.wait_for(stable, 120, "a stable assignment")


def measure(count: object, total: int, lag: object = None) -> tuple[float, int, int]:
    """Seconds from the first output to ``total``, outputs counted in that time, max lag."""
    first = None
    max_lag = 0
    deadline = time.monotonic() + 300
    while True:
        n = count()  # type: ignore[operator]
        now = time.monotonic()
        if n and first is None:
            first = (now, n)
        if first is not None and lag is not None:
            max_lag = max(max_lag, lag())  # type: ignore[operator]
        if n >= total:
            break
        assert now < deadline, f"{n} of {total} after 300 s"
        time.sleep(0.1)
    assert first is not None
    return max(now - first[0], 1e-3), total - first[1], max_lag


def main() -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.infra.kafka import kafka_broker
    from tests.scaleout import harness as h

    t0 = time.perf_counter()
    records, n_spans = make_records()
    print(f"input: {RUNS} runs, {n_spans} spans, {len(records)} span records, "
          f"{STREAMS} streams; made in {time.perf_counter() - t0:.1f} s")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as d, kafka_broker() as kafka:
        tmp = Path(d)
        cfg = tmp / "bench.yaml"
        cfg.write_text(CONFIG)
        bs = kafka.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        topics = [NewTopic(f"bench.{t}{k}", PARTITIONS, 1)
                  for t in ("spans", "runs") for k in (1, 2)]
        topics += [NewTopic(f"bench.in{k}", PARTITIONS, 1) for k in (1, 2, 3)]
        for f in admin.create_topics(topics, operation_timeout=20).values():
            f.result()
        prod = Producer({"bootstrap.servers": bs, "linger.ms": 20, "acks": "all",
                         "compression.type": "zstd"})

        def load(topic: str, items: list[tuple[bytes, bytes]]) -> None:
            for key, value in items:
                prod.produce(topic, value, key)
                prod.poll(0)
            prod.flush(60)

        probe = Consumer({"bootstrap.servers": bs, "group.id": "bench-probe"})
        rows = []
        for k in (1, 2):
            names = {"spans": f"bench.spans{k}", "runs": f"bench.runs{k}",
                     "logs": f"bench.logs{k}"}  # no evaluations: created empty
            workers = [h.Worker("assemble", bs, names, f"bench-asm{k}-{i}", cfg)
                       for i in range(k)]
            start_all(workers, PARTITIONS)
            load(names["spans"], records)
            secs, done, _ = measure(lambda n=names: topic_total(probe, n["runs"]), RUNS)
            for w in workers:
                w.stop()
            rows.append(("assemblers", k, done * n_spans / RUNS / secs, done / secs, "-"))
        # stage 2's input: stage 1's run records, in their partitions' order
        run_records = [(m.key(), m.value()) for m in sorted(
            h.read_topic(bs, "bench.runs1"), key=lambda m: (m.partition(), m.offset()))]
        assert len(run_records) == RUNS
        for k in (1, 2, 3):
            names = {"runs": f"bench.in{k}", "state": f"bench.state{k}",
                     "alarms": f"bench.alarms{k}"}
            group = f"bench-det-{k}"
            workers = [h.Worker("detect", bs, names, f"bench-det{k}-{i}", cfg, group=group)
                       for i in range(k)]
            start_all(workers, PARTITIONS)
            load(names["runs"], run_records)
            lag = GroupLag(bs, group, names["runs"])
            secs, done, max_lag = measure(
                lambda w=workers: h.metric_sum(w, "assaywatch_runs_total"), RUNS, lag)
            time.sleep(1.5)  # one more checkpoint interval: the committed offsets catch up
            end_lag = lag()
            lag.close()
            for w in workers:
                w.stop()
            rows.append(("detector workers", k, done * n_spans / RUNS / secs, done / secs,
                         f"max {max_lag}, after {end_lag}"))
        probe.close()
    print(f"\nKafka 4.4 (1 broker, loopback), {PARTITIONS} partitions per topic, "
          f"{cores} cores for everything")
    print(f"{'stage':18s} {'processes':>9s} {'spans/s':>10s} {'runs/s':>9s}  consumer lag (runs)")
    for stage, k, sps, rps, lag in rows:
        print(f"{stage:18s} {k:9d} {sps:10,.0f} {rps:9,.0f}  {lag}")
