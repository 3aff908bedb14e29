"""OTLP/JSON logs walker: ``ExportLogsServiceRequest`` / ``LogsData`` dicts straight to
evaluation records, without protobuf (whose ``json_format`` mis-decodes hex ids).

The rules are those of :mod:`~assaywatch.monitor.receivers.otlp.decode_logs` (what is an
evaluation, what is kept, rejected and counted) and of the span walker
:mod:`~assaywatch.monitor.receivers.otlp.decode_json` (hex or base64 ids, int64 as
numbers or strings, lowerCamelCase or snake_case keys, unknown keys ignored, strings made
valid UTF-8, the request's values counted before ``json.loads`` builds them).
``scopeLogs`` and the legacy ``instrumentationLibraryLogs`` both hold log records.
"""

from __future__ import annotations

import time
from typing import Any

from assaywatch.monitor.receivers.otlp.bounds import FUTURE_SLACK_NS, may_have_surrogates
from assaywatch.monitor.receivers.otlp.decode import (
    DEFAULT_LIMITS,
    LIMIT_ATTRIBUTES_DROPPED,
    DecodeError,
    DecodeLimits,
)
from assaywatch.monitor.receivers.otlp.decode_json import (
    _BadSpan,
    _Ctx,
    _get,
    _id,
    _time,
    attrs,
    parse_json,
)
from assaywatch.monitor.receivers.otlp.decode_logs import (
    REJECT_WITHOUT_SCORE,
    LogsDecodeResult,
    attr_limits,
    check_log_ids,
    check_log_time,
    has_outcome,
    too_many_records,
)
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    EVALUATION_KEYS,
    AttrValue,
    SpanRecord,
    evaluation_record,
)

__all__ = ["count_log_records", "decode_json_logs", "walk_resource_logs"]

#: The attribute older SDKs name an event with (before LogRecord.event_name).
_EVENT_NAME_ATTR = "event.name"


def _scope_logs(rl: dict[str, Any]) -> Any:
    scopes = _get(rl, "scopeLogs", "scope_logs")
    legacy = _get(rl, "instrumentationLibraryLogs", "instrumentation_library_logs")
    if legacy:
        scopes = (scopes if isinstance(scopes, list) else []) + (
            legacy if isinstance(legacy, list) else [legacy])
    return scopes


def count_log_records(resource_logs: Any) -> int:
    """Log records of a JSON ``resourceLogs`` list, counted without decoding any."""
    n = 0
    if not isinstance(resource_logs, list):
        return 0
    for rl in resource_logs:
        scopes = _scope_logs(rl) if isinstance(rl, dict) else None
        if isinstance(scopes, list):
            for sl in scopes:
                records = _get(sl, "logRecords", "log_records") if isinstance(sl, dict) else None
                if isinstance(records, list):
                    n += len(records)
    return n


def _json_is_evaluation(lr: dict[str, Any]) -> bool:
    event = _get(lr, "eventName", "event_name")
    if event:
        return bool(event == EVALUATION_EVENT)
    kvs = lr.get("attributes")
    if isinstance(kvs, list):
        for kv in kvs:
            if isinstance(kv, dict) and kv.get("key") == _EVENT_NAME_ATTR:
                value = kv.get("value")
                return isinstance(value, dict) and _get(
                    value, "stringValue", "string_value") == EVALUATION_EVENT
    return False


def _json_evaluation(lr: dict[str, Any], resource: dict[str, AttrValue], scope_name: str,
                     ctx: _Ctx) -> SpanRecord:
    trace_id = _id(_get(lr, "traceId", "trace_id"), 16, "trace_id")
    span_id = _id(_get(lr, "spanId", "span_id"), 8, "span_id")
    bad = check_log_ids(trace_id, span_id)
    if bad is not None:
        raise _BadSpan(bad)
    t = (_time(_get(lr, "timeUnixNano", "time_unix_nano"))
         or _time(_get(lr, "observedTimeUnixNano", "observed_time_unix_nano")))
    lim = ctx.lim
    kvs = lr.get("attributes")
    if isinstance(kvs, list):
        if len(kvs) > lim.max_attributes:
            ctx.limited[LIMIT_ATTRIBUTES_DROPPED] += len(kvs) - lim.max_attributes
            kvs = kvs[: lim.max_attributes]
        # Unneeded keys (the explanation, ...) are never converted; a non-object entry
        # still rejects the record, as it would a span.
        kvs = [kv for kv in kvs if not isinstance(kv, dict) or kv.get("key") in EVALUATION_KEYS]
    attributes = attrs(kvs, attr_limits(lim), ctx.limited, ctx)
    if not has_outcome(attributes):
        raise _BadSpan(REJECT_WITHOUT_SCORE)
    check_log_time(t, ctx.max_ns, ctx.sanitised)
    return evaluation_record(trace_id.hex(), span_id.hex() if any(span_id) else "", t,
                             attributes, resource, scope_name)


