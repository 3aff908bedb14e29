"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` and
``opentelemetry.proto.collector.logs.v1.LogsService/Export`` on one server.

Logs carry the GenAI evaluation events (``gen_ai.evaluation.result``): their evaluation
records go to the same sink as spans; other log records are answered OK and discarded
(:mod:`~assaywatch.monitor.receivers.otlp.decode_logs`,
:mod:`~assaywatch.monitor.receivers.otlp.logs_delivery`). A logs request gets the answers
of the table below with ``ExportLogsServiceResponse`` and
``partial_success{rejected_log_records, error_message}``, and is counted in the
``logs_received`` / ``logs_rejected`` counters instead of the span ones.

Answers follow the OTLP specification (shared/reference/otel-conventions.md section 7):

==============================  ===================================================
situation                       answer
==============================  ===================================================
all spans accepted              OK, empty ``ExportTraceServiceResponse``
some spans rejected (bad ids)   OK with ``partial_success{rejected_spans, error_message}``
undecodable request             ``INVALID_ARGUMENT`` (not retried by clients)
message over the size cap       ``RESOURCE_EXHAUSTED``, no RetryInfo (counted as
                                ``message_too_large`` up to twice the cap; above
                                that grpc refuses it before any handler runs)
too many spans or messages      ``RESOURCE_EXHAUSTED``, no RetryInfo
                                (``max_spans_per_request``, the sink's capacity,
                                ``max_request_elements``)
more than ``max_concurrent_rpcs``  ``UNAVAILABLE`` + ``google.rpc.RetryInfo``,
in progress or waiting          undecoded, counted as ``decoder_busy`` (one per request)
more than ``max_queued_rpcs``   ``RESOURCE_EXHAUSTED`` from grpc itself, counted as
                                ``too_many_calls`` (a flood: see the admission
                                proxy, monitor/README.md)
pipeline full (offer False)     ``UNAVAILABLE`` + ``google.rpc.RetryInfo`` (retried)
==============================  ===================================================

