"""The pipeline thread: the SpanSink behind every receiver, draining a bounded queue into
the assembler (stage 2) and the engine (stage 3) under one lock.

``offer`` never blocks: when the queue is full it returns False and the receiver answers
503 or UNAVAILABLE with a retry hint, so real OTel exporters back off and retry instead
of the monitor growing without bound. The queue is bounded twice: in spans
(``ingest.queue_max_spans``) and in the estimated memory of its records
(``ingest.queue_max_bytes``, :func:`batch_bytes`: within 1.0-1.1 times what
``tracemalloc`` measures for decoded spans with and without message content), so spans
that carry large attribute values cannot make a full queue many times larger than a
queue of plain spans. ``refusal_reason`` says which bound refused an offer
(``pipeline_full`` or ``pipeline_full_bytes``), so the receivers can count the refused spans
under it in ``assaywatch_spans_rejected_total{reason}``.

With a state dir, ``offer`` first appends the batch to the write-ahead log
(``service/wal.py``) and returns True only once the bytes are written: True is the
acknowledgement the receiver turns into an OTLP success. The pipeline remembers, per trace
still pending in the assembler, the log position of its first span, so a checkpoint can
record the *low-water mark* (the oldest position a restart must replay from) and the
traces already closed whose spans lie after it (``processed``: a restart skips their
spans instead of assembling and counting their runs a second time).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import (
    ATTR_BYTES,
    EVENT_BYTES,
    KIND_EVALUATION,
    RECORD_BYTES,
    IngestCounters,
    SpanBatch,
    SpanRecord,
)
from assaywatch.monitor.service.wal import Position, WalError, WriteAheadLog, encode_batch

logger = logging.getLogger(__name__)

#: Most closed traces remembered for the replay (``Pipeline.processed``). The set only
#: needs the traces closed while their spans are still in the log window (from the
#: low-water mark to the end); entries before the low-water mark are pruned at every
#: checkpoint. The cap bounds memory (~150 bytes an entry) when the window is huge; an
#: entry evicted by it can make a restart re-assemble that trace's spans that are still
#: in the window (logged).
MAX_PROCESSED = 200_000

#: Seconds of applying arrived calibrations (building detectors, feeding the runs
#: buffered meanwhile) per 0.2 s poll: at most a fifth of the pipeline thread.
CALIBRATION_APPLY_SECONDS = 0.04

#: Seconds a graceful stop waits for the calibrations under way (what is not done by then
#: stays in the checkpoint and is calibrated again at the next start).
STOP_CALIBRATION_WAIT_S = 60.0

#: ``refusal_reason()`` of an ``offer`` refused for ``ingest.queue_max_bytes``, and of
#: any other refused ``offer`` (``ingest.queue_max_spans``, after ``close_intake``, a
#: failed log append: the reason the receivers have always counted).
REFUSED_BYTES = "pipeline_full_bytes"
REFUSED_SPANS = "pipeline_full"

_getsizeof = sys.getsizeof

_Item = tuple[Position, Position, list[SpanRecord], int]


def _spans_in(batch: list[SpanRecord]) -> int:
    """Spans of a batch, its evaluation records (OTLP log records) left out."""
    return sum(1 for s in batch if s.kind != KIND_EVALUATION)


#: Value types without items: an attribute dict holding only these has no nested values
#: (one C-level pass settles it; the types are collected only otherwise).
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def _attrs_bytes(attrs: dict[str, object]) -> int:
    """Estimated bytes of an attribute dict's entries (its keys and values)."""
    if not attrs:
        return 0
    values = attrs.values()
    size = ATTR_BYTES * len(attrs) + sum(map(len, attrs)) + sum(map(_getsizeof, values))
    if not _SCALARS.issuperset(map(type, values)) and _has_items(values):
        size += sum(_nested_bytes(v) for v in values if isinstance(v, (tuple, dict)))
    return size


def _has_items(values: Iterable[object]) -> bool:
    """Whether an array or a map is among ``values`` (tuple or dict, exactly)."""
    kinds = set(map(type, values))
    return tuple in kinds or dict in kinds