def walk_resource_logs(
    resource_logs: Any, lim: DecodeLimits = DEFAULT_LIMITS, clean: bool = True
) -> LogsDecodeResult:
    """Decode a JSON list of ``ResourceLogs``; record-level problems become rejects.

    ``clean`` False skips the UTF-8 check of every string (only for documents parsed from
    bytes that ``may_have_surrogates`` cleared).
    """
    result = LogsDecodeResult()
    if resource_logs is None:
        return result
    if not isinstance(resource_logs, list):
        raise DecodeError("malformed_json", "resourceLogs must be a JSON array")
    rejected, out = result.rejected, result.spans
    ctx = _Ctx(lim, result.limited, result.sanitised, clean, time.time_ns() + FUTURE_SLACK_NS)
    for rl in resource_logs:
        if not isinstance(rl, dict):
            rejected["malformed_resource_logs"] += 1
            continue
        scopes = _scope_logs(rl)
        if not scopes:
            continue
        if not isinstance(scopes, list):
            rejected["malformed_scope_logs"] += 1
            continue
        resource: dict[str, AttrValue] | None = None
        for sl in scopes:
            if not isinstance(sl, dict):
                rejected["malformed_scope_logs"] += 1
                continue
            records = _get(sl, "logRecords", "log_records")
            if not records:
                continue
            if not isinstance(records, list):
                rejected["malformed_log_record"] += 1
                continue
            scope_name: str | None = None
            for lr in records:
                try:
                    if not isinstance(lr, dict):
                        raise _BadSpan("malformed_log_record")
                    if not _json_is_evaluation(lr):
                        result.other += 1
                        continue
                    if resource is None:
                        resource = _json_resource(rl, ctx)
                    if scope_name is None:
                        scope = sl.get("scope") or _get(
                            sl, "instrumentationLibrary", "instrumentation_library") or {}
                        name = scope.get("name") if isinstance(scope, dict) else None
                        scope_name = ctx.text(name) if isinstance(name, str) else ""
                    out.append(_json_evaluation(lr, resource, scope_name, ctx))
                except _BadSpan as bad:
                    rejected[bad.reason] += 1
                except (AttributeError, TypeError, ValueError, OverflowError, RecursionError):
                    rejected["malformed_log_record"] += 1
    return result


def _json_resource(rl: dict[str, Any], ctx: _Ctx) -> dict[str, AttrValue]:
    try:
        res = rl.get("resource") or {}
        return attrs(res.get("attributes"), ctx.lim, ctx.limited, ctx)
    except (_BadSpan, AttributeError):
        raise _BadSpan("malformed_resource") from None


def decode_json_logs(
    obj: dict[str, Any] | bytes | bytearray | str,
    limits: DecodeLimits | None = None,
    *,
    max_records: int | None = None,
    max_values: int | None = None,
) -> LogsDecodeResult:
    """Decode an OTLP/JSON ``ExportLogsServiceRequest`` / ``LogsData`` (hex ids; base64
    ids recognised by length, as for spans).

    Raises
    ------
    DecodeError
        ``malformed_json`` when the body is not JSON, not an object, or ``resourceLogs``
        is not an array (an object without ``resourceLogs`` is an empty request: success);
        ``too_many_values`` / ``too_many_log_records`` (status 413) past the caps.
    """
    clean = isinstance(obj, dict) or may_have_surrogates(obj)
    try:
        doc = parse_json(obj, max_values)
    except DecodeError as err:
        raise DecodeError(err.reason, err.message.replace("'resourceSpans'", "'resourceLogs'"),
                          err.status) from None
    resource_logs = _get(doc, "resourceLogs", "resource_logs")
    if max_records is not None:
        n = count_log_records(resource_logs)
        if n > max_records:
            raise too_many_records(n, max_records)
    return walk_resource_logs(resource_logs, limits or DEFAULT_LIMITS, clean)
