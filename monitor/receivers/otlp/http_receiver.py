"""OTLP/HTTP receiver: ``POST /v1/traces`` and ``POST /v1/logs``, protobuf or JSON bodies.

Logs carry the GenAI evaluation events (``gen_ai.evaluation.result``): their evaluation
records go to the same sink as spans, other log records are answered 200 and discarded
(:mod:`~assaywatch.monitor.receivers.otlp.decode_logs`). A ``/v1/logs`` request gets the
answers below with ``ExportLogsServiceResponse`` (``partialSuccess.rejectedLogRecords``)
and is counted in ``logs_received`` / ``logs_rejected`` instead of the span counters.
``/v1/metrics`` is read and answered with an empty success (discarded).

Two layers, so the lead can mount the endpoint on another server:

* :class:`~assaywatch.monitor.receivers.otlp.http_endpoint.OtlpEndpoint` (alias
  ``TracesEndpoint``) - transport-free logic: given method, path, headers and a body
  stream it returns an :class:`HttpAnswer` (status, headers, body). It never raises.
* :class:`HttpReceiver` - a hardened standard-library ``ThreadingHTTPServer`` around it
  (:mod:`~assaywatch.monitor.receivers.otlp.http_server`: at most 64 connections, a
  60 s deadline per request, a 128 backlog, lingering close).

Answers (shared/reference/otel-conventions.md section 7), always in the request's
content type (``application/x-protobuf`` or ``application/json``):

=====================================  ===============================================
situation                              answer
=====================================  ===============================================
all accepted / empty request           200, ``ExportTraceServiceResponse`` (or
                                       ``ExportLogsServiceResponse``)
some spans / evaluations rejected      200 with ``partialSuccess``
malformed body / compression           400, ``google.rpc.Status`` + ``BadRequest``
body > ``max_body_bytes``              413 (read no further; connection closed after
                                       the client had time to read the answer)
inflated body > ``max_decompressed``   413 (detected while streaming the inflation)
more spans than a request may carry    413 (``max_spans_per_request``, or more than the
                                       pipeline's queue can ever hold)
more JSON values / protobuf messages   413 (``max_request_elements``, counted before
                                       the objects are built)
body not arrived within the deadline   408 (connection closed)
other content type or encoding         415
other path / method                    404 / 405
``max_concurrent_decodes`` busy        503 + ``Retry-After`` (retried by exporters)
bodies being received > the budget     503 + ``Retry-After``, connection closed (4 x
                                       ``max_body_bytes``, at least 32 MiB of wire bytes
                                       across requests, taken as they arrive)
pipeline full (``offer`` False)        503 + ``Retry-After`` (retried by exporters)
=====================================  ===============================================

Repaired values (invalid UTF-8, long names, span times) are counted per reason in
``IngestCounters.sanitised`` (:mod:`~assaywatch.monitor.receivers.otlp.bounds`).
"""

from __future__ import annotations

import logging
import threading

from assaywatch.monitor.receivers.otlp.bounds import DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_SPANS
from assaywatch.monitor.receivers.otlp.decode import DecodeLimits
from assaywatch.monitor.receivers.otlp.http_endpoint import (
    DEFAULT_MAX_CONCURRENT_DECODES,
    HTTP_RECEIVER,
    LOGS_PATH,
    OTHER_SIGNAL_PATHS,
    TRACES_PATH,
    HttpAnswer,
    OtlpEndpoint,
    TracesEndpoint,
)
from assaywatch.monitor.receivers.otlp.http_server import (
    DEFAULT_MAX_CONNECTIONS,
    DeadlineRequestHandler,
    HardenedHTTPServer,
)
from assaywatch.monitor.receivers.spans import IngestCounters, SpanSink

__all__ = [
    "DEFAULT_MAX_CONCURRENT_DECODES",
    "HTTP_RECEIVER",
    "LOGS_PATH",
    "OTHER_SIGNAL_PATHS",
    "TRACES_PATH",
    "HttpAnswer",
    "HttpReceiver",
    "OtlpEndpoint",
    "TracesEndpoint",
]

logger = logging.getLogger(__name__)


class _Handler(DeadlineRequestHandler):
    server_version = "assaywatch-otlp"
    endpoint: OtlpEndpoint  # set on the per-receiver subclass

    def _serve(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        answer = self.endpoint.handle(self.command, self.path, headers, self.rfile)
        self.send_answer(answer.status, answer.body, answer.content_type, answer.headers,
                         answer.close)

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)


class HttpReceiver:
    """OTLP/HTTP receiver on a ``ThreadingHTTPServer`` (one thread per connection).

    Parameters are those of :class:`OtlpEndpoint`, plus ``host`` and ``port``
    (0 picks a free port, returned by :meth:`start`), ``max_connections`` (connections
    served at once; one more is answered 503 and closed) and ``request_deadline_s`` (a
    request's line, headers and body must arrive within it; 408 or a close otherwise).
    """

    def __init__(
        self,
        sink: SpanSink,
        counters: IngestCounters,
        host: str = "127.0.0.1",
        port: int = 4318,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_decompressed_bytes: int = 64 * 1024 * 1024,
        retry_after_s: int = 1,
        limits: DecodeLimits | None = None,
        max_spans_per_request: int = DEFAULT_MAX_SPANS,
        max_request_elements: int = DEFAULT_MAX_ELEMENTS,
        max_concurrent_decodes: int = DEFAULT_MAX_CONCURRENT_DECODES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_deadline_s: float = 60.0,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"HttpReceiver port must be in 0..65535, got {port}")
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.request_deadline_s = request_deadline_s
        self.endpoint = OtlpEndpoint(
            sink, counters, max_body_bytes, max_decompressed_bytes, retry_after_s, limits,
            max_spans_per_request, max_request_elements, max_concurrent_decodes,
        )
        self._server: HardenedHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.bound_port: int | None = None

    def start(self) -> int:
        """Bind and serve in a background thread; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("HttpReceiver.start() called twice; call stop() first")
        handler = type("OtlpHandler", (_Handler,), {
            "endpoint": self.endpoint, "request_deadline_s": self.request_deadline_s})
        try:
            server = HardenedHTTPServer((self.host, self.port), handler,
                                        max_connections=self.max_connections)
        except OSError as exc:
            raise OSError(
                f"OTLP/HTTP receiver cannot bind {self.host}:{self.port}: {exc}; "
                "choose another port with --otlp-http HOST:PORT"
            ) from exc
        server.daemon_threads = True
        self._server = server
        self.bound_port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, name="otlp-http", kwargs={"poll_interval": 0.1}
        )
        self._thread.daemon = True
        self._thread.start()
        logger.info("OTLP/HTTP receiver listening on %s:%d", self.host, self.bound_port)
        return self.bound_port

    def begin_stop(self) -> None:
        """The first step of a graceful stop, before the sink stops accepting: every later
        request is answered 503 (``Retry-After: 1``, ``Connection: close``) without being
        decoded or offered, idle keep-alive connections are closed, requests under way
        finish (:meth:`HardenedHTTPServer.begin_stop`). :meth:`stop` calls it too."""
        if self._server is not None:
            self._server.begin_stop()

    def stop(self) -> None:
        """Refuse new requests (:meth:`begin_stop`), stop accepting connections, and close
        the socket once the requests under way finished (at most 5 s)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.begin_stop()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HttpReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
