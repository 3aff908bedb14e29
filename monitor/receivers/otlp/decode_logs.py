"""OTLP logs requests (protobuf bytes or OTLP/JSON) to evaluation records.

The monitor reads one kind of log record: the GenAI evaluation event
``gen_ai.evaluation.result`` (its ``event_name``, LogRecord field 12, or, from older
SDKs, its attribute ``event.name``). Each becomes a
:func:`~assaywatch.monitor.receivers.spans.evaluation_record` (``kind ==
KIND_EVALUATION``) that the receivers hand to the same sink as spans. Every other log
record is accepted and discarded, only counted (:attr:`LogsDecodeResult.other`).

An evaluation record is

* **rejected** (partial success, counted by reason) when its trace id is missing
  (``missing_trace_id``), not 16 bytes or all zeros (``invalid_trace_id``), its span id
  is present but not 8 bytes long (``invalid_span_id``), or it carries no
  outcome: no ``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label`` nor
  ``assaywatch.evaluation.passed`` (``evaluation_without_score``). OTLP/JSON adds
  ``invalid_timestamp``, ``invalid_attribute`` and ``malformed_*`` as for spans;
* **kept without a span id** ("") when it has none (or all zeros): it joins its run by
  trace;
* **reduced** to :data:`~assaywatch.monitor.receivers.spans.EVALUATION_KEYS`: the body
  and ``gen_ai.evaluation.explanation`` (content) are never read into a record, and in
  protobuf no attribute outside those keys is converted at all.

The OTLP/JSON walker is :mod:`~assaywatch.monitor.receivers.otlp.decode_logs_json`
(``decode_json_logs``), which imports this module.

The request-level rules are the traces' (:mod:`~assaywatch.monitor.receivers.otlp.decode`,
:mod:`~assaywatch.monitor.receivers.otlp.bounds`): an undecodable body is a
:class:`~assaywatch.monitor.receivers.otlp.decode.DecodeError` (400 / INVALID_ARGUMENT);
more log records than ``max_records`` (``too_many_log_records``) or more messages / JSON
values than the element cap, counted before anything is built, is a DecodeError with
status 413; names and label values are capped, strings made valid UTF-8, and value sizes
and attribute counts bounded by :class:`DecodeLimits`. A time outside 2000-01-01 .. one
day ahead is kept and counted (``time_out_of_range``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from assaywatch.monitor.receivers.otlp.bounds import (
    FUTURE_SLACK_NS,
    MAX_NAME_CHARS,
    MIN_TIME_NS,
    PROTO_WALK_MIN_BYTES,
    SAN_TIME_OUT_OF_RANGE,
    WireError,
    cap_name,
    proto_logs_element_count,
)
from assaywatch.monitor.receivers.otlp.decode import (
    DEFAULT_LIMITS,
    DecodeError,
    DecodeLimits,
    DecodeResult,
    _proto_attrs,
)
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    EVALUATION_KEYS,
    EVALUATION_OUTCOME_KEYS,
    AttrValue,
    SpanRecord,
    evaluation_record,
)

__all__ = [
    "REJECT_WITHOUT_SCORE",
    "LogsDecodeResult",
    "attr_limits",
    "check_log_ids",
    "check_log_time",
    "decode_proto_logs",
    "has_outcome",
    "logs_from_request",
    "too_many_records",
]

#: ``rejected`` reason of an evaluation without score value, label or pass flag.
REJECT_WITHOUT_SCORE = "evaluation_without_score"
#: The attribute older SDKs name an event with (before LogRecord.event_name).
_EVENT_NAME_ATTR = "event.name"


@dataclass(slots=True)
class LogsDecodeResult(DecodeResult):
    """A logs request decoded: evaluation records plus what was discarded or refused.

    Attributes
    ----------
    spans:
        The evaluation records (``kind == KIND_EVALUATION``), in request order; also
        :attr:`records`.
    other:
        Log records that are not evaluation events: accepted (the answer is a success)
        and discarded.
    rejected:
        Evaluation records (or malformed log containers) refused, by reason; their total
        is the answer's ``partial_success.rejected_log_records``.
    limited, sanitised:
        As for spans (:class:`~assaywatch.monitor.receivers.otlp.decode.DecodeResult`).
    """

    other: int = 0

    @property
    def records(self) -> list[SpanRecord]:
        return self.spans

    @property
    def error_message(self) -> str:
        """Partial-success message, e.g. ``"rejected 2 log record(s): missing_trace_id=2"``."""
        if not self.rejected:
            return ""
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items()))
        return f"rejected {self.rejected_count} log record(s): {parts}"

    def merge(self, other: DecodeResult) -> None:
        DecodeResult.merge(self, other)
        if isinstance(other, LogsDecodeResult):
            self.other += other.other


@functools.lru_cache(maxsize=16)
def attr_limits(lim: DecodeLimits) -> DecodeLimits:
    """``lim`` reading only the evaluation keys of a log record (whatever the monitor's
    ``keep_keys`` for spans)."""
    return dataclasses.replace(lim, keep_keys=EVALUATION_KEYS, keep_prefixes=())


def check_log_ids(trace_id: bytes, span_id: bytes) -> str | None:
    """Reason to reject an evaluation for its ids, or None (an absent span id is fine)."""
    if not trace_id:
        return "missing_trace_id"
    if len(trace_id) != 16 or not any(trace_id):
        return "invalid_trace_id"
    if span_id and len(span_id) != 8:
        return "invalid_span_id"
    return None


def has_outcome(attributes: dict[str, AttrValue]) -> bool:
    for key in EVALUATION_OUTCOME_KEYS:
        value = attributes.get(key)
        if value is not None and value != "":
            return True
    return False


def check_log_time(t: int, max_ns: int, sanitised: Counter[str]) -> None:
    if t and not MIN_TIME_NS <= t <= max_ns:
        sanitised[SAN_TIME_OUT_OF_RANGE] += 1


def too_many_records(n: int, max_records: int, exact: bool = True) -> DecodeError:
    held = f"{n} log records" if exact else f"more than {max_records} log records"
    return DecodeError(
        "too_many_log_records",
        f"request holds {held}, more than the {max_records} one request may carry (or the "
        "pipeline's queue can ever hold); send smaller batches (BatchLogRecordProcessor "
        "max_export_batch_size)",
        413,
    )


# --------------------------------------------------------------------------- protobuf


def decode_proto_logs(
    data: bytes | bytearray,
    limits: DecodeLimits | None = None,
    *,
    max_records: int | None = None,
    max_elements: int | None = None,
) -> LogsDecodeResult:
    """Decode a serialized ``ExportLogsServiceRequest`` (or ``LogsData``).

    ``max_records`` caps the request's log records (all of them, evaluations or not) and
    ``max_elements`` its protobuf messages (None: unbounded, as the file readers use it).

    Raises
    ------
    DecodeError
        ``malformed_protobuf`` for bytes that are not a valid message;
        ``too_many_elements`` or ``too_many_log_records`` (status 413) past the caps.
    """
    what = f"request body is not a valid ExportLogsServiceRequest ({len(data)} bytes)"
    if max_elements is not None and len(data) >= PROTO_WALK_MIN_BYTES:
        try:
            n, n_records = proto_logs_element_count(data, max_elements, max_records)
        except WireError as exc:
            raise DecodeError("malformed_protobuf", f"{what}: {exc}") from None
        if n > max_elements:
            raise DecodeError(
                "too_many_elements",
                f"request holds more than {max_elements} messages (log records, "
                "attributes, bodies, ...); send smaller batches",
                413,
            )
        if max_records is not None and n_records > max_records:
            raise too_many_records(n_records, max_records, exact=False)
    req = ExportLogsServiceRequest()
    try:
        req.ParseFromString(data)
    except (_ProtoDecodeError, ValueError, TypeError) as exc:
        raise DecodeError("malformed_protobuf", f"{what}: {exc}") from None
    if max_records is not None:
        n = sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)
        if n > max_records:
            raise too_many_records(n, max_records)
    return logs_from_request(req, limits)


def _proto_event(lr: Any) -> str:
    event: str = lr.event_name
    if event:
        return event
    for kv in lr.attributes:  # keys only: nothing else of an unneeded record is built
        if kv.key == _EVENT_NAME_ATTR:
            return str(kv.value.string_value)
    return ""


def logs_from_request(
    req: ExportLogsServiceRequest, limits: DecodeLimits | None = None
) -> LogsDecodeResult:
    """Walk an already-parsed ``ExportLogsServiceRequest`` into evaluation records.

    Resource attributes follow ``limits`` (``keep_keys`` included) and are decoded only
    for a ``ResourceLogs`` that holds an evaluation; log-record attributes are read for
    :data:`~assaywatch.monitor.receivers.spans.EVALUATION_KEYS` only.
    """
    lim = limits or DEFAULT_LIMITS
    read = attr_limits(lim)
    result = LogsDecodeResult()
    out, rejected, limited, sanitised = (result.spans, result.rejected, result.limited,
                                         result.sanitised)
    max_ns = time.time_ns() + FUTURE_SLACK_NS
    for rl in req.resource_logs:
        resource: dict[str, AttrValue] | None = None
        for sl in rl.scope_logs:
            scope_name: str | None = None
            for lr in sl.log_records:
                if _proto_event(lr) != EVALUATION_EVENT:
                    result.other += 1
                    continue
                trace_id = lr.trace_id
                span_id = lr.span_id
                bad = check_log_ids(trace_id, span_id)
                if bad is not None:
                    rejected[bad] += 1
                    continue
                attributes = _proto_attrs(lr.attributes, read, limited, sanitised)
                if not has_outcome(attributes):
                    rejected[REJECT_WITHOUT_SCORE] += 1
                    continue
                if resource is None:
                    resource = _proto_attrs(rl.resource.attributes, lim, limited, sanitised)
                if scope_name is None:
                    scope_name = sl.scope.name
                    if len(scope_name) > MAX_NAME_CHARS:
                        scope_name = cap_name(scope_name, sanitised)
                t = lr.time_unix_nano or lr.observed_time_unix_nano
                check_log_time(t, max_ns, sanitised)
                out.append(evaluation_record(
                    trace_id.hex(), span_id.hex() if any(span_id) else "", t,
                    attributes, resource, scope_name))
    return result
