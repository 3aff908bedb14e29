"""Rebalance logic of the detector workers, fast, on librdkafka's mock cluster (in-process,
no broker): a second worker joins mid-stream (cooperative revoke: checkpoint, restore, seek),
then the first leaves; re-published runs are dropped; the final checkpoints equal a single
engine over the same runs, with and without Kafka transactions. The real broker and real
kill -9 are in test_kafka_kills.py."""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.scaleout.clients import RDKAFKA_LOGGER
from assaywatch.monitor.scaleout.detector import DetectorWorker
from assaywatch.monitor.scaleout.records import chain_step, encode_run, partition_key
from assaywatch.monitor.scaleout.settings import KafkaSettings
from tests.scaleout import harness as h
from tests.scaleout.runs_fixture import CONFIG, recorded_runs

ck = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.slow  # two group rebalances on the mock take ~20 s


def mock_cluster() -> tuple[str, Any]:
    """A librdkafka mock cluster kept alive by the returned producer; its bootstrap."""
    buf = io.StringIO()
    log = logging.getLogger(f"mock-{time.time_ns()}")
    log.addHandler(logging.StreamHandler(buf))
    log.setLevel(logging.DEBUG)
    log.propagate = False
    owner = ck.Producer({"bootstrap.servers": "unused:1", "test.mock.num.brokers": 1,
                         "logger": log})
    deadline = time.monotonic() + 10
    while not (m := re.search(r"replaced with (\S+)", buf.getvalue())):
        assert time.monotonic() < deadline, buf.getvalue()
        owner.poll(0.1)
    return m.group(1), owner


def start(worker: DetectorWorker) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


@contextlib.contextmanager
def group_log(lines: int = 400) -> Iterator[collections.deque[str]]:
    """The last ``lines`` of librdkafka's consumer-group log of the workers (debug
    ``cgrp``), printed when the test fails: a stalled rebalance shows there."""
    tail: collections.deque[str] = collections.deque(maxlen=lines)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            tail.append(f"{record.created:.3f} {record.getMessage()}")

    handler = Keep(logging.DEBUG)
    RDKAFKA_LOGGER.addHandler(handler)
    level, propagate = RDKAFKA_LOGGER.level, RDKAFKA_LOGGER.propagate
    RDKAFKA_LOGGER.setLevel(logging.DEBUG)
    RDKAFKA_LOGGER.propagate = False  # the debug lines stay in the tail
    try:
        yield tail
    finally:
        RDKAFKA_LOGGER.removeHandler(handler)
        RDKAFKA_LOGGER.setLevel(level)
        RDKAFKA_LOGGER.propagate = propagate


def caught_up(workers: list[DetectorWorker], bootstrap: str, topic: str) -> bool:
    his = {}
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    for p in range(4):
        his[p] = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=5)[1]
    c.close()
    have = {p: st.next_offset for w in workers for p, st in list(w.parts.items())}
    return all(have.get(p, -1) >= hi for p, hi in his.items())


@pytest.mark.parametrize("transactions", ["on", "off"])
def test_join_and_leave_mid_stream_equal_one_engine(transactions: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    prepared: list[int] = []  # runs handed to Engine.prepare at once
    real_prepare = Engine.prepare

    def spy(self: Engine, runs: Any) -> None:
        prepared.append(len(runs))
        real_prepare(self, runs)

    monkeypatch.setattr(Engine, "prepare", spy)
    bootstrap, _owner = mock_cluster()
    s = KafkaSettings(bootstrap=bootstrap, runs_topic="runs", state_topic="state",
                      alarms_topic="alarms", detect_group=f"g-{transactions}",
                      transactions=transactions, checkpoint_seconds=0.2,
                      session_timeout_ms=6000, transaction_timeout_ms=10000,
                      client={"heartbeat.interval.ms": "300", "debug": "cgrp"})
    prod = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    prod.produce("state", b"", b"init")  # the mock creates topics with 4 partitions
    prod.produce("alarms", b"", b"init")
    runs = recorded_runs()
    cut1, cut2 = len(runs) // 3, 2 * len(runs) // 3

    def publish(batch: Any, dup_every: int = 0) -> None:
        for i, run in enumerate(batch):
            prod.produce("runs", encode_run(run), partition_key(run.key))
            if dup_every and i % dup_every == 3:  # an assembler re-publishing a run
                prod.produce("runs", encode_run(batch[i - 2]), partition_key(batch[i - 2].key))
        prod.flush(10)

    t0 = time.monotonic()
    workers: list[tuple[DetectorWorker, threading.Thread]] = []
    with group_log() as tail:
        try:
            publish(runs[:cut1], dup_every=25)
            a = DetectorWorker(s, CONFIG)
            ta = start(a)
            workers.append((a, ta))
            h.wait_for(lambda: caught_up([a], bootstrap, "runs"), 60, "a caught up")
            print(f"a caught up {time.monotonic() - t0:.1f} s")
            b = DetectorWorker(s, CONFIG)
            tb = start(b)  # joins: a revokes some partitions (checkpoint), b restores them
            workers.append((b, tb))
            # ~10 s here (two rebalances of the mock's group); the waits are only bounds
            h.wait_for(lambda: len(b.parts) > 0 and len(a.parts) > 0, 90,
                       "a shared assignment")
            publish(runs[cut1:cut2], dup_every=25)
            h.wait_for(lambda: caught_up([a, b], bootstrap, "runs"), 90, "both caught up")
            print(f"shared and caught up {time.monotonic() - t0:.1f} s")
            a.stop_event.set()  # leaves: b restores a's partitions from their checkpoints
            ta.join(30)
            h.wait_for(lambda: len(b.parts) == 4, 90, "b owning every partition")
            publish(runs[cut2:], dup_every=25)
            h.wait_for(lambda: caught_up([b], bootstrap, "runs"), 60, "b caught up")
            print(f"b alone and caught up {time.monotonic() - t0:.1f} s")
        except BaseException:
            print(f"at {time.monotonic() - t0:.1f} s; the workers' group log, last lines:")
            print("\n".join(tail))
            raise
        finally:  # a failed wait must not leave the workers polling a closed cluster
            for w, _ in workers:
                w.stop_event.set()
            for _, t in workers:
                t.join(30)
    assert not ta.errors and not tb.errors, (ta.errors, tb.errors)  # type: ignore[attr-defined]

    states = h.final_states(bootstrap, {"runs": "runs", "state": "state"})
    ref = Engine(CONFIG.detectors)
    chains: dict[StreamKey, Any] = {}
    for run in runs:
        ref.process(run)
        chains[run.key] = chain_step(chains.get(run.key), run.run_id)
    got = {k: c for st in states.values() for k, c in st.chains.items()}
    assert got == chains
    assert h.stream_samples(h.group_of(states, CONFIG)) == h.stream_samples(ref)
    republished = sum(len(range(3, n, 25)) for n in (cut1, cut2 - cut1, len(runs) - cut2))
    assert sum(st.duplicates for st in states.values()) == republished
    assert a.checkpoints and b.checkpoints
    # a consumed batch's runs of a partition are prepared together (the backlog: batches
    # of up to 100 records over 4 partitions); each run once, a re-published copy never
    assert max(prepared) > 1 and sum(prepared) == len(runs), prepared
