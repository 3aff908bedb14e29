"""The pipeline thread: the SpanSink behind every receiver, draining a bounded queue into
the assembler (stage 2) and the engine (stage 3) under one lock.

``offer`` never blocks: when the queue is full it returns False and the receiver answers
429/503 or UNAVAILABLE with a retry hint, so real OTel exporters back off and retry instead
of the monitor growing without bound.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord

logger = logging.getLogger(__name__)


class Pipeline:
    """The SpanSink behind every receiver, and the thread that drains it."""

    def __init__(self, config: MonitorConfig, engine: Engine, counters: IngestCounters,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.engine = engine
        self.counters = counters
        self.lock = threading.RLock()
        self._queue: queue.SimpleQueue[list[SpanRecord] | None] = queue.SimpleQueue()
        self._queued_spans = 0
        self._qlock = threading.Lock()
        a = config.assembler
        rules = ContractRules.from_dict(config.contracts) if config.contracts else None
        self.assembler = Assembler(
            clock=clock, grace_s=a.grace_seconds, max_age_s=a.max_age_seconds,
            max_pending_traces=a.max_pending_traces, max_spans_per_trace=a.max_spans_per_trace,
            counters=counters, rules=rules, score_threshold=config.evaluation_threshold)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.runs_processed = 0

    # SpanSink
    def offer(self, spans: list[SpanRecord], receiver: str) -> bool:
        n = len(spans)
        with self._qlock:
            if self._queued_spans + n > self.config.ingest.queue_max_spans:
                return False
            self._queued_spans += n
        self._queue.put(spans)
        return True

    def pending_traces(self) -> int:
        return int(self.assembler.pending_traces)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="assaywatch-pipeline",
                                        daemon=True)
        self._thread.start()

    def stop(self, flush: bool = True) -> None:
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if flush:
            with self.lock:
                self._drain_nowait()
                self._process_runs(self.assembler.flush())

    def _loop(self) -> None:
        last_poll = 0.0
        while not self._stop.is_set():
            try:
                batch = self._queue.get(timeout=0.2)
            except queue.Empty:
                batch = None
            if batch is not None:
                self._take(batch)
            now = time.monotonic()
            if now - last_poll >= 0.2:
                last_poll = now
                try:
                    with self.lock:
                        self._process_runs(self.assembler.poll())
                except Exception:
                    logger.exception("pipeline poll failed")

    def _drain_nowait(self) -> None:
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return
            if batch is not None:
                self._take(batch)

    def _take(self, batch: list[SpanRecord]) -> None:
        with self._qlock:
            self._queued_spans -= len(batch)
        try:
            with self.lock:
                self.assembler.add(batch)
        except Exception:  # a bad batch never takes the pipeline down
            logger.exception("dropping a batch of %d spans that the assembler rejected",
                             len(batch))
            self.counters.add_dropped("pipeline_error", len(batch))

    def _process_runs(self, runs: list[Run]) -> None:
        for run in sorted(runs, key=close_order):
            try:
                self.engine.process(run)
                self.runs_processed += 1
            except Exception:
                logger.exception("run %s could not be processed", run.run_id)
                self.counters.add_dropped("run_error")
