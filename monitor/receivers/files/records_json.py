"""Decoded records back to OTLP/JSON: what ``assaywatch record`` appends to its file.

:func:`records_to_json` renders spans as one ``ExportTraceServiceRequest`` and
:func:`evaluations_to_json` evaluation records (``kind == KIND_EVALUATION``) as one
``ExportLogsServiceRequest`` of ``gen_ai.evaluation.result`` log records; both with the
OTLP/JSON rules (hex ids, int64 as decimal strings, default values omitted), so the
readers (:func:`~assaywatch.monitor.receivers.files.read_spans`) give the records back
as the receivers decoded them. Kept: ids, names, kinds, times, status, attributes,
events, resource and scope name (an evaluation keeps what the decoder kept: its
evaluation keys, never the explanation or the body). Not kept: span links, trace state,
flags, dropped counts, scope version and attributes, schema URLs, which the decoders do
not read.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from typing import Any

from assaywatch.monitor.receivers.spans import EVALUATION_EVENT

__all__ = ["evaluations_to_json", "records_to_json"]


def _any_json(v: object) -> dict[str, Any]:
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if math.isfinite(v):
            return {"doubleValue": v}
        return {"doubleValue": "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bytes):
        return {"bytesValue": base64.b64encode(v).decode("ascii")}
    if isinstance(v, (tuple, list)):
        return {"arrayValue": {"values": [_any_json(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": _kvs_json(v)}}
    return {"stringValue": str(v)}


def _kvs_json(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_json(v)} for k, v in attrs.items()]


def _span_json(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": s.trace_id, "spanId": s.span_id}
    if s.parent_span_id:
        out["parentSpanId"] = s.parent_span_id
    out["name"] = s.name
    if s.kind:
        out["kind"] = int(s.kind)
    out["startTimeUnixNano"] = str(s.start_ns)
    out["endTimeUnixNano"] = str(s.end_ns)
    if s.attributes:
        out["attributes"] = _kvs_json(s.attributes)
    if s.events:
        events = []
        for e in s.events:
            ev: dict[str, Any] = {"timeUnixNano": str(e.time_ns), "name": e.name}
            if e.attributes:
                ev["attributes"] = _kvs_json(e.attributes)
            events.append(ev)
        out["events"] = events
    status: dict[str, Any] = {}
    if s.status_message:
        status["message"] = s.status_message
    if s.status_code:
        status["code"] = int(s.status_code)
    out["status"] = status
    return out


def records_to_json(spans: Iterable[Any]) -> dict[str, Any]:
    """``SpanRecord``\\ s as one OTLP/JSON ``ExportTraceServiceRequest`` (hex ids), grouped
    by resource and scope name as they arrived."""
    resource_spans = []
    for resource, scopes in _grouped(spans, _span_json):
        scope_spans = [{"scope": {"name": name} if name else {}, "spans": items}
                       for name, items in scopes.items()]
        resource_spans.append({"resource": {"attributes": _kvs_json(resource)},
                               "scopeSpans": scope_spans})
    return {"resourceSpans": resource_spans}


def _log_json(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.start_ns:
        out["timeUnixNano"] = str(r.start_ns)
    out["traceId"] = r.trace_id
    if r.span_id:
        out["spanId"] = r.span_id
    out["eventName"] = EVALUATION_EVENT
    if r.attributes:
        out["attributes"] = _kvs_json(r.attributes)
    return out


def _grouped(records: Iterable[Any], render: Any) -> list[tuple[dict[str, Any],
                                                                dict[str, list[Any]]]]:
    """(resource, {scope name: rendered records}), grouped by resource identity (the
    decoders share one resource dict among the records of a ResourceSpans / ResourceLogs,
    so identity groups them as they arrived) and scope name."""
    groups: dict[int, tuple[dict[str, Any], dict[str, list[Any]]]] = {}
    for r in records:
        entry = groups.get(id(r.resource))
        if entry is None:
            entry = groups[id(r.resource)] = (r.resource, {})
        entry[1].setdefault(r.scope_name, []).append(render(r))
    return list(groups.values())


def evaluations_to_json(records: Iterable[Any]) -> dict[str, Any]:
    """Evaluation records as one OTLP/JSON ``ExportLogsServiceRequest`` (hex ids; each a
    log record with ``eventName`` ``gen_ai.evaluation.result``, its time, trace and
    evaluated span ids, and its kept attributes)."""
    resource_logs = []
    for resource, scopes in _grouped(records, _log_json):
        scope_logs = [{"scope": {"name": name} if name else {}, "logRecords": items}
                      for name, items in scopes.items()]
        resource_logs.append({"resource": {"attributes": _kvs_json(resource)},
                              "scopeLogs": scope_logs})
    return {"resourceLogs": resource_logs}