**Calls beyond the cap.** Which answer a call gets is decided when it arrives (a server
interceptor, on grpc's polling thread): with ``max_concurrent_rpcs`` calls already in
progress or waiting for a worker (counted by the worker pool itself, so a call cancelled
while it waits is still counted out), the call is answered ``UNAVAILABLE`` with the retry
hint when a worker reaches it, its message received and dropped undecoded; grpc's own
limit, which answers RESOURCE_EXHAUSTED (not retried by the OTLP specification), is set
far above, at ``max_queued_rpcs``. A waiting call holds little memory: the server's
HTTP/2 flow control lets a client send at most :data:`STREAM_WINDOW_BYTES` of a message
ahead of its worker (bandwidth-delay probing, which grows that window to the message size,
is off): 200 calls waiting with 4 MiB messages took 110 MiB, 810 MiB with probing on.
The window holds a typical exporter batch (~0.5 MiB) whole: at 64 KiB, gRPC calls through
the admission proxy, which multiplexes them on its HTTP/2 connections to the monitor,
starved (3-22 served in the overload test's minute instead of ~4,000). A larger message
takes a round trip per 512 KiB.

RESOURCE_EXHAUSTED without RetryInfo is not retryable by the OTLP specification (the
Python exporter retries it anyway, with backoff).

The retry hint is sent twice in the trailing metadata: as ``google.rpc.retryinfo-bin``
(a serialized ``RetryInfo``; the key the Python OTLP exporter reads) and inside a
``google.rpc.Status`` under ``grpc-status-details-bin`` (the gRPC rich error model that
the Go Collector exporter reads). gzip request compression is handled by grpc itself.

The request is registered with a raw-bytes deserializer and decoded by
:func:`~assaywatch.monitor.receivers.otlp.decode.decode_proto_request`, so a malformed message gets
INVALID_ARGUMENT with a reason rather than grpc's generic deserialization failure.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from assaywatch.monitor.receivers.otlp.bounds import DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_SPANS
from assaywatch.monitor.receivers.otlp.decode import DecodeError, DecodeLimits, decode_proto_request
from assaywatch.monitor.receivers.otlp.decode_logs import decode_proto_logs
from assaywatch.monitor.receivers.otlp.logs_delivery import (
    check_capacity,
    deliver_logs,
    logs_response,
)
from assaywatch.monitor.receivers.spans import (
    PIPELINE_FULL_UNREAD,
    IngestCounters,
    SpanSink,
    sink_accepting,
    sink_capacity,
    sink_refusal_reason,
)

__all__ = ["GRPC_RECEIVER", "GrpcReceiver", "LOGS_SERVICE_NAME", "SERVICE_NAME"]

logger = logging.getLogger(__name__)

#: ``receiver`` label of this receiver's counters.
GRPC_RECEIVER = "otlp_grpc"
#: Fully-qualified gRPC service name of the OTLP trace service.
SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"
#: Fully-qualified gRPC service name of the OTLP logs service.
LOGS_SERVICE_NAME = "opentelemetry.proto.collector.logs.v1.LogsService"
TRACE_METHOD = f"/{SERVICE_NAME}/Export"
LOGS_METHOD = f"/{LOGS_SERVICE_NAME}/Export"
_R = TypeVar("_R")
#: gRPC's limit on sent messages; OTLP asks responses to stay below 4 MiB.
_MAX_SEND_BYTES = 4 * 1024 * 1024
#: Default cap on calls in progress or waiting for a worker; more are answered UNAVAILABLE
#: with the retry hint (``decoder_busy``).
DEFAULT_MAX_CONCURRENT_RPCS = 16
#: Default of grpc's own limit (``maximum_concurrent_rpcs``), above which grpc answers
#: RESOURCE_EXHAUSTED before any code of ours runs.
DEFAULT_MAX_QUEUED_RPCS = 256
#: Bytes of a message a client may send ahead of the worker that reads it (HTTP/2 stream
#: window, ``grpc.http2.lookahead_bytes``): about what a waiting call holds at most.
STREAM_WINDOW_BYTES = 512 * 1024
#: Counter reason of a call refused for the cap (the same as OTLP/HTTP's).
DECODER_BUSY = "decoder_busy"
#: Counter reason of a call grpc refused past ``max_queued_rpcs`` (RESOURCE_EXHAUSTED).
TOO_MANY_CALLS = "too_many_calls"


def _retry_metadata(delay_s: float, message: str) -> tuple[tuple[str, bytes], ...]:
    seconds = int(delay_s)
    retry = error_details_pb2.RetryInfo(
        retry_delay=Duration(seconds=seconds, nanos=int(round((delay_s - seconds) * 1e9)))
    )
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message)
    status.details.add().Pack(retry)
    return (
        ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )


class _CountingPool(ThreadPoolExecutor):
    """The server's worker pool, counting the calls grpc handed it that have not finished:
    in progress or waiting for a worker. Every task grpc submits runs to its end, a call
    cancelled while it waited included (grpc's task then skips the handler), so the count
    never leaks."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._count_lock = threading.Lock()
        self.pending = 0

    def submit(self, fn: Callable[..., _R], /, *args: Any, **kwargs: Any,
               ) -> Future[_R]:
        with self._count_lock:
            self.pending += 1

        def task() -> _R:
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self.pending -= 1

        try:
            return super().submit(task)
        except BaseException:  # shut down: the task will never run
            with self._count_lock:
                self.pending -= 1
            raise


class _Admission(grpc.ServerInterceptor):  # type: ignore[misc]
    """Decides, as a call arrives, whether it is served or told to retry (module doc), and
    counts the calls grpc itself refuses past ``limit``: grpc checks its own count of calls
    just before this runs, and the pool's count is never above it (a task leaves the pool
    just before grpc counts its call out), so every call counted here is one grpc refuses;
    one arriving in the microseconds between the two can be refused uncounted."""

    def __init__(self, pool: _CountingPool, cap: int, limit: int, busy: dict[str, Any],
                 count_refused: dict[str, Callable[[], None]]) -> None:
        self.pool = pool
        self.cap = cap
        self.limit = limit
        self.busy = busy
        self.count_refused = count_refused

    def intercept_service(self, continuation: Callable[[Any], Any],
                          details: Any) -> Any:
        pending = self.pool.pending
        if pending >= self.cap:
            handler = self.busy.get(details.method)
            if handler is not None:
                if pending >= self.limit:
                    self.count_refused[details.method]()  # grpc answers it, not us
                return handler
        return continuation(details)


class GrpcReceiver:
    """OTLP/gRPC receiver delivering decoded spans (and the evaluation records of OTLP
    logs) to a :class:`SpanSink`.

    Parameters
    ----------
    sink:
        Receives each trace request's valid spans and each logs request's evaluation
        records (``offer(records, "otlp_grpc")``).
    counters:
        ``received["otlp_grpc"]`` and ``rejected[("otlp_grpc", reason)]`` are counted here
        for spans; ``logs_received[("otlp_grpc", event)]`` and
        ``logs_rejected[("otlp_grpc", reason)]`` for log records.
    host, port:
        Bind address; port 0 picks a free port (returned by :meth:`start`).
    max_message_bytes:
        Largest accepted request message (grpc ``max_receive_message_length``); larger
        requests get RESOURCE_EXHAUSTED. Default 8 MiB.
    max_workers:
        Threads serving requests concurrently.
    retry_delay_s:
        Retry delay advertised in ``RetryInfo`` when the pipeline is full.
    limits:
        Per-span decode limits (attribute value size, attribute and event counts).
    max_spans_per_request, max_request_elements:
        Spans (log records, for logs) and protobuf messages one request may carry
        (defaults 100,000 and 1,000,000; the messages are counted on the wire before upb
        builds them); more, or more spans (evaluation records) than the sink's
        ``capacity_spans``, is RESOURCE_EXHAUSTED.
    max_concurrent_rpcs:
        Calls in progress or waiting for a worker (default 16); a call arriving beyond
        them is answered UNAVAILABLE with the retry hint, undecoded (``decoder_busy``).
        Workers read at most ``max_workers`` messages at once, each under grpc's receive
        limit of twice ``max_message_bytes``.
    max_queued_rpcs:
        grpc's own limit on calls (default 256), above which it answers
        RESOURCE_EXHAUSTED itself; each waiting call holds at most
        :data:`STREAM_WINDOW_BYTES` of its message.
    """

    def __init__(
        self,
        sink: SpanSink,
        counters: IngestCounters,
        host: str = "127.0.0.1",
        port: int = 4317,
        max_message_bytes: int = 8 * 1024 * 1024,
        max_workers: int = 4,
        retry_delay_s: float = 1.0,
        limits: DecodeLimits | None = None,
        max_spans_per_request: int = DEFAULT_MAX_SPANS,
        max_request_elements: int = DEFAULT_MAX_ELEMENTS,
        max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS,
        max_queued_rpcs: int = DEFAULT_MAX_QUEUED_RPCS,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"GrpcReceiver port must be in 0..65535, got {port}")
        if max_message_bytes <= 0:
            raise ValueError(f"GrpcReceiver max_message_bytes must be > 0, got {max_message_bytes}")
        if max_workers < 1:
            raise ValueError(f"GrpcReceiver max_workers must be >= 1, got {max_workers}")
        if retry_delay_s < 0:
            raise ValueError(f"GrpcReceiver retry_delay_s must be >= 0, got {retry_delay_s}")
        for name, value in (("max_spans_per_request", max_spans_per_request),
                            ("max_request_elements", max_request_elements),
                            ("max_concurrent_rpcs", max_concurrent_rpcs)):
            if value < 1:
                raise ValueError(f"GrpcReceiver {name} must be >= 1, got {value}")
        if max_queued_rpcs < max_concurrent_rpcs:
            raise ValueError(f"GrpcReceiver max_queued_rpcs ({max_queued_rpcs}) must be >= "
                             f"max_concurrent_rpcs ({max_concurrent_rpcs})")
        self.max_queued_rpcs = max_queued_rpcs
        self.max_spans_per_request = max_spans_per_request
        self.max_request_elements = max_request_elements
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.sink = sink
        self.counters = counters
        self.host = host
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.max_workers = max_workers
        self.retry_delay_s = retry_delay_s
        self.limits = limits or DecodeLimits()
        self._server: grpc.Server | None = None
        self.bound_port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("GrpcReceiver.start() called twice; call stop() first")
        pool = _CountingPool(self.max_workers, "otlp-grpc")
        # per method: how its refusals are counted, and its response type
        methods: dict[str, tuple[Callable[..., None], Any]] = {
            TRACE_METHOD: (self.counters.add_rejected, ExportTraceServiceResponse),
            LOGS_METHOD: (self.counters.add_logs_rejected, ExportLogsServiceResponse),
        }
        busy = {method: grpc.unary_unary_rpc_method_handler(
                    functools.partial(self._busy, count), request_deserializer=None,
                    response_serializer=response.SerializeToString)
                for method, (count, response) in methods.items()}
        refused = {method: functools.partial(count, GRPC_RECEIVER, TOO_MANY_CALLS, 1)
                   for method, (count, _) in methods.items()}
        server = grpc.server(
            pool,
            interceptors=[_Admission(pool, self.max_concurrent_rpcs, self.max_queued_rpcs,
                                     busy, refused)],
            maximum_concurrent_rpcs=self.max_queued_rpcs,
            options=[
                # A waiting call's message stays with its client beyond the stream
                # window (module doc): no bandwidth-delay probing to grow it.
                ("grpc.http2.bdp_probe", 0),
                ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
                # Twice the cap: messages between the two reach _handle, which refuses
                # and counts them; grpc refuses larger ones itself, uncounted.
                ("grpc.max_receive_message_length", min(2 * self.max_message_bytes, 2**31 - 1)),
                ("grpc.max_send_message_length", _MAX_SEND_BYTES),
                # gRPC binds with SO_REUSEPORT by default: a second process on the same
                # port would start silently and take part of the traffic. Refuse instead.
                ("grpc.so_reuseport", 0),
            ],
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export,
                    request_deserializer=None,  # raw bytes: we decode, and report why not
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )
        logs_handler = grpc.method_handlers_generic_handler(
            LOGS_SERVICE_NAME,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export_logs,
                    request_deserializer=None,
                    response_serializer=ExportLogsServiceResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler, logs_handler))
        address = f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"OTLP/gRPC receiver cannot bind {address} (in use?): {exc}; "
                          "choose another port with --otlp-grpc HOST:PORT") from exc
        if port == 0:
            raise OSError(
                f"OTLP/gRPC receiver cannot bind {address} (in use?); "
                "choose another port with --otlp-grpc HOST:PORT"
            )
        server.start()
        self._server = server
        self.bound_port = int(port)
        logger.info("OTLP/gRPC receiver listening on %s:%d", self.host, port)
        return int(port)

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; in-flight requests get ``grace`` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def __enter__(self) -> GrpcReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the rpc

    def _busy(self, count: Callable[[str, str, int], None], data: bytes,
              context: Any) -> NoReturn:
        """A call (trace or logs: ``count`` is its refusal counter) that arrived beyond
        ``max_concurrent_rpcs``: retry later, its message undecoded."""
        del data
        count(GRPC_RECEIVER, DECODER_BUSY, 1)
        self._retry_later(context, f"assaywatch has {self.max_concurrent_rpcs} calls in "
                                   f"progress or waiting; retry in {self.retry_delay_s:g}s")

    def _export(self, data: bytes, context: Any) -> ExportTraceServiceResponse:
        return self._guarded(self._handle, data, context, self.counters.add_rejected)

    def _export_logs(self, data: bytes, context: Any) -> ExportLogsServiceResponse:
        return self._guarded(self._handle_logs, data, context, self.counters.add_logs_rejected)

    def _guarded(self, handle: Callable[[bytes, Any], _R], data: bytes, context: Any,
                 count: Callable[[str, str], None]) -> _R:
        try:
            return handle(data, context)
        except grpc.RpcError:
            raise
        except Exception:  # never let a bug take the server thread down silently
            if context.code() is not None:  # abort() already chose the answer
                raise
            logger.exception("OTLP/gRPC receiver failed on a %d-byte request", len(data))
            count(GRPC_RECEIVER, "internal_error")
            context.abort(grpc.StatusCode.INTERNAL, "internal error in the assaywatch receiver")
            raise  # unreachable: abort raises

    def _max_spans(self) -> int:
        """Spans one request may carry: the cap, or the sink's capacity when smaller."""
        capacity = sink_capacity(self.sink)
        if capacity is not None and capacity < self.max_spans_per_request:
            return capacity
        return self.max_spans_per_request

    def _check_size(self, data: bytes, context: Any, reject: Callable[[str, str], None]
                    ) -> None:
        """RESOURCE_EXHAUSTED (counted by ``reject``) for a message over the size cap."""
        if len(data) > self.max_message_bytes:
            reject(GRPC_RECEIVER, "message_too_large")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"request of {len(data)} bytes exceeds the "
                          f"{self.max_message_bytes}-byte limit; send smaller batches")

    def _refuse_undecodable(self, err: DecodeError, context: Any,
                            reject: Callable[[str, str], None]) -> NoReturn:
        """Count the refusal with ``reject`` and answer RESOURCE_EXHAUSTED for what is too
        large (413), INVALID_ARGUMENT otherwise."""
        reject(GRPC_RECEIVER, err.reason)
        code = (grpc.StatusCode.RESOURCE_EXHAUSTED if err.status == 413
                else grpc.StatusCode.INVALID_ARGUMENT)
        context.abort(code, err.message)
        raise err  # unreachable: abort raises

    def _refuse_full(self, context: Any, n: int, what: str) -> None:
        self._retry_later(context, f"assaywatch pipeline is full; retry in "
                                   f"{self.retry_delay_s:g}s ({n} {what} not accepted)")

    def _retry_later(self, context: Any, message: str) -> NoReturn:
        """UNAVAILABLE with the retry hint in the trailers (the module docstring)."""
        context.set_trailing_metadata(_retry_metadata(self.retry_delay_s, message))
        context.abort(grpc.StatusCode.UNAVAILABLE, message)
        raise AssertionError("unreachable: abort raises")

    def _handle_logs(self, data: bytes, context: Any) -> ExportLogsServiceResponse:
        """LogsService/Export: evaluation records to the sink, other records counted."""
        self._check_size(data, context, self.counters.add_logs_rejected)
        if not sink_accepting(self.sink):  # known full: refuse before decoding
            self.counters.add_logs_rejected(GRPC_RECEIVER, PIPELINE_FULL_UNREAD, 1)
            self._refuse_full(context, 1, "request")
        try:
            result = decode_proto_logs(data, self.limits,
                                       max_records=self.max_spans_per_request,
                                       max_elements=self.max_request_elements)
            check_capacity(result, self.sink)
        except DecodeError as err:
            self._refuse_undecodable(err, context, self.counters.add_logs_rejected)
        del data
        if not deliver_logs(result, self.sink, self.counters, GRPC_RECEIVER):
            self._refuse_full(context, len(result.spans), "evaluation records")
        return logs_response(result.rejected_count, result.error_message)

    def _handle(self, data: bytes, context: Any) -> ExportTraceServiceResponse:
        self._check_size(data, context, self.counters.add_rejected)
        if not sink_accepting(self.sink):  # known full: refuse before decoding
            self.counters.add_rejected(GRPC_RECEIVER, PIPELINE_FULL_UNREAD, 1)
            self._refuse_full(context, 1, "request")
        try:
            result = decode_proto_request(data, self.limits, max_spans=self._max_spans(),
                                          max_elements=self.max_request_elements)
        except DecodeError as err:
            self._refuse_undecodable(err, context, self.counters.add_rejected)
        del data
        for reason, n in result.rejected.items():
            self.counters.add_rejected(GRPC_RECEIVER, reason, n)
        for kind, n in result.limited.items():
            self.counters.add_dropped(kind, n)
        for reason, n in result.sanitised.items():
            self.counters.add_sanitised(GRPC_RECEIVER, reason, n)
        if result.spans:
            accepted = self.sink.offer(result.spans, GRPC_RECEIVER)
            if not accepted:
                self.counters.add_rejected(GRPC_RECEIVER, sink_refusal_reason(self.sink),
                                           len(result.spans))
                self._refuse_full(context, len(result.spans), "spans")
            self.counters.add_received(GRPC_RECEIVER, len(result.spans))
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.rejected_spans = result.rejected_count
            response.partial_success.error_message = result.error_message
        return response
