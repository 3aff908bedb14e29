"""Stage 1: spans and logs topics -> run and evaluation records (``assaywatch kafka assemble``).

One consumer group reads the spans topic the Collector's kafka exporter writes
(``encoding: otlp_proto``, ``partition_traces_by_id: true``: every span of a trace on one
partition). Each assigned partition gets its own :class:`Assembler` (the monitor's own
pipeline stage 2, unchanged), with the monitor's clock: wall time, ``time.monotonic``. Closed
runs are published to the runs topic, key = agent and scenario, value = the run record,
through an idempotent producer with ``acks=all``.

**Evaluations.** The Collector writes OTLP logs to the logs topic (``logs_topic``,
``partition_logs_by_trace_id: true``): the key is the trace id, as for spans, so with the
spans topic's partition count a trace's ``gen_ai.evaluation.result`` events land on the
partition *number* of its spans. While the assembler owns spans partition p it reads logs
partition p too, with a second consumer assigned by hand (group ``<assemble_group>-logs``,
from that group's committed offset), and hands the evaluations to the same
:class:`Assembler`: one that arrives while its trace is open joins the run (its record's
scores and labels), a later one comes out of ``take_evaluations`` and is published as an
evaluation record (``records.encode_evaluation``) with its stream's key, after the runs of
the same poll. A logs topic that is missing or configured as '' leaves the assembler reading
spans only (checked at start and every :data:`LOGS_RECHECK_SECONDS` while missing); one whose
partition count differs from the spans topic's is refused (:class:`TopicMismatch`): its
partitions would not line up with the traces'.

**At least once.** Offsets are committed every ``commit_seconds`` and only after every run
published so far is acknowledged; the offset committed for a partition is the smallest of
the next offset to read and the first record of every trace still open on it, so after a
crash (or a revoke) the next owner reads every span of every unfinished trace again. A run
the dead assembler had already published is then published twice: same run id, and the
detectors drop the second copy. On revoke the partition's open traces are dropped (their
new owner assembles them from the committed offset); a graceful stop commits and leaves.
The logs offset of partition p, committed at the same moments, is the smallest of the next
logs offset to read and the first record of an evaluation whose trace is still open or that
still waits for its trace (``EvaluationJoin.waits_for``): those are read again too, joined
and published ones are not. An evaluation read again for a run already published reaches
the detectors as a second copy (an evaluation record, or a score its run record carried),
which they drop.

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
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import EVALUATION_EVENT, IngestCounters
from assaywatch.monitor.scaleout.clients import base_config, require_kafka, usable
from assaywatch.monitor.scaleout.records import encode_evaluation, encode_run, partition_key
from assaywatch.monitor.scaleout.settings import KafkaSettings

logger = logging.getLogger(__name__)

RECEIVER = "kafka"
#: Seconds between checks for a logs topic that did not exist yet.
LOGS_RECHECK_SECONDS = 30.0


class DeliveryFailed(RuntimeError):
    """A run record was not acknowledged: the assembler stops without committing, and its
    successor re-reads the spans (at least once)."""


class TopicMismatch(RuntimeError):
    """The logs topic's partitions do not line up with the spans topic's."""


def logs_mismatch(s: KafkaSettings, logs: int, spans: int) -> str:
    """What is wrong when the logs topic has ``logs`` partitions and the spans topic
    ``spans`` (the worker raises it, ``kafka assemble`` exits 3 with it)."""
    return (f"logs topic {s.logs_topic} has {logs} partitions and spans topic "
            f"{s.spans_topic} {spans}: they must be equal (a trace's evaluations are read "
            f"from the logs partition of its spans' number); recreate the logs topic with "
            f"{spans} partitions, or set kafka.logs_topic to '' to read spans only")


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
        c = CounterMetricFamily("assaywatch_kafka_evaluations_published", "Evaluation "
                                "records (evaluations of runs published before) published "
                                "by this assembler.")
        c.add_metric([], self.worker.evaluations_published)
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
        self.evaluations_published = 0
        self.records_consumed = 0
        self.log_records_consumed = 0
        self._rules = ContractRules.from_dict(config.contracts) if config.contracts else None
        self._asm: dict[int, Assembler] = {}
        #: partition -> trace id -> offset of the first record holding a span of it
        self._first: dict[int, dict[str, int]] = {}
        #: partition -> next offset to read
        self._next: dict[int, int] = {}
        #: logs partition -> trace id -> offset of the first record holding an evaluation
        #: of it (kept while the trace is open or the evaluation waits for it)
        self._lfirst: dict[int, dict[str, int]] = {}
        #: logs partition -> next offset to read
        self._lnext: dict[int, int] = {}
        #: join counts of the assemblers of partitions given up (counters never go back)
        self._joins_retired: Counter[str] = Counter()
        self._logs: Any = None  # the logs consumer, while the logs topic is read
        self._logs_checked = 0.0
        self._delivery_error: str | None = None
        self._consumer: Any = None
        self._producer: Any = None
        from assaywatch.monitor.pipeline.normalize import monitor_decode_limits

        self._limits = monitor_decode_limits()

    # -- what the metrics port reads --------------------------------------------------
    def pending_traces(self) -> int:
        return sum(a.pending_traces for a in self._asm.values())

    def join_counts(self) -> dict[str, int]:
        """What became of the evaluations read (``assaywatch_evaluation_joins_total``)."""
        total = Counter(self._joins_retired)
        for asm in list(self._asm.values()):
            total.update(asm.join.counts)
        return dict(total)

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

    def _logs_partitions(self) -> int:
        """Partitions of the logs topic (0: not configured or missing); raises
        :class:`TopicMismatch` when they differ from the spans topic's."""
        s = self.settings
        if not s.logs_topic:
            return 0
        md = self._consumer.list_topics(timeout=10)
        logs, spans = md.topics.get(s.logs_topic), md.topics.get(s.spans_topic)
        if logs is None or logs.error is not None or not logs.partitions:
            return 0
        n, m = len(logs.partitions), len(spans.partitions) if spans is not None else 0
        if m and n != m:
            raise TopicMismatch(logs_mismatch(s, n, m))
        return n

    def _open_logs(self) -> None:
        """Start reading the logs topic when it exists (at start; later while missing)."""
        self._logs_checked = time.monotonic()
        n = self._logs_partitions()
        if not n:
            if self.settings.logs_topic:
                logger.warning("assembler: logs topic %s not found: reading spans only "
                               "(evaluation events are not read; checked again every "
                               "%.0f s)", self.settings.logs_topic, LOGS_RECHECK_SECONDS)
            return
        ck = require_kafka()
        s = self.settings
        self._logs = ck.Consumer({
            **base_config(s), "group.id": f"{s.assemble_group}-logs",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            "client.id": f"assaywatch-assembler-{s.instance_id or 'dynamic'}-logs"})
        with self.lock:
            owned = sorted(self._asm)
        if owned:  # assigned before the logs topic was found
            self._assign_logs(owned)
        logger.info("assembler: reading evaluations from %s (%d partitions)", s.logs_topic, n)

    def _assign_logs(self, parts: list[int]) -> None:
        """Read logs partitions ``parts`` from the logs group's committed offsets."""
        if self._logs is None or not parts:
            return
        ck = require_kafka()
        with self.lock:
            for p in parts:
                self._lfirst[p] = {}
                self._lnext.pop(p, None)
        # OFFSET_STORED: the committed offset, else auto.offset.reset (earliest)
        self._logs.incremental_assign([ck.TopicPartition(self.settings.logs_topic, p,
                                                         ck.OFFSET_STORED) for p in parts])

    def _unassign_logs(self, parts: list[int]) -> None:
        if self._logs is None or not parts:
            return
        ck = require_kafka()
        try:
            self._logs.incremental_unassign([ck.TopicPartition(self.settings.logs_topic, p)
                                             for p in parts])
        except ck.KafkaException as exc:  # not assigned (the topic appeared meanwhile)
            logger.warning("assembler: unassigning logs partitions %s: %s", parts, exc)

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
        self._assign_logs([tp.partition for tp in partitions])
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
        self._unassign_logs(parts)
        with self.lock:
            for p in parts:
                asm = self._asm.pop(p, None)
                if asm is not None:
                    self._joins_retired.update(asm.join.counts)
                self._first.pop(p, None)
                self._next.pop(p, None)
                self._lfirst.pop(p, None)
                self._lnext.pop(p, None)

    # -- delivery and commits ----------------------------------------------------------
    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = str(err)

    def _produce(self, value: bytes, key: bytes, header: tuple[str, bytes]) -> None:
        """One record to the runs topic (acknowledged via ``_delivered``)."""
        while True:
            try:
                self._producer.produce(self.settings.runs_topic, value=value, key=key,
                                       headers=[header], on_delivery=self._delivered)
                return
            except BufferError:  # local queue full: serve deliveries, then retry
                self._producer.poll(0.1)

    def _publish(self, runs: list[Run]) -> None:
        for run in runs:
            self._produce(encode_run(run), partition_key(run.key),
                          ("run_id", run.run_id.encode()))
            self.runs_published += 1
        self._producer.poll(0)

    def _publish_evaluations(self, lates: list[LateEvaluation]) -> None:
        """Evaluation records, each with its stream's key: on its stream's runs partition,
        after the runs published before it."""
        for late in lates:
            self._produce(encode_evaluation(late), partition_key(late.key),
                          ("evaluation_of", late.run_id.encode()))
            self.evaluations_published += 1
        self._producer.poll(0)

    def _commit(self, parts: list[int] | None = None) -> None:
        """Commit, for ``parts`` (default all), the offsets below which no open trace and
        no unacknowledged run remains."""
        ck = require_kafka()
        left = self._producer.flush(30)
        if left or self._delivery_error:
            raise DeliveryFailed(f"{left} run record(s) unacknowledged, delivery error: "
                                 f"{self._delivery_error}")
        offsets, loffsets = [], []
        with self.lock:
            for p in parts if parts is not None else list(self._asm):
                asm = self._asm.get(p)
                if asm is None:
                    continue
                pending = asm._pending  # read-only: which traces are still open
                nxt = self._next.get(p)
                if nxt is not None:
                    first = self._first.get(p, {})
                    for tid in [t for t in first if t not in pending]:
                        del first[tid]
                    off = min(first.values(), default=nxt)
                    offsets.append(ck.TopicPartition(self.settings.spans_topic, p,
                                                     min(off, nxt)))
                lnxt = self._lnext.get(p)
                if lnxt is not None and self._logs is not None:
                    # evaluations on an open trace or waiting for theirs are read again
                    lfirst = self._lfirst.get(p, {})
                    for tid in [t for t in lfirst
                                if t not in pending and not asm.join.waits_for(t)]:
                        del lfirst[tid]
                    off = min(lfirst.values(), default=lnxt)
                    loffsets.append(ck.TopicPartition(self.settings.logs_topic, p,
                                                      min(off, lnxt)))
        for consumer, offs in ((self._consumer, offsets), (self._logs, loffsets)):
            if not offs:
                continue
            try:
                consumer.commit(offsets=offs, asynchronous=False)
            except ck.KafkaException as exc:
                # a rebalance under way: the partitions' next owner starts from the
                # previous commit and re-publishes (at least once); a later commit catches up
                logger.warning("assembler: offset commit skipped: %s", exc)

    # -- the loop ------------------------------------------------------------------------
    def _take(self, msgs: list[Any]) -> None:
        from assaywatch.monitor.receivers.otlp.decode import DecodeError, decode_proto_request

        with self.lock:
            for m in usable(msgs, "assembler"):
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
                    first.setdefault(sp.trace_id, off)
                asm.add(res.spans)

    def _take_logs(self, msgs: list[Any]) -> None:
        """Evaluation events of the logs topic into their partition's assembler."""
        from assaywatch.monitor.receivers.otlp.decode import DecodeError
        from assaywatch.monitor.receivers.otlp.decode_logs import decode_proto_logs

        with self.lock:
            for m in usable(msgs, "assembler (logs)"):
                p, off = m.partition(), m.offset()
                asm = self._asm.get(p)
                lfirst = self._lfirst.get(p)
                if asm is None or lfirst is None:
                    continue  # given up since it was fetched
                self._lnext[p] = off + 1
                self.log_records_consumed += 1
                try:
                    res = decode_proto_logs(m.value() or b"", self._limits)
                except DecodeError as exc:
                    self.counters.add_logs_rejected(RECEIVER, exc.reason)
                    continue
                for reason, n in res.rejected.items():
                    self.counters.add_logs_rejected(RECEIVER, reason, n)
                if res.other:
                    self.counters.add_logs_received(RECEIVER, "other", res.other)
                if not res.spans:
                    continue
                self.counters.add_logs_received(RECEIVER, EVALUATION_EVENT, len(res.spans))
                for rec in res.spans:
                    lfirst.setdefault(rec.trace_id, off)
                asm.add(res.spans)

    def _close(self) -> tuple[list[Run], list[LateEvaluation]]:
        """The runs closed now (close order), then the evaluations joined to runs closed
        before (arrival order per partition)."""
        with self.lock:
            runs: list[Run] = []
            lates: list[LateEvaluation] = []
            for asm in self._asm.values():
                runs.extend(asm.poll())
                lates.extend(asm.take_evaluations())
        runs.sort(key=close_order)
        return runs, lates

    def run(self) -> None:
        """Consume until :attr:`stop_event` is set; raises :class:`DeliveryFailed`."""
        self._clients()
        s = self.settings
        self._open_logs()
        self._consumer.subscribe([s.spans_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        self.ready.set()
        last_commit = time.monotonic()
        try:
            while not self.stop_event.is_set():
                msgs = self._consumer.consume(num_messages=500, timeout=s.poll_seconds)
                if msgs:
                    self._take(msgs)
                if self._logs is not None:
                    lmsgs = self._logs.consume(num_messages=500, timeout=0)
                    if lmsgs:
                        self._take_logs(lmsgs)
                elif (s.logs_topic and time.monotonic() - self._logs_checked
                      >= LOGS_RECHECK_SECONDS):
                    self._open_logs()
                runs, lates = self._close()
                if runs:
                    self._publish(runs)
                if lates:
                    self._publish_evaluations(lates)
                if not runs and not lates:
                    self._producer.poll(0)
                if self._delivery_error:
                    raise DeliveryFailed(f"run record delivery failed: {self._delivery_error}")
                if time.monotonic() - last_commit >= s.commit_seconds:
                    self._commit()
                    last_commit = time.monotonic()
            self._commit()
        finally:
            self.ready.clear()
            for consumer in (self._consumer, self._logs):
                if consumer is None:
                    continue
                try:
                    consumer.close()
                except Exception:
                    logger.exception("assembler: closing a consumer failed")
            self._producer.flush(10)
