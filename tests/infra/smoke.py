"""Smoke checks of the real infrastructure: Kafka (1 and 3 nodes) and the Collector -> Kafka.

Run from the repository root, in a venv that has confluent-kafka, opentelemetry-sdk,
opentelemetry-exporter-otlp-proto-grpc and opentelemetry-proto (tests/infra/README.md):

    python -m tests.infra.smoke kafka       # topic, 100 idempotent acks=all writes, a group
    python -m tests.infra.smoke failover    # 3 nodes, RF 3, min ISR 2, kill -9 the leader
    python -m tests.infra.smoke collector   # OTLP spans -> Collector -> Kafka -> decoded
    python -m tests.infra.smoke all

It prints one line per check and a closing ``N passed, N failed`` line; exit code 0 when all
passed. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.infra.kafka import KafkaCluster, kafka_broker, kafka_cluster
from tests.infra.otelcol import PIPELINES, otel_collector

SPANS_TOPIC = "assaywatch.spans"


def _log(msg: str) -> None:
    print(msg, flush=True)


def _create_topic(bootstrap: str, name: str, partitions: int, rf: int,
                  config: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=rf, config=config or {})],
                                  operation_timeout=30, request_timeout=30)
    futures[name].result(timeout=60)


def _produce(bootstrap: str, topic: str, values: list[bytes], timeout: float = 60.0,
             extra: dict[str, Any] | None = None) -> tuple[int, list[str]]:
    """Idempotent producer, acks=all; returns (delivered, errors)."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "acks": "all", "linger.ms": 5,
                            "message.timeout.ms": int(timeout * 1000)}
    conf.update(extra or {})
    producer = Producer(conf)
    delivered: list[int] = []
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivered.append(1)
        else:
            errors.append(str(err))

    for i, value in enumerate(values):
        producer.produce(topic, key=str(i).encode(), value=value, on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(timeout + 10)
    if remaining:
        errors.append(f"{remaining} messages still in the queue")
    return len(delivered), errors


def _consume(bootstrap: str, topic: str, group: str, want: int,
             timeout: float = 60.0) -> list[Any]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    consumer.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                _log(f"  consumer: {msg.error()}")
                continue
            got.append(msg)
    finally:
        consumer.close()
    return got


def check_single() -> None:
    t0 = time.monotonic()
    with kafka_broker() as kafka:
        _log(f"  broker {kafka.bootstrap} ready in {time.monotonic() - t0:.1f}s")
        _create_topic(kafka.bootstrap, "smoke", partitions=3, rf=1)
        values = [f"message-{i}".encode() for i in range(100)]
        t1 = time.monotonic()
        delivered, errors = _produce(kafka.bootstrap, "smoke", values)
        assert delivered == 100 and not errors, (delivered, errors[:5])
        _log(f"  produced 100 (idempotent, acks=all) in {time.monotonic() - t1:.2f}s")
        t1 = time.monotonic()
        got = _consume(kafka.bootstrap, "smoke", "smoke-group", 100)
        assert sorted(m.value() for m in got) == sorted(values), len(got)
        _log(f"  consumed 100 with group smoke-group in {time.monotonic() - t1:.2f}s "
             f"from partitions {sorted({m.partition() for m in got})}")


def _leader(cluster: KafkaCluster, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    live = ",".join(n.address for n in cluster.nodes if n.alive)
    md = AdminClient({"bootstrap.servers": live}).list_topics(topic, timeout=20)
    return int(md.topics[topic].partitions[partition].leader)


def _isr(cluster: KafkaCluster, topic: str) -> dict[int, list[int]]:
    from confluent_kafka.admin import AdminClient

    live = ",".join(n.address for n in cluster.nodes if n.alive)
    md = AdminClient({"bootstrap.servers": live}).list_topics(topic, timeout=20)
    return {p: sorted(int(r) for r in m.isrs) for p, m in md.topics[topic].partitions.items()}


def check_failover() -> None:
    t0 = time.monotonic()
    with kafka_cluster(3) as kafka:
        _log(f"  3 nodes {kafka.bootstrap} ready in {time.monotonic() - t0:.1f}s")
        _create_topic(kafka.bootstrap, "failover", partitions=3, rf=3,
                      config={"min.insync.replicas": "2"})
        first = [f"before-{i}".encode() for i in range(100)]
        delivered, errors = _produce(kafka.bootstrap, "failover", first)
        assert delivered == 100 and not errors, (delivered, errors[:5])
        _log(f"  produced 100 with acks=all; ISR {_isr(kafka, 'failover')}")
        victim = _leader(kafka, "failover", 0)
        t1 = time.monotonic()
        kafka.kill(victim)  # SIGKILL
        _log(f"  kill -9 node {victim} (leader of partition 0, a controller voter)")
        second = [f"after-{i}".encode() for i in range(100)]
        delivered, errors = _produce(kafka.bootstrap, "failover", second)
        assert delivered == 100 and not errors, (delivered, errors[:5])
        _log(f"  produced 100 more with acks=all, min.insync.replicas=2, 2 of 3 nodes alive, "
             f"{time.monotonic() - t1:.1f}s after the kill; new leader of partition 0: "
             f"{_leader(kafka, 'failover', 0)}; ISR {_isr(kafka, 'failover')}")
        live = ",".join(n.address for n in kafka.nodes if n.alive)
        got = _consume(live, "failover", "failover-group", 200)
        assert sorted(m.value() for m in got) == sorted(first + second), len(got)
        _log("  consumed all 200 with a consumer group from the surviving nodes")
        t1 = time.monotonic()
        kafka.restart(victim)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                len(r) < 3 for r in _isr(kafka, "failover").values()):
            time.sleep(0.5)
        _log(f"  restarted node {victim}: ready and back in every ISR in "
             f"{time.monotonic() - t1:.1f}s; ISR {_isr(kafka, 'failover')}")


def check_collector() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    config = PIPELINES / "kafka-pipeline.yaml"
    t0 = time.monotonic()
    with kafka_broker() as kafka:
        _create_topic(kafka.bootstrap, SPANS_TOPIC, partitions=3, rf=1)
        t1 = time.monotonic()
        with otel_collector(config, env={"ASSAYWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap}) as col:
            _log(f"  broker ready in {t1 - t0:.1f}s; Collector healthy in "
                 f"{time.monotonic() - t1:.1f}s (OTLP gRPC {col.grpc_endpoint})")
            provider = TracerProvider(resource=Resource.create({"service.name": "smoke-agent"}))
            provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"http://{col.grpc_endpoint}", insecure=True)))
            tracer = provider.get_tracer("assaywatch.smoke")
            sent: dict[str, int] = {}
            for _run in range(5):
                with tracer.start_as_current_span("invoke_agent smoke") as root:
                    root.set_attribute("gen_ai.operation.name", "invoke_agent")
                    for step in range(3):
                        with tracer.start_as_current_span(f"execute_tool step{step}"):
                            pass
                    sent[format(root.get_span_context().trace_id, "032x")] = 4
            assert provider.force_flush(30_000)
            provider.shutdown()
            _log(f"  sent {sum(sent.values())} spans in {len(sent)} traces over OTLP gRPC")
            t2 = time.monotonic()
            msgs = _consume(kafka.bootstrap, SPANS_TOPIC, "smoke-spans", len(sent), timeout=60)
            spans: dict[str, int] = {}
            partitions: dict[str, set[int]] = {}
            keys_match = True
            for msg in msgs:
                req = ExportTraceServiceRequest()
                req.ParseFromString(msg.value())
                ids = set()
                for rs in req.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}
                    assert service.get("service.name") == "smoke-agent", service
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            tid = span.trace_id.hex()
                            ids.add(tid)
                            spans[tid] = spans.get(tid, 0) + 1
                            partitions.setdefault(tid, set()).add(msg.partition())
                key = msg.key() or b""
                keys_match &= len(ids) == 1 and key in {bytes.fromhex(next(iter(ids))),
                                                        next(iter(ids)).encode()}
            _log(f"  consumed {len(msgs)} records from {SPANS_TOPIC} in "
                 f"{time.monotonic() - t2:.2f}s, decoded as ExportTraceServiceRequest: "
                 f"{sum(spans.values())} spans; record key = trace id: {keys_match}; "
                 f"partitions per trace: {sorted(len(p) for p in partitions.values())}")
            if msgs:
                _log(f"  first record: key={msgs[0].key()!r} ({len(msgs[0].key() or b'')} "
                     f"bytes), partition {msgs[0].partition()}, {len(msgs[0].value())} bytes")
            assert spans == sent, (spans, sent)
            assert keys_match
            assert all(len(p) == 1 for p in partitions.values())


CHECKS: dict[str, Callable[[], None]] = {
    "kafka": check_single, "failover": check_failover, "collector": check_collector}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.smoke")
    parser.add_argument("checks", nargs="+", choices=[*CHECKS, "all"])
    args = parser.parse_args(argv)
    names = list(CHECKS) if "all" in args.checks else args.checks
    passed = failed = 0
    for name in names:
        _log(f"{name}:")
        t0 = time.monotonic()
        try:
            CHECKS[name]()
        except Exception as exc:  # report and go on with the next check
            failed += 1
            _log(f"FAILED {name} after {time.monotonic() - t0:.1f}s: {exc!r}")
        else:
            passed += 1
            _log(f"ok {name} ({time.monotonic() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
