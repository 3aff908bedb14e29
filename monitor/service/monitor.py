"""The running monitor: receivers -> queue -> assembler -> engine, exporters, checkpoints.

Receivers run in their own threads and hand decoded spans to :class:`Pipeline.offer`,
which never blocks: when the bounded queue is full it returns False and the receiver
answers 429/503 or UNAVAILABLE with a retry hint, so real OTel exporters back off and
retry instead of the monitor growing without bound. One pipeline thread assembles runs
and feeds the engine under a lock the metrics collector shares.

With a state dir, what is acknowledged survives ``kill -9`` (README "Durability"): every
accepted batch is in the write-ahead log (``wal.py``) before the receiver answers success;
a checkpoint (``state.py``) records the engine, the counters and the log's low-water mark;
a start restores the checkpoint and replays the log from that mark, skipping the traces
already processed (``Pipeline.processed``), recording each alarm onset once
(``onsets.py``) and keeping every exported counter monotone (``counters.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from assaywatch.analyzers.baseline import Baseline
from assaywatch.monitor.config import MonitorConfig, parse_hostport
from assaywatch.monitor.engine.calibration import CalibrationWorker, default_workers
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import AlarmEvent
from assaywatch.monitor.exporters.events import EventLog
from assaywatch.monitor.pipeline.join import EvaluationJoin
from assaywatch.monitor.receivers.otlp.decode import DecodeLimits
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.service.counters import (
    DurableCounters,
    counts_from_json,
    pairs_from_json,
    pairs_to_json,
)
from assaywatch.monitor.service.onsets import OnsetRecorder
from assaywatch.monitor.service.pipeline import Pipeline
from assaywatch.monitor.service.state import StateError, StateStore
from assaywatch.monitor.service.wal import Position, WalError, WriteAheadLog

logger = logging.getLogger(__name__)

#: Longest wait at start for calibrations of streams replayed from the write-ahead log
#: (their thresholds are usually in the checkpoint's cache, so this is rarely spent).
RESTART_CALIBRATION_WAIT_S = 120.0


class _ServiceEventLog(EventLog):
    """The event log, asking for a checkpoint right after a state change (a re-baseline
    is not in the span log: only a checkpoint makes it survive a crash)."""

    def __init__(self, state_dir: str, on_state_change: Any) -> None:
        super().__init__(state_dir)
        self._on_state_change = on_state_change

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        if record.get("event") != "alarm":
            self._on_state_change()


class Monitor:
    """Everything ``assaywatch monitor`` runs, startable and stoppable from tests."""

    def __init__(self, config: MonitorConfig, baselines: list[Baseline] | None = None) -> None:
        self.config = config
        state_dir = config.state_dir
        self.store = StateStore(state_dir) if state_dir else None
        self.counters: IngestCounters = DurableCounters(state_dir) if state_dir \
            else IngestCounters()
        self._checkpoint_now = threading.Event()
        self.events = _ServiceEventLog(state_dir, self._checkpoint_now.set) \
            if state_dir else None
        self.onsets = OnsetRecorder(self.events, config.detectors.alarm_hold_runs) \
            if self.events is not None else None
        self.wal = WriteAheadLog(
            state_dir,
            segment_bytes=config.wal_segment_bytes,
            fsync_seconds=config.wal_fsync_seconds,
        ) if state_dir else None
        # Baseline freezes are calibrated in worker processes, off the pipeline lock
        # (engine/calibration.py); the engine buffers a calibrating stream's runs.
        self.calibrator = CalibrationWorker() if default_workers() > 0 else None
        self.engine = Engine(config.detectors, baselines or [], on_alarm=self._on_alarm,
                             max_streams=config.limits.max_streams,
                             stream_idle_seconds=config.limits.stream_idle_seconds,
                             replace_idle_seconds=config.limits.replace_idle_seconds,
                             idle_clock=time.time_ns,
                             calibrator=self.calibrator,
                             score_shift=config.evaluations.min_drop,
                             score_threshold=config.evaluation_threshold,
                             verdict_window_s=config.evaluations.join_window_seconds)
        self.pipeline = Pipeline(config, self.engine, self.counters, wal=self.wal)
        self.ready = threading.Event()
        self.addresses: dict[str, str] = {}
        self._servers: list[Any] = []
        self._checkpoint_thread: threading.Thread | None = None
        self._checkpoint_lock = threading.Lock()
        self._stopping = threading.Event()
        self.alarm_log: list[AlarmEvent] = []
        self.replayed_spans = 0

    def _on_alarm(self, event: AlarmEvent) -> None:
        if self.onsets is not None and not self.onsets.record(event):
            return  # the same onset, fired again by the replay after a restart
        self.alarm_log.append(event)
        del self.alarm_log[:-1000]
        logger.warning("alarm %s on %s at run %d", event.detector, event.key, event.run_index)
        if self.events is not None and self.onsets is None:
            self.events.append(event.to_dict())

    # -- state -------------------------------------------------------------------------
    def restore(self) -> None:
        """Load the checkpoint, then replay the write-ahead log from its low-water mark
        (raises :class:`StateError` when the state dir cannot be used as it is)."""
        if self.store is None:
            return
        saved = self.store.load()
        assert isinstance(self.counters, DurableCounters)
        try:
            self.counters.load_floor()
        except (ValueError, TypeError) as exc:
            raise StateError(f"{self.counters.path}: not a counters file written by the "
                             f"monitor ({exc}). It was left untouched: move the state dir "
                             "away to start fresh") from None
        eng = saved.get("engine")
        if eng is not None:
            # streams, latest frozen baselines, drops, calibrated thresholds (a stream
            # that was calibrating resumes from them, or is submitted again)
            self.engine.restore_state(eng)
        low: Position = (0, 0)
        acked_end: Position = (0, 0)
        try:
            cnt = saved.get("counters")
            if cnt is not None:
                c = self.counters
                received = counts_from_json(cnt["received"], "received")
                c.received.update(received)
                self.pipeline.acked = dict(received)
                c.dropped.update(counts_from_json(cnt["dropped"], "dropped"))
                # edge counts are not in the span log: the larger of the checkpoint's and
                # the last exported (see counters.py)
                for live, ckpt, floor in (
                        (c.rejected, pairs_from_json(cnt["rejected"], "rejected"),
                         c.floor_rejected),
                        (c.sanitised, pairs_from_json(cnt["sanitised"], "sanitised"),
                         c.floor_sanitised)):
                    for k in set(ckpt) | set(floor):
                        live[k] = max(ckpt.get(k, 0), floor.get(k, 0))
            wal = saved.get("wal")
            if wal is not None:
                low = (int(wal["low"][0]), int(wal["low"][1]))
                acked_end = (int(wal["acked_end"][0]), int(wal["acked_end"][1]))
            processed = OrderedDict(
                (str(t), (int(s), int(o))) for t, s, o in saved.get("processed", []))
            taken = None
            if wal is not None and "taken" in wal:
                taken = (int(wal["taken"][0]), int(wal["taken"][1]))
            join = saved.get("join")
            if isinstance(join, EvaluationJoin):
                join.restamp(self.pipeline.assembler.clock())
                self.pipeline.assembler.join = join
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{self.store.path}: checkpoint items are malformed ({exc}). "
                             "It was left untouched: move the state dir away to start "
                             "fresh") from None
        if self.onsets is not None:
            self.onsets.load(saved.get("events_offset") if saved else None)
        if saved:
            logger.info("resumed %d streams from %s", len(self.engine.streams(settle=False)),
                        self.store.path)
        if self.wal is not None:
            self.pipeline.processed = processed
            self.replayed_spans = self.pipeline.replay(low, acked_end, processed, taken)
            if self.replayed_spans:
                logger.info("replayed %d spans from the write-ahead log (%d traces pending)",
                            self.replayed_spans, self.pipeline.pending_traces())

    def checkpoint(self) -> None:
        if self.store is None:
            return
        with self._checkpoint_lock:  # one checkpoint at a time, written in order
            with self.pipeline.lock:
                low = self.pipeline.low_water()
                self.pipeline.prune_processed(low)
                acked, acked_end = self.pipeline.acked_snapshot()
                assert isinstance(self.counters, DurableCounters)
                _received, rejected, dropped, sanitised = self.counters.live_snapshot()
                items: dict[str, Any] = {
                    "engine": self.engine.checkpoint_state(),
                    # received = spans written to the log up to acked_end (counters.py)
                    "counters": {"received": acked, "rejected": pairs_to_json(rejected),
                                 "dropped": dropped, "sanitised": pairs_to_json(sanitised)},
                    "wal": {"low": list(low), "acked_end": list(acked_end),
                            "taken": list(self.pipeline.taken_end)},
                    "join": self.pipeline.assembler.join,
                    "processed": [[t, p[0], p[1]] for t, p in self.pipeline.processed.items()],
                    "events_offset": self.onsets.offset() if self.onsets is not None else 0,
                }
                rows = self.store.encode(items)
            # Outside the pipeline lock: the disk flushes (ingestion goes on meanwhile).
            if self.wal is not None:
                self.wal.sync()  # the records the checkpoint points to are on disk first
            self.store.write(rows)
        if self.wal is not None:
            self.wal.delete_before(low)

    def _checkpoint_loop(self) -> None:
        while not self._stopping.is_set():
            self._checkpoint_now.wait(self.config.checkpoint_seconds)
            self._checkpoint_now.clear()
            if self._stopping.is_set():
                return
            try:
                self.checkpoint()
            except Exception:
                logger.exception("checkpoint failed")

    def decode_limits(self) -> DecodeLimits:
        """The receivers' decode limits. Only the attributes the pipeline reads are
        decoded: the rest (message content, HTTP and framework attributes) is skipped
        before conversion, saving time and memory; the compiled decoder classifies the
        common span on the way. Without a write-ahead log nothing reads a classified
        span's attributes after that, so they are not kept while the span waits in the
        queue; with one, they are what a restart replays."""
        from assaywatch.monitor.pipeline.normalize import monitor_decode_limits

        return monitor_decode_limits(self.config.streams.key_attributes,
                                     classified_attributes=self.wal is not None)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        from assaywatch.monitor.exporters.status import StatusServer
        from assaywatch.monitor.receivers.otlp.grpc_receiver import GrpcReceiver
        from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver

        if self.calibrator is not None:
            self.calibrator.warm_up()
        self.restore()
        with self.pipeline.lock:
            # Runs replayed from the log may wait for a calibration: apply it before the
            # ports open, so the first scrape after a restart counts at least what was
            # exported before the crash (alarms included), never less.
            self.engine.wait_calibrations(timeout=RESTART_CALIBRATION_WAIT_S)
        if self.wal is not None:
            try:
                self.wal.open()
            except WalError as exc:
                raise StateError(str(exc)) from None
            with self.pipeline.lock:
                # replayed records are held by their pending traces (low_water) from now
                self.pipeline.taken_end = self.wal.end()
        self.pipeline.start()
        listen = self.config.listen
        ing = self.config.ingest
        limits = self.decode_limits()
        if listen.otlp_grpc:
            host, port = parse_hostport(listen.otlp_grpc, "otlp_grpc")
            with _listener("OTLP/gRPC", listen.otlp_grpc, "--otlp-grpc"):
                g = GrpcReceiver(self.pipeline, self.counters, host=host, port=port,
                                 max_message_bytes=ing.max_request_bytes, limits=limits)
                self.addresses["otlp_grpc"] = f"{host}:{g.start()}"
            self._servers.append(g)
        if listen.otlp_http:
            host, port = parse_hostport(listen.otlp_http, "otlp_http")
            with _listener("OTLP/HTTP", listen.otlp_http, "--otlp-http"):
                h = HttpReceiver(self.pipeline, self.counters, host=host, port=port,
                                 max_body_bytes=ing.max_request_bytes,
                                 max_decompressed_bytes=ing.max_decompressed_bytes,
                                 limits=limits)
                self.addresses["otlp_http"] = f"{host}:{h.start()}"
            self._servers.append(h)
        host, port = parse_hostport(listen.metrics, "metrics")
        with _listener("metrics", listen.metrics, "--metrics"):
            status = StatusServer(self, host, port)
            self.addresses["metrics"] = f"{host}:{status.start()}"
        self._servers.append(status)
        self._checkpoint_thread = threading.Thread(target=self._checkpoint_loop,
                                                   name="assaywatch-checkpoint", daemon=True)
        self._checkpoint_thread.start()
        self.ready.set()
        return self.addresses

    def stop(self, save: bool = True) -> None:
        """Stop gracefully: refuse new work (receivers answer 503 / UNAVAILABLE with a
        retry hint), stop the receivers, drain the queue, write the last checkpoint
        (unless ``save`` is False: a start that failed must not overwrite the state it
        could not read).

        With a state dir, traces still pending stay in the write-ahead log and the next
        start replays them (they close there, with their late spans if the agent sends
        any); without one, they are closed now, as nothing would keep them.
        """
        self.ready.clear()
        self._stopping.set()
        self._checkpoint_now.set()
        for server in self._servers:  # OTLP/HTTP: later requests 503 + Connection: close,
            if hasattr(server, "begin_stop"):  # idle keep-alive connections closed
                server.begin_stop()
        self.pipeline.close_intake()
        for server in self._servers:
            if server.__class__.__name__ != "StatusServer":
                try:
                    server.stop()
                except Exception:
                    logger.exception("stopping %s failed", server)
        self.pipeline.stop(drain=save, flush=save and self.wal is None)
        try:
            if save:
                if self._checkpoint_thread is not None:
                    self._checkpoint_thread.join(timeout=30)
                self.checkpoint()
        finally:
            if self.calibrator is not None:
                self.calibrator.shutdown()
            if self.wal is not None:
                self.wal.close()
            for server in self._servers:
                if server.__class__.__name__ == "StatusServer":
                    server.stop()


@contextlib.contextmanager
def _listener(name: str, address: str, flag: str) -> Iterator[None]:
    """Turn a failed bind into one OSError naming the listener, its address and the flag."""
    try:
        yield
    except OSError as exc:
        if exc.strerror is None:  # the receiver phrased it already, naming itself
            raise
        raise OSError(f"the {name} listener cannot bind {address}: {exc.strerror} (another "
                      f"process, perhaps a second monitor, may hold it); pick another "
                      f"HOST:PORT with {flag}") from exc