def _nested_bytes(v: object, depth: int = 0) -> int:
    """The items of an array or key-value list value (``getsizeof`` counts only the
    container); deeper than 8 levels is counted as 1 KiB."""
    if depth > 8:
        return 1024
    items = v.items() if isinstance(v, dict) else ((None, x) for x in v)  # type: ignore[attr-defined]
    size = 0
    for k, x in items:
        size += _getsizeof(x) + (ATTR_BYTES + len(k) if k is not None else 0)
        if x.__class__ is tuple or x.__class__ is dict:
            size += _nested_bytes(x, depth + 1)
    return size


def batch_bytes(batch: list[SpanRecord]) -> int:
    """Estimated memory a queued batch holds: per record a fixed part
    (:data:`RECORD_BYTES`) plus the characters of its name and status message, its
    attributes (:data:`ATTR_BYTES` and the key's characters each, the value's
    ``sys.getsizeof``, items of arrays and maps included) and events; a resource dict
    shared by consecutive records is counted once. O(attributes): 1.5-4 microseconds a
    span on CPython 3.11, a tenth to a fifth of what decoding the span cost (and less
    than encoding it for the write-ahead log). A :class:`SpanBatch` from the compiled
    decoder carries this estimate, computed while decoding (``tests/monitor/
    test_native_decode.py`` checks it equals this function's): it is returned as is."""
    if batch.__class__ is SpanBatch:
        nbytes = batch.nbytes  # type: ignore[attr-defined]
        if nbytes is not None:
            return int(nbytes)
    size = 64 + 8 * len(batch)  # the list
    resource = None
    for s in batch:
        size += RECORD_BYTES + len(s.name) + len(s.status_message)
        attrs = s.attributes
        if attrs:  # _attrs_bytes inlined: this loop runs for every span received
            values = attrs.values()
            size += (ATTR_BYTES * len(attrs) + sum(map(len, attrs))
                     + sum(map(_getsizeof, values)))
            if not _SCALARS.issuperset(map(type, values)) and _has_items(values):
                size += sum(_nested_bytes(v) for v in values if isinstance(v, (tuple, dict)))
        if s.events:
            for e in s.events:
                size += EVENT_BYTES + len(e.name) + _attrs_bytes(e.attributes)
        if s.resource is not resource:
            resource = s.resource
            size += 64 + _attrs_bytes(resource)
    return size


