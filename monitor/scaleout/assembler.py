"""Stage 1: spans topic -> run records (``assaywatch kafka assemble``).

One consumer group reads the spans topic the Collector's kafka exporter writes
(``encoding: otlp_proto``, ``partition_traces_by_id: true``: every span of a trace on one
partition). Each assigned partition gets its own :class:`Assembler` (the monitor's own
pipeline stage 2, unchanged), with the monitor's clock: wall time, ``time.monotonic``. Closed
runs are published to the runs topic, key = agent and scenario, value = the run record,
through an idempotent producer with ``acks=all``.

**At least once.** Offsets are committed every ``commit_seconds`` and only after every run
published so far is acknowledged; the offset committed for a partition is the smallest of
the next offset to read and the first record of every trace still open on it, so after a
crash (or a revoke) the next owner reads every span of every unfinished trace again. A run
the dead assembler had already published is then published twice: same run id, and the
detectors drop the second copy. On revoke the partition's open traces are dropped (their
new owner assembles them from the committed offset); a graceful stop commits and leaves.

**Ordering.** Runs are published in the order their traces close, per partition sorted by
(end time, run id) within a poll as the single monitor does. Runs of one stream come from
different assemblers (traces are spread by trace id), so the runs topic holds them in the
order they were *published*; two runs of one stream ending further apart than the closing
delay (``assembler.grace_seconds`` + a poll + produce latency, well under a second with the
defaults of the tests) land in their end order, closer ones in either order. After an
assembler crash the runs of its open traces are published after the takeover (the session
timeout later), so they can land after later runs of the same stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.scaleout.clients import base_config, require_kafka
from assaywatch.monitor.scaleout.records import encode_run, partition_key
from assaywatch.monitor.scaleout.settings import KafkaSettings

logger = logging.getLogger(__name__)

RECEIVER = "kafka"


class DeliveryFailed(RuntimeError):
    """A run record was not acknowledged: the assembler stops without committing, and its
    successor re-reads the spans (at least once)."""


class AssemblerCollector(Collector):
    """``assaywatch_kafka_*`` of an assembler: its partitions and the runs it published."""

    def __init__(self, worker: AssemblerWorker) -> None:
        self.worker = worker

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("assaywatch_kafka_partitions", "Spans-topic partitions "
                              "assigned to this assembler.")
        g.add_metric([], len(self.worker._asm))
        yield g
        c = CounterMetricFamily("assaywatch_kafka_runs_published", "Run records published "
                                "by this assembler (re-publications included).")
        c.add_metric([], self.worker.runs_published)
        yield c


class AssemblerWorker:
    """Consume spans, assemble runs, publish run records. :meth:`run` until ``stop``."""

    def __init__(self, settings: KafkaSettings, config: MonitorConfig,
                 clock: Any = time.monotonic) -> None:
        self.settings = settings
        self.config = config
        self.clock = clock
        self.counters = IngestCounters()
        self.lock = threading.RLock()
        self.ready = threading.Event()
        self.stop_event = threading.Event()
        self.addresses: dict[str, str] = {}
        self.runs_published = 0
        self.records_consumed = 0
        self._rules = ContractRules.from_dict(config.contracts) if config.contracts else None
        self._asm: dict[int, Assembler] = {}
        #: partition -> trace id -> offset of the first record holding a span of it
        self._first: dict[int, dict[str, int]] = {}
        #: partition -> next offset to read
        self._next: dict[int, int] = {}
        self._delivery_error: str | None = None
        self._consumer: Any = None
        self._producer: Any = None
        from assaywatch.monitor.pipeline.dialects import READ_KEYS, READ_PREFIXES
        from assaywatch.monitor.receivers.otlp.decode import DecodeLimits

        self._limits = DecodeLimits(keep_keys=READ_KEYS, keep_prefixes=READ_PREFIXES)

    # -- what the metrics port reads --------------------------------------------------
    def pending_traces(self) -> int:
        return sum(a.pending_traces for a in self._asm.values())

    # -- clients -----------------------------------------------------------------------
    def _clients(self) -> None:
        ck = require_kafka()
        s = self.settings
        cc = {**base_config(s), "group.id": s.assemble_group,
              "enable.auto.commit": False, "auto.offset.reset": "earliest",
              "partition.assignment.strategy": "cooperative-sticky",
              "session.timeout.ms": s.session_timeout_ms, "fetch.wait.max.ms": 50,
              "client.id": f"assaywatch-assembler-{s.instance_id or 'dynamic'}"}
        if s.instance_id:
            cc["group.instance.id"] = f"assembler-{s.instance_id}"
        self._consumer = ck.Consumer(cc)
        self._producer = ck.Producer({
            **base_config(s), "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "compression.type": "lz4",
            "client.id": f"assaywatch-assembler-{s.instance_id or 'dynamic'}"})

    def _new_assembler(self) -> Assembler:
        a = self.config.assembler
        return Assembler(clock=self.clock, grace_s=a.grace_seconds,
                         max_age_s=a.max_age_seconds,
                         max_pending_traces=a.max_pending_traces,
                         max_spans_per_trace=a.max_spans_per_trace,
                         max_pending_bytes=a.max_pending_bytes, counters=self.counters,
                         rules=self._rules, score_threshold=self.config.evaluation_threshold)

    # -- rebalance callbacks (run inside poll, on this thread) ---------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        with self.lock:
            for tp in partitions:
                self._asm[tp.partition] = self._new_assembler()
                self._first[tp.partition] = {}
        logger.info("assembler: assigned %s", sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        parts = [tp.partition for tp in partitions]
        try:
            self._commit(parts)
        except Exception:
            logger.exception("assembler: commit on revoke failed (the next owner re-reads)")
        self._drop(parts)
        logger.info("assembler: revoked %s", sorted(parts))

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._drop([tp.partition for tp in partitions])
        logger.warning("assembler: lost %s", sorted(tp.partition for tp in partitions))

    def _drop(self, parts: list[int]) -> None:
        with self.lock:
            for p in parts:
                self._asm.pop(p, None)
                self._first.pop(p, None)
                self._next.pop(p, None)

    # -- delivery and commits ----------------------------------------------------------
    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = str(err)

    def _publish(self, runs: list[Run]) -> None:
        topic = self.settings.runs_topic
        for run in runs:
            value = encode_run(run)
            while True:
                try:
                    self._producer.produce(topic, value=value, key=partition_key(run.key),
                                           headers=[("run_id", run.run_id.encode())],
                                           on_delivery=self._delivered)
                    break
                except BufferError:  # local queue full: serve deliveries, then retry
                    self._producer.poll(0.1)
            self.runs_published += 1
        self._producer.poll(0)

    def _commit(self, parts: list[int] | None = None) -> None:
        """Commit, for ``parts`` (default all), the offsets below which no open trace and
        no unacknowledged run remains."""
        ck = require_kafka()
        left = self._producer.flush(30)
        if left or self._delivery_error:
            raise DeliveryFailed(f"{left} run record(s) unacknowledged, delivery error: "
                                 f"{self._delivery_error}")
        offsets = []
        with self.lock:
            for p in parts if parts is not None else list(self._asm):
                nxt = self._next.get(p)
                asm = self._asm.get(p)
                if nxt is None or asm is None:
                    continue
                first = self._first.get(p, {})
                pending = asm._pending  # read-only: which traces are still open
                for tid in [t for t in first if t not in pending]:
                    del first[tid]
                off = min(first.values(), default=nxt)
                offsets.append(ck.TopicPartition(self.settings.spans_topic, p, min(off, nxt)))
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:
            # a rebalance under way: the partitions' next owner starts from the previous
            # commit and re-publishes (at least once); a later commit catches up
            logger.warning("assembler: offset commit skipped: %s", exc)

    # -- the loop ------------------------------------------------------------------------
    def _take(self, msgs: list[Any]) -> None:
        from assaywatch.monitor.receivers.otlp.decode import DecodeError, decode_proto_request

        ck = require_kafka()
        with self.lock:
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != ck.KafkaError._PARTITION_EOF:
                        logger.warning("assembler: consume error %s", err)
                    continue
                p, off = m.partition(), m.offset()
                asm = self._asm.get(p)
                if asm is None:
                    continue
                self._next[p] = off + 1
                self.records_consumed += 1
                try:
                    res = decode_proto_request(m.value() or b"", self._limits)
                except DecodeError as exc:
                    self.counters.add_rejected(RECEIVER, exc.reason)
                    continue
                for reason, n in res.rejected.items():
                    self.counters.add_rejected(RECEIVER, reason, n)
                if not res.spans:
                    continue
                self.counters.add_received(RECEIVER, len(res.spans))
                first = self._first[p]
                for sp in res.spans:
                    if sp.trace_id not in first:
                        first[sp.trace_id] = off
                asm.add(res.spans)

    def _close(self) -> list[Run]:
        with self.lock:
            runs: list[Run] = []
            for asm in self._asm.values():
                runs.extend(asm.poll())
        runs.sort(key=close_order)
        return runs

    def run(self) -> None:
        """Consume until :attr:`stop_event` is set; raises :class:`DeliveryFailed`."""
        self._clients()
        s = self.settings
        self._consumer.subscribe([s.spans_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        self.ready.set()
        last_commit = time.monotonic()
        try:
            while not self.stop_event.is_set():
                msgs = self._consumer.consume(num_messages=500, timeout=s.poll_seconds)
                if msgs:
                    self._take(msgs)
                runs = self._close()
                if runs:
                    self._publish(runs)
                else:
                    self._producer.poll(0)
                if self._delivery_error:
                    raise DeliveryFailed(f"run record delivery failed: {self._delivery_error}")
                if time.monotonic() - last_commit >= s.commit_seconds:
                    self._commit()
                    last_commit = time.monotonic()
            self._commit()
        finally:
            self.ready.clear()
            try:
                self._consumer.close()
            except Exception:
                logger.exception("assembler: closing the consumer failed")
            self._producer.flush(10)
