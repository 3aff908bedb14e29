"""What both OTLP receivers do with a decoded logs request: count it, hand its evaluation
records to the span sink, and answer ``ExportLogsServiceResponse``.

Counters (:class:`~assaywatch.monitor.receivers.spans.IngestCounters`):

* ``logs_received[(receiver, "gen_ai.evaluation.result")]`` - evaluation records the sink
  accepted; ``logs_received[(receiver, "other")]`` - other log records, answered with
  success and discarded (counted once the request is accepted);
* ``logs_rejected[(receiver, reason)]`` - evaluation records refused by the decoder
  (``missing_trace_id``, ``evaluation_without_score``, ...), and ``pipeline_full`` when
  the sink refused them (the receiver then answers 503 / UNAVAILABLE with a retry hint);
* ``dropped`` and ``sanitised`` exactly as for spans (values cut or repaired).
"""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from assaywatch.monitor.receivers.otlp.decode import DecodeError
from assaywatch.monitor.receivers.otlp.decode_logs import LogsDecodeResult
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    LOG_EVENT_OTHER,
    IngestCounters,
    SpanSink,
    sink_capacity,
    sink_refusal_reason,
)

__all__ = ["PIPELINE_FULL", "check_capacity", "deliver_logs", "logs_response"]

#: ``logs_rejected`` reason when the sink refused a request's evaluation records.
PIPELINE_FULL = "pipeline_full"


def check_capacity(result: LogsDecodeResult, sink: SpanSink) -> None:
    """Refuse a request with more evaluation records than the sink can ever hold.

    The request cap (``max_spans_per_request``) bounds all of a request's log records
    before decoding; the sink's ``capacity_spans`` bounds only the evaluation records,
    the only ones it is offered, so a big batch of application logs is never refused
    for the pipeline's queue size.

    Raises
    ------
    DecodeError
        ``too_many_log_records`` with status 413 (413 / RESOURCE_EXHAUSTED, not retried).
    """
    capacity = sink_capacity(sink)
    if capacity is not None and len(result.spans) > capacity:
        raise DecodeError(
            "too_many_log_records",
            f"request holds {len(result.spans)} evaluation events, more than the "
            f"{capacity} the pipeline's queue can ever hold; send smaller batches "
            "(BatchLogRecordProcessor max_export_batch_size)",
            413,
        )


def deliver_logs(result: LogsDecodeResult, sink: SpanSink, counters: IngestCounters,
                 receiver: str) -> bool:
    """Count ``result`` and offer its evaluation records to ``sink``.

    Returns False when the sink is full (``pipeline_full`` counted per evaluation
    record): the caller answers 503 / UNAVAILABLE so the exporter retries the request.
    """
    for reason, n in result.rejected.items():
        counters.add_logs_rejected(receiver, reason, n)
    for kind, n in result.limited.items():
        counters.add_dropped(kind, n)
    for reason, n in result.sanitised.items():
        counters.add_sanitised(receiver, reason, n)
    if result.spans:
        if not sink.offer(result.spans, receiver):
            counters.add_logs_rejected(receiver, sink_refusal_reason(sink), len(result.spans))
            return False
        counters.add_logs_received(receiver, EVALUATION_EVENT, len(result.spans))
    if result.other:
        counters.add_logs_received(receiver, LOG_EVENT_OTHER, result.other)
    return True


def logs_response(rejected: int, message: str) -> ExportLogsServiceResponse:
    """``ExportLogsServiceResponse``; ``partial_success`` only when something was refused."""
    response = ExportLogsServiceResponse()
    if rejected or message:
        response.partial_success.rejected_log_records = rejected
        response.partial_success.error_message = message
    return response
