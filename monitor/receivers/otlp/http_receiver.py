"""OTLP/HTTP trace receiver: ``POST /v1/traces`` with protobuf or JSON bodies.

Two layers, so the lead can mount the endpoint on another server:

* :class:`TracesEndpoint` - transport-free logic: given method, path, headers and a body
  stream it returns an :class:`HttpAnswer` (status, headers, body). It never raises.
* :class:`HttpReceiver` - a hardened standard-library ``ThreadingHTTPServer`` around it
  (:mod:`~assaywatch.monitor.receivers.otlp.http_server`: at most 64 connections, a
  60 s deadline per request, a 128 backlog, lingering close).

Answers (shared/reference/otel-conventions.md section 7), always in the request's
content type (``application/x-protobuf`` or ``application/json``):

=====================================  ===============================================
situation                              answer
=====================================  ===============================================
all accepted / empty request           200, ``ExportTraceServiceResponse``
some spans rejected (bad ids)          200 with ``partialSuccess``
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
from collections.abc import Mapping

from assaywatch.monitor.receivers.otlp.bounds import DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_SPANS
from assaywatch.monitor.receivers.otlp.decode import (
    DecodeError,
    DecodeLimits,
    DecodeResult,
    decode_proto_request,
)
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request
from assaywatch.monitor.receivers.otlp.http_body import (
    PROTOBUF,
    BodyError,
    ByteBudget,
    ByteStream,
    HttpAnswer,
    Reservation,
    inflate,
    read_raw_body,
    response_body,
    status_body,
)
from assaywatch.monitor.receivers.otlp.http_server import (
    DEFAULT_MAX_CONNECTIONS,
    DeadlineRequestHandler,
    HardenedHTTPServer,
)
from assaywatch.monitor.receivers.spans import IngestCounters, SpanSink, sink_capacity

__all__ = ["HTTP_RECEIVER", "TRACES_PATH", "HttpAnswer", "HttpReceiver", "TracesEndpoint"]

logger = logging.getLogger(__name__)

#: ``receiver`` label of this receiver's counters.
HTTP_RECEIVER = "otlp_http"
#: The OTLP/HTTP traces path.
TRACES_PATH = "/v1/traces"
#: Other OTLP signals' paths: accepted and discarded (see ``_discard``).
OTHER_SIGNAL_PATHS = ("/v1/metrics", "/v1/logs")
_CONTENT_TYPES = {
    "application/x-protobuf": PROTOBUF,
    "application/protobuf": PROTOBUF,
    "application/json": "application/json",
}
_JSON = "application/json"
#: Default cap on bodies read, inflated and decoded at once (503 + Retry-After above it).
DEFAULT_MAX_CONCURRENT_DECODES = 2
#: How long a request waits for a decode slot before it is answered 503.
_DECODE_WAIT_S = 1.0


class TracesEndpoint:
    """Transport-independent OTLP/HTTP ``/v1/traces`` handling.

    Parameters
    ----------
    sink, counters:
        Where spans go and where received/rejected spans are counted
        (receiver label ``otlp_http``).
    max_body_bytes:
        Largest request body on the wire (default 8 MiB).
    max_decompressed_bytes:
        Largest body after gzip/deflate inflation (default 64 MiB, the OTLP
        specification's recommendation).
    retry_after_s:
        ``Retry-After`` seconds sent with 503 when the pipeline is full.
    limits:
        Per-span decode limits.
    max_spans_per_request:
        Spans one request may carry (default 100,000); more, or more than the sink's
        ``capacity_spans``, is answered 413 (never retried: it can never fit).
    max_request_elements:
        JSON values or protobuf messages one request may hold (default 1,000,000),
        counted before they are built; more is answered 413.
    max_concurrent_decodes:
        Requests read, inflated and decoded at once (default 2; decoding holds the GIL,
        so more would not be faster): each may hold up to ``max_decompressed_bytes``
        twice (the inflated body, and its copy without strings while JSON values are
        counted) plus its decoded objects. A request that waits more
        than a second for a slot is answered 503 with ``Retry-After``.
    """

    def __init__(
        self,
        sink: SpanSink,
        counters: IngestCounters,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_decompressed_bytes: int = 64 * 1024 * 1024,
        retry_after_s: int = 1,
        limits: DecodeLimits | None = None,
        max_spans_per_request: int = DEFAULT_MAX_SPANS,
        max_request_elements: int = DEFAULT_MAX_ELEMENTS,
        max_concurrent_decodes: int = DEFAULT_MAX_CONCURRENT_DECODES,
    ) -> None:
        if max_body_bytes <= 0 or max_decompressed_bytes <= 0:
            raise ValueError(
                "max_body_bytes and max_decompressed_bytes must be > 0, got "
                f"{max_body_bytes} and {max_decompressed_bytes}"
            )
        if retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0 seconds, got {retry_after_s}")
        for name, value in (("max_spans_per_request", max_spans_per_request),
                            ("max_request_elements", max_request_elements),
                            ("max_concurrent_decodes", max_concurrent_decodes)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.max_spans_per_request = max_spans_per_request
        self.max_request_elements = max_request_elements
        self.max_concurrent_decodes = max_concurrent_decodes
        self._decodes = threading.BoundedSemaphore(max_concurrent_decodes)
        #: Wire bytes of bodies being read or waiting to be decoded, at most.
        self._budget = ByteBudget(max(4 * max_body_bytes, 32 * 1024 * 1024))
        self._discard_logged = False
        self.sink = sink
        self.counters = counters
        self.max_body_bytes = max_body_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.retry_after_s = int(retry_after_s)
        self.limits = limits or DecodeLimits()

    def _reject(
        self, reason: str, status: int, ctype: str, message: str, close: bool = False
    ) -> HttpAnswer:
        self.counters.add_rejected(HTTP_RECEIVER, reason)
        body = status_body(ctype, status, message, reason)
        return HttpAnswer(status, ctype, body, close=close)

    def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: ByteStream
    ) -> HttpAnswer:
        """Answer one request. ``headers`` keys must be lower case; never raises."""
        try:
            return self._handle(method, path, headers, body)
        except Exception:
            logger.exception("OTLP/HTTP receiver failed on %s %s", method, path)
            return self._reject("internal_error", 500, _JSON, "internal error in assaywatch")

    def _handle(
        self, method: str, path: str, headers: Mapping[str, str], body: ByteStream
    ) -> HttpAnswer:
        raw_ctype = headers.get("content-type", "")
        ctype = _CONTENT_TYPES.get(raw_ctype.split(";", 1)[0].strip().lower())
        answer_type = ctype or _JSON
        route = path.split("?", 1)[0]
        if route in OTHER_SIGNAL_PATHS and method == "POST" and ctype is not None:
            return self._discard(route, headers, body, ctype)
        if route != TRACES_PATH:
            # The body is left unread on early answers, so the connection must close.
            return self._reject(
                "not_found", 404, answer_type, f"no OTLP endpoint at {path!r}", close=True
            )
        if method != "POST":
            answer = self._reject(
                "method_not_allowed",
                405,
                answer_type,
                f"{method} not allowed; use POST",
                close=True,
            )
            answer.headers["Allow"] = "POST"
            return answer
        if ctype is None:
            return self._reject(
                "unsupported_content_type",
                415,
                _JSON,
                f"unsupported Content-Type {raw_ctype!r}; "
                "send application/x-protobuf or application/json",
                close=True,
            )
        # The wire body is read first, outside the decode slots, so a client dripping it
        # slowly holds no slot; its bytes come from the receiver's budget until decoded.
        taken = Reservation(self._budget)
        try:
            try:
                raw = read_raw_body(body, headers, self.max_body_bytes, taken)
            except BodyError as err:
                if err.status == 503:
                    answer = self._busy(ctype, err.reason, err.message)
                else:
                    answer = self._reject(err.reason, err.status, ctype, err.message)
                answer.close = err.close
                return answer
            if not self._decodes.acquire(timeout=_DECODE_WAIT_S):
                return self._busy(ctype, "decoder_busy",
                                  f"assaywatch is decoding {self.max_concurrent_decodes} "
                                  f"requests already; retry after {self.retry_after_s}s")
            try:
                return self._decode(raw, headers, ctype)
            finally:
                self._decodes.release()
        finally:
            taken.release()

    def _discard(self, route: str, headers: Mapping[str, str], body: ByteStream,
                 ctype: str) -> HttpAnswer:
        """OTLP metrics and logs, which zero-code set-ups send beside traces: read (within
        the body cap) and answered with an empty success, so the SDK's exporters neither
        retry nor log errors; never counted as span rejections."""
        taken = Reservation(self._budget)
        try:
            try:
                read_raw_body(body, headers, self.max_body_bytes, taken)
            except BodyError as err:
                answer = HttpAnswer(err.status, ctype, status_body(ctype, err.status,
                                                                  err.message, err.reason))
                answer.close = True
                return answer
        finally:
            taken.release()
        if not self._discard_logged:
            self._discard_logged = True
            logger.info("OTLP %s received on %s: assaywatch reads traces only; answered "
                        "with success and discarded", route.rsplit("/", 1)[-1], route)
        return HttpAnswer(200, ctype, b"" if ctype == PROTOBUF else b"{}")

    def _decode(self, raw: bytes, headers: Mapping[str, str], ctype: str) -> HttpAnswer:
        try:
            data = inflate(raw, headers.get("content-encoding", "").strip().lower(),
                           self.max_decompressed_bytes)
        except BodyError as err:
            answer = self._reject(err.reason, err.status, ctype, err.message)
            answer.close = err.close
            return answer
        del raw
        max_spans = self.max_spans_per_request
        capacity = sink_capacity(self.sink)
        if capacity is not None and capacity < max_spans:
            max_spans = capacity
        try:
            if ctype == PROTOBUF:
                result = decode_proto_request(data, self.limits, max_spans=max_spans,
                                              max_elements=self.max_request_elements)
            else:
                result = decode_json_request(data, self.limits, max_spans=max_spans,
                                             max_values=self.max_request_elements)
        except DecodeError as err:
            return self._reject(err.reason, err.status, ctype, err.message)
        del data
        return self._deliver(result, ctype)

    def _busy(self, ctype: str, reason: str, message: str, n: int = 1) -> HttpAnswer:
        self.counters.add_rejected(HTTP_RECEIVER, reason, n)
        body = status_body(ctype, 503, message, reason, self.retry_after_s)
        answer = HttpAnswer(503, ctype, body)
        answer.headers["Retry-After"] = str(self.retry_after_s)
        return answer

    def _deliver(self, result: DecodeResult, ctype: str) -> HttpAnswer:
        for reason, n in result.rejected.items():
            self.counters.add_rejected(HTTP_RECEIVER, reason, n)
        for kind, n in result.limited.items():
            self.counters.add_dropped(kind, n)
        for reason, n in result.sanitised.items():
            self.counters.add_sanitised(HTTP_RECEIVER, reason, n)
        if result.spans:
            if not self.sink.offer(result.spans, HTTP_RECEIVER):
                n = len(result.spans)
                return self._busy(ctype, "pipeline_full",
                                  f"assaywatch pipeline is full; retry after "
                                  f"{self.retry_after_s}s ({n} spans not accepted)", n)
            self.counters.add_received(HTTP_RECEIVER, len(result.spans))
        return HttpAnswer(
            200, ctype, response_body(ctype, result.rejected_count, result.error_message)
        )


class _Handler(DeadlineRequestHandler):
    server_version = "assaywatch-otlp"
    endpoint: TracesEndpoint  # set on the per-receiver subclass

    def _serve(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        answer = self.endpoint.handle(self.command, self.path, headers, self.rfile)
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for key, value in answer.headers.items():
                self.send_header(key, value)
            if answer.close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(answer.body)
        except OSError:  # the client went away; nothing to answer
            self.close_connection = True

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)


class HttpReceiver:
    """OTLP/HTTP receiver on a ``ThreadingHTTPServer`` (one thread per connection).

    Parameters are those of :class:`TracesEndpoint`, plus ``host`` and ``port``
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
        self.endpoint = TracesEndpoint(
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
        handler = type("OtlpTracesHandler", (_Handler,), {
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

    def stop(self) -> None:
        """Stop accepting requests and close the socket."""
        server, self._server = self._server, None
        if server is None:
            return
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