class Pipeline:
    """The SpanSink behind every receiver, and the thread that drains it."""

    def __init__(self, config: MonitorConfig, engine: Engine, counters: IngestCounters,
                 clock: Callable[[], float] = time.monotonic,
                 wal: WriteAheadLog | None = None) -> None:
        self.config = config
        self.engine = engine
        self.counters = counters
        self.wal = wal
        self.lock = threading.RLock()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._queued_spans = 0
        self._queued_bytes = 0
        #: an offer was refused for room and the pipeline has taken no batch since
        self._full = False
        #: spans refused per :meth:`refusal_reason` (under ``_qlock``)
        self.refused: dict[str, int] = {}
        self._why = threading.local()
        #: guards the queue's span and byte counts, the closed flag, the log append and ``acked``:
        #: batches enter the log and the queue in the same order
        self._qlock = threading.Lock()
        self._closed = False
        #: spans acknowledged per receiver (written to the log), consistent with the log
        #: end under ``_qlock`` (see ``Monitor.checkpoint``)
        self.acked: dict[str, int] = {}
        a = config.assembler
        rules = ContractRules.from_dict(config.contracts) if config.contracts else None
        self.assembler = Assembler(
            clock=clock, grace_s=a.grace_seconds, max_age_s=a.max_age_seconds,
            max_pending_traces=a.max_pending_traces, max_spans_per_trace=a.max_spans_per_trace,
            max_pending_bytes=a.max_pending_bytes,
            counters=counters, rules=rules, score_threshold=config.evaluation_threshold,
            join_window_s=config.evaluations.join_window_seconds,
            max_closed_runs=config.evaluations.max_closed_runs,
            max_waiting_evaluations=config.evaluations.max_waiting,
            key_attributes=tuple(config.streams.key_attributes))
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.runs_processed = 0
        #: pending trace id -> [first, last] log position of its spans, in first-seen
        #: order (so the first entry holds the smallest first position)
        self._active: dict[str, list[Position]] = {}
        #: closed trace id -> log position of its last span (see MAX_PROCESSED)
        self.processed: OrderedDict[str, Position] = OrderedDict()
        #: end position of the last batch handed to the assembler
        self.taken_end: Position = (0, 0)
        self._warned_cap = False

    @property
    def capacity_spans(self) -> int:
        """Most spans the queue ever holds: a larger request can never be accepted."""
        return int(self.config.ingest.queue_max_spans)

    @property
    def queued_bytes(self) -> int:
        """Estimated bytes of the batches queued now (:func:`batch_bytes`)."""
        return self._queued_bytes

    @property
    def queued_spans(self) -> int:
        return self._queued_spans

    # SpanSink
    def offer(self, spans: list[SpanRecord], receiver: str) -> bool:
        """Queue ``spans`` (a decoded request) for the pipeline thread; False when the
        queue is full (the receiver answers 503 / UNAVAILABLE with a retry hint), the
        reason then given by :meth:`refusal_reason`.

        The queue is bounded in spans (``ingest.queue_max_spans``) and in the estimated
        bytes of its records (``ingest.queue_max_bytes``, :func:`batch_bytes`). A batch
        estimated larger than the whole byte bound is accepted when the queue is empty,
        alone: it is already decoded in memory (its size is bounded by the request
        limits), and refusing it would only make its sender retry it forever; meanwhile
        every other batch is refused until the pipeline took it.
        """
        n = len(spans)
        nbytes = batch_bytes(spans)
        payload = encode_batch(receiver, spans) if self.wal is not None else b""
        ingest = self.config.ingest
        with self._qlock:
            if self._closed:
                return self._refuse(REFUSED_SPANS, n)
            if self._queued_spans + n > ingest.queue_max_spans:
                self._full = True
                return self._refuse(REFUSED_SPANS, n)
            if self._queued_bytes + nbytes > ingest.queue_max_bytes and self._queued_bytes:
                self._full = True
                return self._refuse(REFUSED_BYTES, n)
            if self.wal is not None:
                try:
                    pos, end = self.wal.append(payload)
                except WalError as exc:
                    logger.error("%s: answering 'retry later'", exc)
                    return self._refuse(REFUSED_SPANS, n)
            else:
                pos = end = (0, 0)
            self._queued_spans += n
            self._queued_bytes += nbytes
            # spans_received_total counts spans: evaluation records are log records
            self.acked[receiver] = self.acked.get(receiver, 0) + _spans_in(spans)
            self._queue.put((pos, end, spans, nbytes))
        return True

    def _refuse(self, reason: str, n: int) -> bool:
        """Note why the calling thread's offer is refused (call under ``_qlock``)."""
        self._why.reason = reason
        self.refused[reason] = self.refused.get(reason, 0) + n
        return False

    def accepting(self) -> bool:
        """False while the queue is known full: an offer was refused for room (either
        bound) and the pipeline has taken no batch from the queue since, or the intake is
        closed. A hint read without a lock, for a receiver to answer 503 / UNAVAILABLE
        before it reads and decodes a request it would only see refused (refusing then
        costs a fraction of decoding); a request that passes it is offered as usual."""
        return not (self._full or self._closed)

    def refusal_reason(self) -> str:
        """Why the calling thread's last refused :meth:`offer` was refused:
        :data:`REFUSED_BYTES` (``pipeline_full_bytes``) for the byte bound,
        :data:`REFUSED_SPANS` (``pipeline_full``) for the span bound, a graceful stop or a
        failed log append. For the receivers to count a refused request's spans under it
        (one thread serves one request from decode to answer, so the reason is the
        request's own)."""
        return str(getattr(self._why, "reason", REFUSED_SPANS))

    def close_intake(self) -> None:
        """Refuse every later ``offer`` (the receivers answer 503 / UNAVAILABLE with a retry
        hint): the first step of a graceful stop. What was acknowledged is in the queue
        and the log."""
        with self._qlock:
            self._closed = True

    def acked_snapshot(self) -> tuple[dict[str, int], Position]:
        """Spans acknowledged per receiver and the log end, as one consistent pair."""
        with self._qlock:
            return dict(self.acked), (self.wal.end() if self.wal is not None else (0, 0))

    def pending_traces(self) -> int:
        return int(self.assembler.pending_traces)

    def join_counts(self) -> dict[str, int]:
        """What became of the evaluations received as log events (call under ``lock``)."""
        return dict(self.assembler.join.counts)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="assaywatch-pipeline",
                                        daemon=True)
        self._thread.start()

    def stop(self, drain: bool = True, flush: bool = True) -> None:
        """Stop the thread; ``drain`` hands what is queued to the assembler, ``flush``
        then closes every pending trace (without a log: with one, pending traces stay in
        the log and the next start replays them)."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self.lock:
            if drain:
                self._drain_nowait()
                self._process_runs(self.assembler.poll())
            if flush:
                self._process_runs(self.assembler.flush())
            self._prune()
        if drain:
            # a graceful stop finishes the calibrations under way, so the runs they buffer
            # reach the detectors (and their alarms the event log) before the checkpoint
            try:
                with self.lock:
                    self.engine.wait_calibrations(timeout=STOP_CALIBRATION_WAIT_S)
            except Exception:
                logger.exception("finishing calibrations at stop failed")
        else:
            self._apply_calibrations(None)

    def _loop(self) -> None:
        last_poll = 0.0
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                item = None
            if item is not None:
                self._take(item)
            now = time.monotonic()
            if now - last_poll >= 0.2:
                last_poll = now
                try:
                    with self.lock:
                        self._process_runs(self.assembler.poll())
                        self._prune()
                except Exception:
                    logger.exception("pipeline poll failed")
                self._apply_calibrations(CALIBRATION_APPLY_SECONDS)

    def _apply_calibrations(self, budget_s: float | None) -> None:
        """Thresholds that arrived from the calibration worker: the streams' detectors
        are built and fed their buffered runs (``Engine.apply_calibrations``), at most
        ``budget_s`` seconds of it per call so the lock is never held long."""
        if not self.engine.calibrations_ready():
            return
        try:
            with self.lock:
                self.engine.apply_calibrations(budget_s)
        except Exception:
            logger.exception("applying calibrations failed")

    def _drain_nowait(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._take(item)

    def _take(self, item: _Item) -> None:
        pos, end, batch, nbytes = item
        with self._qlock:
            self._queued_spans -= len(batch)
            self._queued_bytes -= nbytes
            self._full = False
        with self.lock:
            self._add(pos, end, batch)

    def _add(self, pos: Position, end: Position, batch: list[SpanRecord]) -> None:
        try:
            self.assembler.add(batch)
        except Exception:  # a bad batch never takes the pipeline down
            logger.exception("dropping a batch of %d spans that the assembler rejected",
                             len(batch))
            self.counters.add_dropped("pipeline_error", len(batch))
        if self.wal is not None:
            active = self._active
            for span in batch:
                ent = active.get(span.trace_id)
                if ent is None:
                    active[span.trace_id] = [pos, pos]
                else:
                    ent[1] = pos
            self.taken_end = end

    def _prune(self) -> None:
        """Move the traces the assembler no longer holds from ``_active`` to
        ``processed`` (closed, evicted, or refused as late or bad: either way their spans
        must not be assembled again by a replay)."""
        if self.wal is None or not self._active:
            return
        pending = self.assembler._pending  # noqa: SLF001 (membership only; see README)
        done = [tid for tid in self._active if tid not in pending]
        processed = self.processed
        for tid in done:
            last = self._active.pop(tid)[1]
            old = processed.pop(tid, None)
            processed[tid] = last if old is None or old < last else old
        while len(processed) > MAX_PROCESSED:
            processed.popitem(last=False)
            if not self._warned_cap:
                self._warned_cap = True
                logger.warning("more than %d closed traces in the write-ahead log window; "
                               "the oldest are forgotten (a restart may assemble their "
                               "spans again)", MAX_PROCESSED)

    def low_water(self) -> Position:
        """The oldest log position a restart must replay from: the first span of the
        oldest trace still pending, else the end of what the assembler has taken (the
        queue holds only later records). Call with ``lock`` held."""
        self._prune()
        low = self.taken_end
        for first, _last in self._active.values():  # first entry = smallest first
            if first < low:
                low = first
            break
        return low

    def prune_processed(self, low: Position) -> None:
        """Forget closed traces whose last span is before ``low`` (a replay from ``low``
        never meets them). Call with ``lock`` held."""
        for tid in [t for t, last in self.processed.items() if last < low]:
            del self.processed[tid]

    def replay(self, start: Position, acked_end: Position, skip: Iterable[str],
               taken: Position | None = None) -> int:
        """Feed the log from ``start`` to the assembler before the receivers start.

        Spans of traces in ``skip`` (closed before the checkpoint) are not assembled
        again; nor are evaluations of those traces the assembler had taken before the
        checkpoint (before ``taken``): later ones join their closed run as late ones.
        Records at or after ``acked_end`` were acknowledged after the checkpoint's
        counters: they are counted as received again (see ``Monitor.restore``).
        Returns the number of spans replayed.
        """
        assert self.wal is not None
        skip_set = set(skip)
        replayed = 0
        clock = self.assembler.clock
        grace = self.config.assembler.grace_seconds
        # The replayed spans arrived before the restart: dated grace_s back, a trace that
        # was complete (ready) closes at the first poll below instead of grace_s after the
        # start, so the first scrape already counts every run processed before the crash.
        self.assembler.clock = lambda: clock() - grace
        try:
            with self.lock:
                replayed = self._replay(start, acked_end, skip_set, taken)
        finally:
            self.assembler.clock = clock
        with self.lock:
            self._process_runs(self.assembler.poll())
            self._prune()
        return replayed

    def _replay(self, start: Position, acked_end: Position, skip_set: set[str],
                taken: Position | None) -> int:
        assert self.wal is not None
        replayed = 0
        for pos, receiver, spans in self.wal.read_from(start):
            if pos >= acked_end:
                n_spans = _spans_in(spans)
                self.acked[receiver] = self.acked.get(receiver, 0) + n_spans
                self.counters.add_received(receiver, n_spans)
            late_ok = taken is not None and pos >= taken
            keep = [s for s in spans if s.trace_id not in skip_set
                    or (late_ok and s.kind == KIND_EVALUATION)]
            if len(keep) < len(spans) and pos >= acked_end:
                # a late span of a trace closed before the checkpoint, as live
                self.counters.add_dropped("late_span", len(spans) - len(keep))
            replayed += len(keep)
            # the record stays needed while a trace of it is pending (low_water)
            self._add(pos, (pos[0], pos[1] + 1), keep)
        return replayed

    def _process_runs(self, runs: list[Run]) -> None:
        """The runs a poll closed, in close order, then the evaluations that joined runs
        closed earlier (``pipeline/join.py``)."""
        ordered = sorted(runs, key=close_order)
        # the fingerprint charts' increments of each stream's runs in one pass
        with self.engine.prepared(ordered):
            for run in ordered:
                try:
                    self.engine.process(run)
                    self.runs_processed += 1
                except Exception:
                    logger.exception("run %s could not be processed", run.run_id)
                    self.counters.add_dropped("run_error")
        for late in self.assembler.take_evaluations():
            try:
                self.engine.process_evaluation(late)
            except Exception:
                logger.exception("evaluation of run %s could not be processed", late.run_id)
                self.counters.add_dropped("run_error")
