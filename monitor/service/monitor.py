"""The running monitor: receivers -> queue -> assembler -> engine, exporters, checkpoints.

Receivers run in their own threads and hand decoded spans to :class:`Pipeline.offer`,
which never blocks: when the bounded queue is full it returns False and the receiver
answers 429/503 or UNAVAILABLE with a retry hint, so real OTel exporters back off and
retry instead of the monitor growing without bound. One pipeline thread assembles runs
and feeds the engine under a lock the metrics collector shares.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from assaywatch.analyzers.baseline import Baseline
from assaywatch.monitor.config import MonitorConfig, parse_hostport
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import AlarmEvent
from assaywatch.monitor.exporters.events import EventLog
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.service.pipeline import Pipeline
from assaywatch.monitor.service.state import StateStore

logger = logging.getLogger(__name__)


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
        from assaywatch.monitor.exporters.status import StatusServer
        from assaywatch.monitor.pipeline.dialects import READ_KEYS, READ_PREFIXES
        from assaywatch.monitor.receivers.otlp.decode import DecodeLimits
        from assaywatch.monitor.receivers.otlp.grpc_receiver import GrpcReceiver
        from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver

        self.restore()
        self.pipeline.start()
        listen = self.config.listen
        ing = self.config.ingest
        # Decode only the attributes the pipeline reads: the rest (message content, HTTP
        # and framework attributes) is skipped before conversion, saving time and memory.
        limits = DecodeLimits(keep_keys=READ_KEYS, keep_prefixes=READ_PREFIXES)
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
        """Stop receiving, close pending runs, write the last checkpoint (unless ``save``
        is False: a start that failed must not overwrite the state it could not read)."""
        self.ready.clear()
        self._stopping.set()
        for server in self._servers:
            if server.__class__.__name__ != "StatusServer":
                try:
                    server.stop()
                except Exception:
                    logger.exception("stopping %s failed", server)
        self.pipeline.stop(flush=save)
        try:
            if save:
                self.checkpoint()
        finally:
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
