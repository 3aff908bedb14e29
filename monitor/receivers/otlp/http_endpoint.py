"""Transport-free OTLP/HTTP handling behind ``HttpReceiver``: ``POST /v1/traces`` (spans)
and ``POST /v1/logs`` (the ``gen_ai.evaluation.result`` events, as evaluation records for
the same sink), protobuf or JSON, identity, gzip or deflate, with the answers tabled in
:mod:`~assaywatch.monitor.receivers.otlp.http_receiver`. ``/v1/metrics`` is read and
answered with an empty success (discarded).

Given method, path, headers and a body stream, :class:`OtlpEndpoint` returns an
:class:`HttpAnswer` (status, headers, body); it never raises, so another server can mount
it.
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
from assaywatch.monitor.receivers.otlp.decode_logs import decode_proto_logs
from assaywatch.monitor.receivers.otlp.decode_logs_json import decode_json_logs
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
from assaywatch.monitor.receivers.otlp.logs_delivery import (
    PIPELINE_FULL,
    check_capacity,
    deliver_logs,
)
from assaywatch.monitor.receivers.spans import (
    PIPELINE_FULL_UNREAD,
    IngestCounters,
    SpanSink,
    sink_accepting,
    sink_capacity,
    sink_refusal_reason,
)

__all__ = [
    "DEFAULT_MAX_CONCURRENT_DECODES",
    "HTTP_RECEIVER",
    "LOGS_PATH",
    "OTHER_SIGNAL_PATHS",
    "TRACES_PATH",
    "HttpAnswer",
    "OtlpEndpoint",
    "TracesEndpoint",
]

logger = logging.getLogger(__name__)

#: ``receiver`` label of this receiver's counters.
HTTP_RECEIVER = "otlp_http"
#: The OTLP/HTTP traces path.
TRACES_PATH = "/v1/traces"
#: The OTLP/HTTP logs path (evaluation events; other log records are counted, discarded).
LOGS_PATH = "/v1/logs"
#: Other OTLP signals' paths: accepted and discarded (see ``_discard``).
OTHER_SIGNAL_PATHS = ("/v1/metrics",)
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


class OtlpEndpoint:
    """Transport-independent OTLP/HTTP ``/v1/traces`` and ``/v1/logs`` handling.

    Parameters
    ----------
    sink, counters:
        Where spans and evaluation records go, and where they are counted (receiver
        label ``otlp_http``): spans in ``received`` / ``rejected``, log records in
        ``logs_received`` / ``logs_rejected`` (every refusal of a ``/v1/logs`` request,
        from 405 to 503, is a ``logs_rejected`` reason).
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
        Spans (log records, on ``/v1/logs``) one request may carry (default 100,000);
        more, or more spans (evaluation records) than the sink's ``capacity_spans``, is
        answered 413 (never retried: it can never fit).
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

    def _count(self, reason: str, n: int, logs: bool) -> None:
        if logs:
            self.counters.add_logs_rejected(HTTP_RECEIVER, reason, n)
        else:
            self.counters.add_rejected(HTTP_RECEIVER, reason, n)

    def _reject(
        self, reason: str, status: int, ctype: str, message: str, close: bool = False,
        logs: bool = False,
    ) -> HttpAnswer:
        self._count(reason, 1, logs)
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
        if route not in (TRACES_PATH, LOGS_PATH):
            # The body is left unread on early answers, so the connection must close.
            return self._reject(
                "not_found", 404, answer_type, f"no OTLP endpoint at {path!r}", close=True
            )
        logs = route == LOGS_PATH
        if method != "POST":
            answer = self._reject(
                "method_not_allowed",
                405,
                answer_type,
                f"{method} not allowed; use POST",
                close=True,
                logs=logs,
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
                logs=logs,
            )
        if not sink_accepting(self.sink):
            return self._refuse_unread(body, headers, ctype, logs)
        # The wire body is read first, outside the decode slots, so a client dripping it
        # slowly holds no slot; its bytes come from the receiver's budget until decoded.
        taken = Reservation(self._budget)
        try:
            try:
                raw = read_raw_body(body, headers, self.max_body_bytes, taken)
            except BodyError as err:
                if err.status == 503:
                    answer = self._busy(ctype, err.reason, err.message, logs=logs)
                else:
                    answer = self._reject(err.reason, err.status, ctype, err.message,
                                          logs=logs)
                answer.close = err.close
                return answer
            if not self._decodes.acquire(timeout=_DECODE_WAIT_S):
                return self._busy(ctype, "decoder_busy",
                                  f"assaywatch is decoding {self.max_concurrent_decodes} "
                                  f"requests already; retry after {self.retry_after_s}s",
                                  logs=logs)
            if not sink_accepting(self.sink):  # filled while this one waited for a slot
                self._decodes.release()
                return self._busy(ctype, PIPELINE_FULL_UNREAD, self._full_message(),
                                  logs=logs)
            try:
                return self._decode(raw, headers, ctype, logs)
            finally:
                self._decodes.release()
        finally:
            taken.release()

    def _discard(self, route: str, headers: Mapping[str, str], body: ByteStream,
                 ctype: str) -> HttpAnswer:
        """OTLP metrics, which zero-code set-ups send beside traces: read (within the body
        cap) and answered with an empty success, so the SDK's exporters neither retry nor
        log errors; never counted as span rejections."""
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
            logger.info("OTLP %s received on %s: assaywatch reads traces and logs only; "
                        "answered with success and discarded", route.rsplit("/", 1)[-1], route)
        return HttpAnswer(200, ctype, b"" if ctype == PROTOBUF else b"{}")

    def _decode(self, raw: bytes, headers: Mapping[str, str], ctype: str,
                logs: bool) -> HttpAnswer:
        try:
            data = inflate(raw, headers.get("content-encoding", "").strip().lower(),
                           self.max_decompressed_bytes)
        except BodyError as err:
            answer = self._reject(err.reason, err.status, ctype, err.message, logs=logs)
            answer.close = err.close
            return answer
        del raw
        if logs:
            return self._decode_logs(data, ctype, self.max_spans_per_request)
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

    def _decode_logs(self, data: bytes | bytearray, ctype: str, max_records: int) -> HttpAnswer:
        try:
            if ctype == PROTOBUF:
                result = decode_proto_logs(data, self.limits, max_records=max_records,
                                           max_elements=self.max_request_elements)
            else:
                result = decode_json_logs(data, self.limits, max_records=max_records,
                                          max_values=self.max_request_elements)
            check_capacity(result, self.sink)
        except DecodeError as err:
            return self._reject(err.reason, err.status, ctype, err.message, logs=True)
        del data
        if not deliver_logs(result, self.sink, self.counters, HTTP_RECEIVER):
            return self._retry_later(ctype, PIPELINE_FULL,
                                     f"assaywatch pipeline is full; retry after "
                                     f"{self.retry_after_s}s ({len(result.spans)} evaluation "
                                     "records not accepted)")
        return HttpAnswer(200, ctype, response_body(ctype, result.rejected_count,
                                                    result.error_message, logs=True))

    def _full_message(self) -> str:
        return f"assaywatch pipeline is full; retry after {self.retry_after_s}s"

    def _refuse_unread(self, body: ByteStream, headers: Mapping[str, str], ctype: str,
                       logs: bool) -> HttpAnswer:
        """503 + ``Retry-After`` for a request that arrives while the pipeline is known
        full, without decoding it: a body of known length within the limit is read and
        dropped in small chunks (the connection is kept), any other is left unread and
        the connection closed. Counted once per request (:data:`PIPELINE_FULL_UNREAD`)."""
        answer = self._busy(ctype, PIPELINE_FULL_UNREAD, self._full_message(), logs=logs)
        length = (headers.get("content-length") or "").strip()
        if headers.get("transfer-encoding") or not length.isdigit() \
                or int(length) > self.max_body_bytes:
            answer.close = True
            return answer
        left = int(length)
        try:
            while left > 0:
                chunk = body.read(min(left, 1 << 16))
                if not chunk:
                    answer.close = True
                    break
                left -= len(chunk)
        except OSError:
            answer.close = True
        return answer

    def _busy(self, ctype: str, reason: str, message: str, n: int = 1,
              logs: bool = False) -> HttpAnswer:
        self._count(reason, n, logs)
        return self._retry_later(ctype, reason, message)

    def _retry_later(self, ctype: str, reason: str, message: str) -> HttpAnswer:
        """503 + ``Retry-After`` (not counted here)."""
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
                return self._busy(ctype, sink_refusal_reason(self.sink),
                                  f"assaywatch pipeline is full; retry after "
                                  f"{self.retry_after_s}s ({n} spans not accepted)", n)
            self.counters.add_received(HTTP_RECEIVER, len(result.spans))
        return HttpAnswer(
            200, ctype, response_body(ctype, result.rejected_count, result.error_message)
        )


#: The endpoint's former name (it served ``/v1/traces`` only).
TracesEndpoint = OtlpEndpoint
