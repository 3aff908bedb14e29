"""Stage 2: run records -> per-stream detectors and alarms (``assaywatch kafka detect``).

A consumer group on the runs topic: cooperative-sticky assignment, static membership
(``group.instance.id``), manual commits, ``isolation.level=read_committed``. Each assigned
partition has its own :class:`Engine` (the monitor's, unchanged) holding the streams whose
records land there, and a :class:`PartitionState` around it.

**Checkpoints.** Every ``checkpoint_seconds`` (or ``checkpoint_runs`` runs), on revoke and on
a clean stop, the changed partitions' states go to the compacted state topic, each carrying
the next input offset. With Kafka transactions (``transactions: auto`` and a broker that has
them) one transaction holds the state records, the alarm records since the last checkpoint
and the input offsets (``send_offsets_to_transaction``), so they commit together. Without
them: the state records are flushed with ``acks=all``, then the offsets committed.
Correctness does not rest on either: on assignment a worker restores the partition's last
committed checkpoint and **seeks to its next offset**, whatever the group's committed
offset says, so the state always equals "the runs before that offset, processed once, in
partition order". Re-processed runs give the same alarms with the same ids (the episode
counter is part of the state), which alarm consumers drop.

**Duplicates.** A run id already seen among the partition's last ``dedup_runs`` runs is
dropped (``assaywatch_spans_dropped_total{reason="duplicate_run"}``): a re-publishing
assembler changes nothing.

**Commands.** ``POST /api/rebaseline`` and ``/api/streams/delete`` on any worker write a
command record to the runs topic with the stream's key (:meth:`DetectorWorker.request`);
the owner applies it in order with the stream's runs (``Engine.rebaseline`` /
``delete_stream``; one for a stream it does not have is counted
``command_without_stream``).

**Evaluations.** An evaluation record (an evaluation that reached the assembler after its
run's record was published, ``records.encode_evaluation``) goes to
``Engine.process_evaluation`` as the single monitor does after the runs of a poll; its alarms
are handled exactly like those of runs, and it advances the partition's offset and state like
a run (it is not a run: no run count, no hash chain). Its identity is (run id, evaluator
names) (``records.evaluation_id``); one seen among the partition's last ``dedup_runs``
evaluations is dropped (``reason="duplicate_evaluation"``), and so is one for an evaluator
whose score or label the run's own record already carried (the assembler read the event
again after a crash, and this time the run had closed before it came).

**Ordering guarantee.** Runs of a stream are processed each once; a stream (all versions of
an agent's scenario) lives in one partition. With ``reorder_seconds`` 0 they are processed
in the order their records land in the partition, which agrees with ``replay``'s end-time
order when runs of a stream are published in end order (see ``assembler.py``). With a
reorder window W, every record is held (in the checkpointed state) until the partition has
seen a run ending W later, or W of wall time passed without a record, and the held records
are processed in (end time, run id) order, a late evaluation or a command after every run
that ended before it came: replay's order, whenever no run lands more than W of end time
late (after an assembler crash: the session timeout + the grace + a poll).

**Metrics.** ``/metrics`` is the exporters' :class:`MonitorCollector` over this worker's
engines (:class:`EngineGroup`): only the assigned partitions' streams, so a revoked stream's
series leave this worker and appear at its new owner; dashboards sum over instances. Plus
``assaywatch_kafka_*`` families of the worker itself (partitions, runs, lag).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.config import DetectorConfig, MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import AlarmEvent, StreamState
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.scaleout.clients import (
    KafkaUnavailable,
    base_config,
    require_kafka,
    usable,
)
from assaywatch.monitor.scaleout.records import (
    PartitionState,
    RecordError,
    StreamCommand,
    alarm_record,
    chain_step,
    decode_record,
    decode_state,
    encode_command,
    encode_state,
    evaluation_id,
    evaluator_names,
    partition_key,
    state_key,
)
from assaywatch.monitor.scaleout.settings import KafkaSettings

logger = logging.getLogger(__name__)


#: Records consumed at once: a batch's runs of a stream are prepared together (at most
#: one batch is handled under the lock between two scrapes).
CONSUME_BATCH = 100

#: A record due to be handled: its partition's state and engine, and the record.
_Due = tuple[PartitionState, Engine, "Run | LateEvaluation | StreamCommand"]


class FatalWorkerError(RuntimeError):
    """The worker cannot go on safely (fenced, a failed transaction, an unreadable
    checkpoint): it stops; a restart restores every partition from its checkpoint."""


class EngineGroup:
    """The engines of the assigned partitions, read as one by the exporters."""

    def __init__(self, config: DetectorConfig, engines: dict[int, Engine],
                 command: Callable[[str, StreamKey], bool] | None = None) -> None:
        self.config = config
        self._engines = engines
        #: publishes a command record (``DetectorWorker.request``)
        self._command = command

    def _total(self, counts: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for eng in list(self._engines.values()):
            total.update(getattr(eng, counts))
        return total

    @property
    def dropped(self) -> Counter[str]:
        return self._total("dropped")

    @property
    def removed(self) -> Counter[str]:
        return self._total("removed")

    @property
    def calibration_backlog(self) -> int:
        return sum(eng.calibration_backlog for eng in list(self._engines.values()))

    def streams(self, settle: bool = True) -> list[StreamState]:
        return [st for eng in list(self._engines.values()) for st in eng.streams(settle)]

    def settle(self, budget_s: float | None = None) -> int:
        """:meth:`Engine.settle` of each engine in turn, within one budget in all."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        left = 0
        for eng in list(self._engines.values()):
            rest = None if deadline is None else max(0.0, deadline - time.monotonic())
            left += eng.settle(rest)
        return left

    def stream(self, key: StreamKey) -> StreamState | None:
        for eng in list(self._engines.values()):
            st = eng.stream(key)
            if st is not None:
                return st
        return None

    def rebaseline(self, key: StreamKey) -> bool:
        """Over Kafka a re-baseline is an input: a command record in the runs topic, with
        the stream's key, applied by the worker that owns the stream in order with its runs
        (so a restore or a replay of the topic sees it at the same place). True when the
        record is written (whichever worker owns the stream, or none)."""
        return self._command is not None and self._command("rebaseline", key)

    def delete_stream(self, key: StreamKey) -> bool:
        """A deletion, as a command record like :meth:`rebaseline`."""
        return self._command is not None and self._command("delete", key)


