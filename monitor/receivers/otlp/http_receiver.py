"""OTLP/HTTP trace receiver: ``POST /v1/traces`` with protobuf or JSON bodies.

Two layers, so the lead can mount the endpoint on another server:

* :class:`TracesEndpoint` - transport-free logic: given method, path, headers and a body
  stream it returns an :class:`HttpAnswer` (status, headers, body). It never raises.
* :class:`HttpReceiver` - a standard-library ``ThreadingHTTPServer`` around it.

Answers (shared/reference/otel-conventions.md section 7), always in the request's
content type (``application/x-protobuf`` or ``application/json``):

=====================================  ===============================================
situation                              answer
=====================================  ===============================================
all accepted / empty request           200, ``ExportTraceServiceResponse``
some spans rejected (bad ids)          200 with ``partialSuccess``
malformed body / compression           400, ``google.rpc.Status`` + ``BadRequest``
body > ``max_body_bytes``              413 (read no further; connection closed)
inflated body > ``max_decompressed``   413 (detected while streaming the inflation)
other content type or encoding         415
other path / method                    404 / 405
pipeline full (``offer`` False)        503 + ``Retry-After`` (retried by exporters)
=====================================  ===============================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
    ByteStream,
    HttpAnswer,
    read_body,
    response_body,
    status_body,
)
from assaywatch.monitor.receivers.spans import IngestCounters, SpanSink

__all__ = ["HTTP_RECEIVER", "TRACES_PATH", "HttpAnswer", "HttpReceiver", "TracesEndpoint"]

logger = logging.getLogger(__name__)

#: ``receiver`` label of this receiver's counters.
HTTP_RECEIVER = "otlp_http"
#: The OTLP/HTTP traces path.
TRACES_PATH = "/v1/traces"
_CONTENT_TYPES = {
    "application/x-protobuf": PROTOBUF,
    "application/protobuf": PROTOBUF,
    "application/json": "application/json",
}
_JSON = "application/json"


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
    """

    def __init__(
        self,
        sink: SpanSink,
        counters: IngestCounters,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_decompressed_bytes: int = 64 * 1024 * 1024,
        retry_after_s: int = 1,
        limits: DecodeLimits | None = None,
    ) -> None:
        if max_body_bytes <= 0 or max_decompressed_bytes <= 0:
            raise ValueError(
                "max_body_bytes and max_decompressed_bytes must be > 0, got "
                f"{max_body_bytes} and {max_decompressed_bytes}"
            )
        if retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0 seconds, got {retry_after_s}")
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
        if path.split("?", 1)[0] != TRACES_PATH:
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
        try:
            data = read_body(
                body,
                headers,
                max_body_bytes=self.max_body_bytes,
                max_decompressed_bytes=self.max_decompressed_bytes,
            )
        except BodyError as err:
            answer = self._reject(err.reason, err.status, ctype, err.message)
            answer.close = err.close
            return answer
        try:
            if ctype == PROTOBUF:
                result = decode_proto_request(data, self.limits)
            else:
                result = decode_json_request(data, self.limits)
        except DecodeError as err:
            return self._reject(err.reason, 400, ctype, err.message)
        return self._deliver(result, ctype)

    def _deliver(self, result: DecodeResult, ctype: str) -> HttpAnswer:
        for reason, n in result.rejected.items():
            self.counters.add_rejected(HTTP_RECEIVER, reason, n)
        for kind, n in result.limited.items():
            self.counters.add_dropped(kind, n)
        if result.spans:
            if not self.sink.offer(result.spans, HTTP_RECEIVER):
                n = len(result.spans)
                self.counters.add_rejected(HTTP_RECEIVER, "pipeline_full", n)
                message = (
                    f"assaywatch pipeline is full; retry after {self.retry_after_s}s "
                    f"({n} spans not accepted)"
                )
                body = status_body(ctype, 503, message, "pipeline_full", self.retry_after_s)
                answer = HttpAnswer(503, ctype, body)
                answer.headers["Retry-After"] = str(self.retry_after_s)
                return answer
            self.counters.add_received(HTTP_RECEIVER, len(result.spans))
        return HttpAnswer(
            200, ctype, response_body(ctype, result.rejected_count, result.error_message)
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "assaywatch-otlp"
    #: Socket timeout: a client that stalls mid-request is dropped (slowloris guard).
    timeout = 30.0
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
    (0 picks a free port, returned by :meth:`start`).
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
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"HttpReceiver port must be in 0..65535, got {port}")
        self.host = host
        self.port = port
        self.endpoint = TracesEndpoint(
            sink, counters, max_body_bytes, max_decompressed_bytes, retry_after_s, limits
        )
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.bound_port: int | None = None

    def start(self) -> int:
        """Bind and serve in a background thread; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("HttpReceiver.start() called twice; call stop() first")
        handler = type("OtlpTracesHandler", (_Handler,), {"endpoint": self.endpoint})
        try:
            server = ThreadingHTTPServer((self.host, self.port), handler)
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
