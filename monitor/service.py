"""The running monitor: receivers -> queue -> assembler -> engine, exporters, checkpoints.

Receivers run in their own threads and hand decoded spans to :class:`Pipeline.offer`,
which never blocks: when the bounded queue is full it returns False and the receiver
answers 429/503 or UNAVAILABLE with a retry hint, so real OTel exporters back off and
retry instead of the monitor growing without bound. One pipeline thread assembles runs
and feeds the engine under a lock the metrics collector shares.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig, parse_hostport
from assaywatch.monitor.engine import AlarmEvent, Engine, close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.spans import IngestCounters, SpanRecord
from assaywatch.monitor.state import EventLog, StateStore

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


class Monitor:
    """Everything ``assaywatch monitor`` runs, startable and stoppable from tests."""

    def __init__(self, config: MonitorConfig, baselines: list[Baseline] | None = None) -> None:
        self.config = config
        self.counters = IngestCounters()
        self.store = StateStore(config.state_dir) if config.state_dir else None
        self.events = EventLog(config.state_dir) if config.state_dir else None
        self.engine = Engine(config.detectors, baselines or [], on_alarm=self._on_alarm,
                             max_streams=config.limits.max_streams)
        self.pipeline = Pipeline(config, self.engine, self.counters)
        self.ready = threading.Event()
        self.addresses: dict[str, str] = {}
        self._servers: list[Any] = []
        self._checkpoint_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.alarm_log: list[AlarmEvent] = []

    def _on_alarm(self, event: AlarmEvent) -> None:
        self.alarm_log.append(event)
        del self.alarm_log[:-1000]
        logger.warning("alarm %s on %s at run %d", event.detector, event.key, event.run_index)
        if self.events is not None:
            self.events.append(event.to_dict())

    # -- state -------------------------------------------------------------------------
    def restore(self) -> None:
        if self.store is None:
            return
        saved = self.store.load()
        if not saved:
            return
        eng = saved.get("engine")
        if eng is not None:
            streams, latest, dropped = eng
            self.engine._streams.update(streams)
            self.engine._latest_frozen.update(latest)
            self.engine.dropped.update(dropped)
        cnt = saved.get("counters")
        if cnt is not None:
            received, rejected, dropped = cnt
            self.counters.received.update(received)
            self.counters.rejected.update(rejected)
            self.counters.dropped.update(dropped)
        logger.info("resumed %d streams from %s", len(self.engine._streams), self.store.path)

    def checkpoint(self) -> None:
        if self.store is None:
            return
        with self.pipeline.lock:
            items = {
                "engine": (dict(self.engine._streams), dict(self.engine._latest_frozen),
                           dict(self.engine.dropped)),
                "counters": self.counters.snapshot(),
            }
            self.store.save(items)

    def _checkpoint_loop(self) -> None:
        while not self._stopping.wait(self.config.checkpoint_seconds):
            try:
                self.checkpoint()
            except Exception:
                logger.exception("checkpoint failed")

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        from assaywatch.monitor.httpd import StatusServer
        from assaywatch.monitor.otlp.decode import DecodeLimits
        from assaywatch.monitor.otlp.grpc_receiver import GrpcReceiver
        from assaywatch.monitor.otlp.http_receiver import HttpReceiver
        from assaywatch.monitor.pipeline.dialects import READ_KEYS, READ_PREFIXES

        self.restore()
        self.pipeline.start()
        listen = self.config.listen
        ing = self.config.ingest
        # Decode only the attributes the pipeline reads: the rest (message content, HTTP
        # and framework attributes) is skipped before conversion, saving time and memory.
        limits = DecodeLimits(keep_keys=READ_KEYS, keep_prefixes=READ_PREFIXES)
        if listen.otlp_grpc:
            host, port = parse_hostport(listen.otlp_grpc, "otlp_grpc")
            g = GrpcReceiver(self.pipeline, self.counters, host=host, port=port,
                             max_message_bytes=ing.max_request_bytes, limits=limits)
            self.addresses["otlp_grpc"] = f"{host}:{g.start()}"
            self._servers.append(g)
        if listen.otlp_http:
            host, port = parse_hostport(listen.otlp_http, "otlp_http")
            h = HttpReceiver(self.pipeline, self.counters, host=host, port=port,
                             max_body_bytes=ing.max_request_bytes,
                             max_decompressed_bytes=ing.max_decompressed_bytes,
                             limits=limits)
            self.addresses["otlp_http"] = f"{host}:{h.start()}"
            self._servers.append(h)
        host, port = parse_hostport(listen.metrics, "metrics")
        status = StatusServer(self, host, port)
        self.addresses["metrics"] = f"{host}:{status.start()}"
        self._servers.append(status)
        self._checkpoint_thread = threading.Thread(target=self._checkpoint_loop,
                                                   name="assaywatch-checkpoint", daemon=True)
        self._checkpoint_thread.start()
        self.ready.set()
        return self.addresses

    def stop(self) -> None:
        """Stop receiving, close pending runs, write the last checkpoint."""
        self.ready.clear()
        self._stopping.set()
        for server in self._servers:
            if server.__class__.__name__ != "StatusServer":
                try:
                    server.stop()
                except Exception:
                    logger.exception("stopping %s failed", server)
        self.pipeline.stop(flush=True)
        try:
            self.checkpoint()
        finally:
            for server in self._servers:
                if server.__class__.__name__ == "StatusServer":
                    server.stop()