class _PipelineView:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def pending_traces(self) -> int:
        return 0


class WorkerCollector(Collector):
    """``assaywatch_kafka_*``: the worker's partitions, runs, duplicates and lag."""

    def __init__(self, worker: DetectorWorker) -> None:
        self.worker = worker

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        with w.lock:
            parts = dict(w.parts)
            lag = dict(w.lag)
        g = GaugeMetricFamily("assaywatch_kafka_partitions", "Runs-topic partitions "
                              "assigned to this worker.")
        g.add_metric([], len(parts))
        yield g
        c = CounterMetricFamily("assaywatch_kafka_runs_processed", "Runs processed by this "
                                "worker since it started (re-processing included).")
        c.add_metric([], w.runs_processed)
        yield c
        c = CounterMetricFamily("assaywatch_kafka_checkpoints", "Checkpoints written.")
        c.add_metric([], w.checkpoints)
        yield c
        g = GaugeMetricFamily("assaywatch_kafka_consumer_lag", "Run records not yet "
                              "processed, per assigned partition.", labels=["partition"])
        for p in sorted(parts):
            g.add_metric([str(p)], lag.get(p, 0))
        yield g


class DetectorWorker:
    """One detector worker. :meth:`run` until :attr:`stop_event` is set."""

    def __init__(self, settings: KafkaSettings, config: MonitorConfig,
                 baselines: list[Baseline] | None = None,
                 on_alarm: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.settings = settings
        self.config = config
        self.baselines = list(baselines or [])
        self.on_alarm = on_alarm
        self.lock = threading.RLock()
        self.ready = threading.Event()
        self.stop_event = threading.Event()
        self.addresses: dict[str, str] = {}
        self.counters = IngestCounters()  # the exporters' edge counters: none here
        self.parts: dict[int, PartitionState] = {}
        self.engines: dict[int, Engine] = {}
        self.engine = EngineGroup(config.detectors, self.engines, self.request)
        self.pipeline = _PipelineView(self.lock)
        self.lag: dict[int, int] = {}
        self.runs_processed = 0
        self.checkpoints = 0
        self.transactional = False
        self._dirty: set[int] = set()
        self._since_checkpoint = 0
        self._consumer: Any = None
        self._producer: Any = None
        self._command_producer: Any = None
        self._restorer: Any = None
        self._delivery_error: str | None = None
        #: alarm records of the open transaction (produced again if it must be redone)
        self._txn_alarms: list[tuple[bytes, bytes]] = []

    # -- clients -----------------------------------------------------------------------
    def _clients(self) -> None:
        ck = require_kafka()
        s = self.settings
        name = f"assaywatch-detector-{s.instance_id or 'dynamic'}"
        cc = {**base_config(s), "group.id": s.detect_group, "client.id": name,
              "enable.auto.commit": False, "enable.auto.offset.store": False,
              "auto.offset.reset": "earliest", "isolation.level": "read_committed",
              "partition.assignment.strategy": "cooperative-sticky",
              "session.timeout.ms": s.session_timeout_ms, "fetch.wait.max.ms": 50}
        if s.instance_id:
            cc["group.instance.id"] = f"detector-{s.instance_id}"
        self._consumer = ck.Consumer(cc)
        self._restorer = ck.Consumer({**base_config(s), "group.id": f"{s.detect_group}-restore",
                                      "enable.auto.commit": False,
                                      "isolation.level": "read_committed",
                                      "client.id": f"{name}-restore"})
        pc = {**base_config(s), "enable.idempotence": True, "acks": "all", "linger.ms": 5,
              "client.id": name}
        if s.transactions != "off":
            tid = f"{s.detect_group}-{s.instance_id}" if s.instance_id else (
                f"{s.detect_group}-{time.time_ns()}")
            producer = ck.Producer({**pc, "transactional.id": tid,
                                    "transaction.timeout.ms": s.transaction_timeout_ms})
            try:
                producer.init_transactions(max(10.0, s.connect_timeout_seconds))
                self._producer, self.transactional = producer, True
            except ck.KafkaException as exc:
                if s.transactions == "on":
                    raise KafkaUnavailable(f"Kafka transactions unavailable: {exc}") from None
                logger.warning("detector: no Kafka transactions (%s); checkpointing with "
                               "acks=all writes and offset commits", exc)
        if self._producer is None:
            self._producer = ck.Producer(pc)
        if self.transactional:
            self._producer.begin_transaction()

    # -- commands (POST /api/rebaseline, /api/streams/delete) ----------------------------
    def request(self, action: str, key: StreamKey) -> bool:
        """Write a command record for ``key`` to the runs topic (its own idempotent
        producer: the worker's may be transactional); True once the broker has it."""
        ck = require_kafka()
        if self._command_producer is None:
            self._command_producer = ck.Producer({
                **base_config(self.settings), "enable.idempotence": True, "acks": "all",
                "client.id": f"assaywatch-detector-{self.settings.instance_id or 'dynamic'}"
                             "-commands"})
        errors: list[Any] = []
        cmd = StreamCommand(action, key, uuid.uuid4().hex)
        self._command_producer.produce(
            self.settings.runs_topic, value=encode_command(cmd), key=partition_key(key),
            on_delivery=lambda err, msg: errors.append(err))
        left = self._command_producer.flush(10)
        ok = not left and errors == [None]
        logger.warning("detector: %s of %s %s (command %s)", action, key,
                       "written to the runs topic" if ok else f"NOT written: {errors}", cmd.id)
        return ok

    def _command(self, eng: Engine, cmd: StreamCommand) -> None:
        ok = (eng.rebaseline(cmd.key) if cmd.action == "rebaseline"
              else eng.delete_stream(cmd.key))
        if not ok:
            eng.dropped["command_without_stream"] += 1
        logger.warning("detector: applied %s of %s (command %s): %s", cmd.action, cmd.key,
                       cmd.id, "done" if ok else "no such stream")

    # -- restore -----------------------------------------------------------------------
    def _restore(self, partition: int) -> PartitionState:
        """The partition's last committed checkpoint, or a fresh state."""
        ck = require_kafka()
        s = self.settings
        tp = ck.TopicPartition(s.state_topic, partition)
        lo, hi = self._restorer.get_watermark_offsets(tp, timeout=10, cached=False)
        if hi <= lo:
            return PartitionState(partition)
        want = state_key(s.runs_topic, partition)
        last: bytes | None = None
        self._restorer.assign([ck.TopicPartition(s.state_topic, partition, lo)])
        deadline = time.monotonic() + 60
        try:
            while True:
                pos = self._restorer.position([ck.TopicPartition(s.state_topic, partition)])
                if pos and pos[0].offset >= hi:
                    break
                if time.monotonic() > deadline:
                    raise FatalWorkerError(f"restoring partition {partition} from "
                                           f"{s.state_topic} took over 60 s")
                for m in self._restorer.consume(num_messages=100, timeout=0.5):
                    if m.error() is None and m.key() == want:
                        last = m.value()
                    elif m.error() is not None and (
                            m.error().code() == ck.KafkaError._PARTITION_EOF):
                        pos = [ck.TopicPartition(s.state_topic, partition, hi)]
        finally:
            self._restorer.unassign()
        if last is None:
            return PartitionState(partition)
        try:
            state = decode_state(last)
        except RecordError as exc:
            raise FatalWorkerError(f"checkpoint of partition {partition} in "
                                   f"{s.state_topic}: {exc}") from None
        return state

    def _install(self, state: PartitionState) -> None:
        eng = Engine(self.config.detectors, self.baselines,
                     max_streams=self.config.limits.max_streams,
                     stream_idle_seconds=self.config.limits.stream_idle_seconds,
                     replace_idle_seconds=self.config.limits.replace_idle_seconds,
                     idle_clock=time.time_ns)
        eng.load_streams(state.streams, state.latest_frozen, state.dropped)
        self.parts[state.partition] = state
        self.engines[state.partition] = eng

    # -- rebalance callbacks (inside poll, on this thread) -------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        ck = require_kafka()
        assign = []
        with self.lock:
            for tp in partitions:
                t0 = time.monotonic()
                state = self._restore(tp.partition)
                self._install(state)
                offset = state.next_offset if state.next_offset > 0 else ck.OFFSET_BEGINNING
                assign.append(ck.TopicPartition(tp.topic, tp.partition, offset))
                logger.info("detector: partition %d restored at offset %d (%d streams, "
                            "%d runs) in %.2f s", tp.partition, state.next_offset,
                            len(state.streams), state.runs_processed, time.monotonic() - t0)
        consumer.incremental_assign(assign)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        with self.lock:
            self._checkpoint()
            self._drop([tp.partition for tp in partitions])
        consumer.incremental_unassign(partitions)
        logger.info("detector: revoked %s", sorted(tp.partition for tp in partitions))

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # Another worker owns them now: no checkpoint (it would be a zombie's).
        with self.lock:
            self._drop([tp.partition for tp in partitions])
        consumer.incremental_unassign(partitions)
        logger.warning("detector: lost %s", sorted(tp.partition for tp in partitions))

    def _drop(self, parts: list[int]) -> None:
        for p in parts:
            self.parts.pop(p, None)
            self.engines.pop(p, None)
            self.lag.pop(p, None)
            self._dirty.discard(p)

    # -- processing --------------------------------------------------------------------
    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = str(err)

    def _produce(self, topic: str, value: bytes, key: bytes, partition: int = -1) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition,
                                       on_delivery=self._delivered)
                return
            except BufferError:
                self._producer.poll(0.1)

    def _remember_evaluation(self, state: PartitionState, eid: str) -> None:
        state.recent_evaluations[eid] = None
        state.recent_evaluations.move_to_end(eid)
        if len(state.recent_evaluations) > self.settings.dedup_runs:
            state.recent_evaluations.popitem(last=False)

    def _process_batch(self, msgs: list[Any]) -> None:
        """Admit a consumed batch's records in offset order, then handle the ones due
        (all of them without a reorder window) with each partition's runs prepared
        together (:meth:`Engine.prepared`: the same values as one at a time)."""
        due: list[_Due] = []
        for m in msgs:
            self._process(m, due)
        self._flush_idle(due)
        self._handle_all(due)

    def _handle_all(self, due: list[_Due]) -> None:
        if not due:
            return
        runs: dict[int, tuple[Engine, list[Run]]] = {}
        for _, eng, rec in due:
            if isinstance(rec, Run):
                runs.setdefault(id(eng), (eng, []))[1].append(rec)
        with contextlib.ExitStack() as stack:
            for eng, group in runs.values():
                stack.enter_context(eng.prepared(group))
            for state, eng, rec in due:
                self._handle(state, eng, rec)

    def _process(self, m: Any, due: list[_Due]) -> None:
        """Admit one consumed record: skip what the restored state holds, decode, drop
        duplicates, then append it to ``due`` (handled in order by the caller) or hold it
        for the reorder window."""
        p, off = m.partition(), m.offset()
        state = self.parts.get(p)
        eng = self.engines.get(p)
        if state is None or eng is None or off < state.next_offset:
            return  # revoked, or already inside the restored state
        state.next_offset = off + 1
        self._dirty.add(p)
        raw = m.value() or b""
        try:
            rec = decode_record(raw)
        except RecordError as exc:
            eng.dropped["bad_run_record"] += 1
            logger.warning("detector: partition %d offset %d: %s", p, off, exc)
            return
        # duplicates are recognised as they arrive (a re-published copy is never held)
        if isinstance(rec, LateEvaluation):
            eid = evaluation_id(rec.run_id, evaluator_names(rec))
            if eid in state.recent_evaluations:
                eng.dropped["duplicate_evaluation"] += 1
                return
            self._remember_evaluation(state, eid)
        elif isinstance(rec, Run):
            rid = rec.run_id
            if rid in state.recent_run_ids:
                eng.dropped["duplicate_run"] += 1
                state.duplicates += 1
                return
            state.recent_run_ids[rid] = None
            if len(state.recent_run_ids) > self.settings.dedup_runs:
                state.recent_run_ids.popitem(last=False)
            for name in [*rec.scores, *rec.labels]:  # a later copy of these is a duplicate
                self._remember_evaluation(state, evaluation_id(rid, [name]))
        window_ns = int(self.settings.reorder_seconds * 1e9)
        if window_ns <= 0:
            due.append((state, eng, rec))
            return
        state.arrivals += 1
        state.last_arrival = time.time()
        if isinstance(rec, Run):
            state.max_end_ns = max(state.max_end_ns, rec.end_ns)
            entry = (rec.end_ns, 0, rec.run_id, state.arrivals, raw)
        else:  # after every run that ended before it came
            entry = (state.max_end_ns, 1, "", state.arrivals, raw)
        bisect.insort(state.pending, entry)
        self._release(p, state.max_end_ns - window_ns, due)

    def _release(self, p: int, limit_ns: int, due: list[_Due]) -> None:
        """Append to ``due``, in order, the held records of partition ``p`` whose time is
        at most ``limit_ns`` (the reorder window, ``reorder_seconds``)."""
        state, eng = self.parts[p], self.engines[p]
        n = bisect.bisect_right(state.pending, (limit_ns, 2))
        if not n:
            return
        held, state.pending = state.pending[:n], state.pending[n:]
        self._dirty.add(p)
        due.extend((state, eng, decode_record(entry[4])) for entry in held)

    def _flush_idle(self, due: list[_Due]) -> None:
        """Release into ``due`` everything a partition holds once no record came for the
        window (wall time): the last runs before a pause are not held until the next
        run."""
        window = self.settings.reorder_seconds
        if window <= 0:
            return
        now = time.time()
        for p, state in list(self.parts.items()):
            if state.pending and now - state.last_arrival >= window and p in self.engines:
                self._release(p, state.pending[-1][0], due)

    def _handle(self, state: PartitionState, eng: Engine,
                rec: Run | LateEvaluation | StreamCommand) -> None:
        """Process one record (a run, a late evaluation or a command) in the engine."""
        self._since_checkpoint += 1
        if isinstance(rec, StreamCommand):
            self._command(eng, rec)
            return
        if isinstance(rec, LateEvaluation):
            self._alarms(state, eng.process_evaluation(rec))
            return
        run = rec
        state.chains[run.key] = chain_step(state.chains.get(run.key), run.run_id)
        state.runs_processed += 1
        self.runs_processed += 1
        self._alarms(state, eng.process(run))

    def _alarms(self, state: PartitionState, events: list[AlarmEvent]) -> None:
        """Episodes, alarm records and ``on_alarm`` for the alarms of one record."""
        import json

        for ev in events:
            state.episodes[(ev.key, ev.alarm_key)] += 1
            rec = alarm_record(ev, state.episodes[(ev.key, ev.alarm_key)])
            logger.warning("alarm %s on %s at run %d (episode %d)", ev.detector, ev.key,
                           ev.run_index, rec["episode"])
            if self.settings.alarms_topic:
                value, key = json.dumps(rec, sort_keys=True, default=str).encode(), \
                    rec["id"].encode()
                self._produce(self.settings.alarms_topic, value, key)
                if self.transactional:
                    self._txn_alarms.append((value, key))
            if self.on_alarm is not None:
                self.on_alarm(rec)

    def _snapshot(self, p: int) -> PartitionState:
        state, eng = self.parts[p], self.engines[p]
        state.streams, state.latest_frozen = eng.partition_state()
        state.dropped = Counter(eng.dropped)
        return state

    def _checkpoint(self) -> None:
        """Write the changed partitions' states and commit their input offsets."""
        ck = require_kafka()
        s = self.settings
        dirty = sorted(p for p in self._dirty if p in self.parts)
        if not dirty:
            return
        blobs = []
        for p in dirty:
            state = self._snapshot(p)
            blobs.append((p, encode_state(state), state.next_offset))
        offsets = [ck.TopicPartition(s.runs_topic, p, off) for p, _, off in blobs]
        if self.transactional:
            self._commit_transaction(blobs, offsets)
        else:
            for p, blob, _ in blobs:
                self._produce(s.state_topic, blob, state_key(s.runs_topic, p), partition=p)
            left = self._producer.flush(30)
            if left or self._delivery_error:
                raise FatalWorkerError(f"checkpoint not acknowledged ({left} left, "
                                       f"{self._delivery_error})")
            self._commit_offsets(offsets)
        self._dirty.clear()
        self._since_checkpoint = 0
        self.checkpoints += 1

    def _commit_offsets(self, offsets: list[Any]) -> None:
        """Best effort: the group's offsets serve lag monitoring; restores seek to the
        checkpoint's own offset."""
        ck = require_kafka()
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:
            logger.warning("detector: offset commit skipped: %s", exc)

    def _commit_transaction(self, blobs: list[tuple[int, bytes, int]],
                            offsets: list[Any]) -> None:
        """One transaction: the alarms since the last checkpoint, the state records and
        (when the group generation allows it) the input offsets. A generation that changed
        under a rebalance makes the offsets part fail: the transaction is aborted and
        redone without them (the state records carry the offsets); a fenced producer is
        fatal."""
        ck = require_kafka()
        s = self.settings
        with_offsets = True
        for _attempt in range(5):
            try:
                for p, blob, _ in blobs:
                    self._produce(s.state_topic, blob, state_key(s.runs_topic, p),
                                  partition=p)
                if with_offsets:
                    self._producer.send_offsets_to_transaction(
                        offsets, self._consumer.consumer_group_metadata(), 30)
                self._producer.commit_transaction(30)
                self._txn_alarms.clear()
                self._producer.begin_transaction()
                if not with_offsets:
                    self._commit_offsets(offsets)
                return
            except ck.KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if err is None or err.fatal():
                    raise FatalWorkerError(f"checkpoint failed: {exc}") from None
                if err.txn_requires_abort():
                    logger.warning("detector: checkpoint transaction aborted and redone "
                                   "without the group offsets: %s", exc)
                    self._producer.abort_transaction(30)
                    self._producer.begin_transaction()
                    for value, key in self._txn_alarms:  # they were in the aborted one
                        self._produce(s.alarms_topic, value, key)
                    with_offsets = False
                elif not err.retriable():
                    raise FatalWorkerError(f"checkpoint failed: {exc}") from None
        raise FatalWorkerError("checkpoint failed 5 times")

    def _update_lag(self) -> None:
        ck = require_kafka()
        for p, state in list(self.parts.items()):
            try:
                _, hi = self._consumer.get_watermark_offsets(
                    ck.TopicPartition(self.settings.runs_topic, p), cached=True)
            except ck.KafkaException:
                continue
            if hi >= 0:
                self.lag[p] = max(0, hi - state.next_offset)

    def run(self) -> None:
        """Consume until :attr:`stop_event`; raises :class:`FatalWorkerError`."""
        self._clients()
        s = self.settings
        self._consumer.subscribe([s.runs_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        self.ready.set()
        last = time.monotonic()
        clean = False
        try:
            while not self.stop_event.is_set():
                msgs = self._consumer.consume(num_messages=CONSUME_BATCH, timeout=s.poll_seconds)
                with self.lock:
                    self._process_batch(list(usable(msgs, "detector")))
                    self._producer.poll(0)
                    now = time.monotonic()
                    if (now - last >= s.checkpoint_seconds
                            or self._since_checkpoint >= s.checkpoint_runs):
                        self._checkpoint()
                        self._update_lag()
                        last = now
                if msgs:
                    # a lock released and taken straight back starves a waiting scrape:
                    # give it the moment it needs (per batch of at most 100 runs)
                    time.sleep(0.001)
            with self.lock:
                self._checkpoint()
            clean = True
        finally:
            self.ready.clear()
            if not clean and self.transactional:
                try:
                    self._producer.abort_transaction(5)
                except Exception:
                    pass
            try:
                self._consumer.close()
            except Exception:
                logger.exception("detector: closing the consumer failed")
            self._restorer.close()
            if clean and self.transactional:
                try:  # the empty transaction opened after the last checkpoint
                    self._producer.abort_transaction(5)
                except Exception:
                    pass
            self._producer.flush(10)
