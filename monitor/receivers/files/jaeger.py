"""Jaeger JSON (UI "Download" / v1 query API ``{"data": [trace, ...]}``) to span records.

Mapping (Jaeger ``model/json``; the inverse of the Collector's OTLP-to-Jaeger translation):

* ``traceID`` / ``spanID`` are hex; 64-bit trace ids are left-padded to 128 bits.
* the first ``CHILD_OF`` reference (else the first reference, else the legacy
  ``parentSpanID``) is the parent;
* ``startTime`` and ``duration`` are microseconds -> ``start_ns``, ``end_ns``;
* ``tags`` become attributes, except the OTel bridge tags ``span.kind``,
  ``otel.status_code``, ``otel.status_description``, ``otel.scope.name`` /
  ``otel.library.name`` (and ``.version``), which become kind, status and scope;
  ``error=true`` without ``otel.status_code`` means status ERROR;
* ``logs`` become events (name from the ``event`` field, time in microseconds);
* ``processes[processID]`` becomes the resource: ``serviceName`` -> ``service.name``
  plus the process tags, one shared dict per process.
"""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

from assaywatch.monitor.receivers.otlp.decode import (
    DEFAULT_LIMITS,
    LIMIT_ATTRIBUTES_DROPPED,
    LIMIT_EVENTS_DROPPED,
    DecodeLimits,
    DecodeResult,
    cap_str,
)
from assaywatch.monitor.receivers.spans import (
    STATUS_ERROR,
    STATUS_OK,
    AttrValue,
    SpanEvent,
    SpanRecord,
)

__all__ = ["jaeger_document_to_records", "jaeger_trace_to_records"]

_KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_STATUS = {"OK": STATUS_OK, "ERROR": STATUS_ERROR}
_BRIDGE_TAGS = frozenset(
    {
        "span.kind",
        "otel.status_code",
        "otel.status_description",
        "otel.scope.name",
        "otel.scope.version",
        "otel.library.name",
        "otel.library.version",
    }
)


class _Bad(Exception):
    pass


def _hex_id(v: Any, nbytes: int) -> str:
    if not isinstance(v, str) or not v or len(v) > 2 * nbytes:
        raise _Bad
    try:
        raw = bytes.fromhex(v.rjust(2 * nbytes, "0"))
    except ValueError:
        raise _Bad from None
    if not any(raw):
        raise _Bad
    return raw.hex()


def _tag_value(tag: dict[str, Any], lim: DecodeLimits, limited: Counter[str]) -> AttrValue:
    t = str(tag.get("type", "string")).lower()
    v: Any = tag.get("value")
    if t == "bool":
        return v if isinstance(v, bool) else str(v).lower() == "true"
    if t == "int64":
        return int(v)
    if t == "float64":
        return float(v)
    if t == "binary":
        return base64.b64decode(v) if isinstance(v, str) else bytes(v)
    return cap_str(str(v) if v is not None else "", lim.max_value_bytes, limited)


def _tags(tags: Any, lim: DecodeLimits, limited: Counter[str]) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for tag in tags or ():
        key = tag.get("key")
        if isinstance(key, str):
            out[key] = _tag_value(tag, lim, limited)
    if len(out) > lim.max_attributes:
        limited[LIMIT_ATTRIBUTES_DROPPED] += len(out) - lim.max_attributes
        out = dict(list(out.items())[: lim.max_attributes])
    return out


def _parent(span: dict[str, Any], trace_id: str) -> str:
    refs = [r for r in span.get("references") or () if isinstance(r, dict)]
    chosen = next((r for r in refs if r.get("refType") == "CHILD_OF"), refs[0] if refs else None)
    pid = chosen.get("spanID") if chosen else span.get("parentSpanID")
    if not pid or pid.strip("0") == "":
        return ""
    return _hex_id(pid, 8)


def _span(
    sp: dict[str, Any],
    trace_id_default: Any,
    resources: dict[str, dict[str, AttrValue]],
    lim: DecodeLimits,
    limited: Counter[str],
) -> SpanRecord:
    trace_id = _hex_id(sp.get("traceID") or trace_id_default, 16)
    span_id = _hex_id(sp.get("spanID"), 8)
    attrs = _tags(sp.get("tags"), lim, limited)
    kind = _KINDS.get(str(attrs.get("span.kind", "")).lower(), 0)
    status = _STATUS.get(str(attrs.get("otel.status_code", "")).upper(), 0)
    if attrs.get("error") is True:  # Jaeger's error flag: the bridge's rendering of ERROR
        del attrs["error"]
        status = status or STATUS_ERROR
    message = str(attrs.get("otel.status_description") or "")
    scope = attrs.get("otel.scope.name", attrs.get("otel.library.name", ""))
    for key in _BRIDGE_TAGS.intersection(attrs):
        del attrs[key]
    events = []
    for log in (sp.get("logs") or ())[: lim.max_events]:
        fields = _tags(log.get("fields"), lim, limited)
        name = fields.pop("event", "log")
        events.append(SpanEvent(str(name), int(log.get("timestamp") or 0) * 1000, fields))
    if len(sp.get("logs") or ()) > lim.max_events:
        limited[LIMIT_EVENTS_DROPPED] += len(sp["logs"]) - lim.max_events
    pid = sp.get("processID")
    resource = resources.get(pid) if isinstance(pid, str) else None
    if resource is None:
        embedded = sp.get("process")
        resource = _process(embedded, lim, limited) if isinstance(embedded, dict) else {}
    start_ns = int(sp.get("startTime") or 0) * 1000
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=_parent(sp, trace_id),
        name=str(sp.get("operationName") or ""),
        start_ns=start_ns,
        end_ns=start_ns + int(sp.get("duration") or 0) * 1000,
        kind=kind,
        status_code=status,
        status_message=message,
        attributes=attrs,
        events=events,
        resource=resource,
        scope_name=str(scope),
    )


def _process(
    proc: dict[str, Any], lim: DecodeLimits, limited: Counter[str]
) -> dict[str, AttrValue]:
    resource = _tags(proc.get("tags"), lim, limited)
    if proc.get("serviceName"):
        resource["service.name"] = str(proc["serviceName"])
    return resource


def jaeger_trace_to_records(trace: Any, limits: DecodeLimits | None = None) -> DecodeResult:
    """Convert one Jaeger trace ``{traceID, spans, processes}``; bad spans are rejected."""
    lim = limits or DEFAULT_LIMITS
    result = DecodeResult()
    if not isinstance(trace, dict) or not isinstance(trace.get("spans", []), list):
        result.rejected["malformed_jaeger_trace"] += 1
        return result
    resources: dict[str, dict[str, AttrValue]] = {}
    for pid, proc in (trace.get("processes") or {}).items():
        if isinstance(proc, dict):
            try:
                resources[pid] = _process(proc, lim, result.limited)
            except (AttributeError, TypeError, ValueError):
                resources[pid] = {}
    for sp in trace.get("spans") or ():
        try:
            result.spans.append(_span(sp, trace.get("traceID"), resources, lim, result.limited))
        except _Bad:
            result.rejected["invalid_id"] += 1
        except (AttributeError, TypeError, ValueError, KeyError):
            result.rejected["malformed_span"] += 1
    return result


def jaeger_document_to_records(doc: Any, limits: DecodeLimits | None = None) -> list[DecodeResult]:
    """``{"data": [trace, ...]}``, a bare trace, or a list of traces -> one result per trace."""
    if isinstance(doc, dict) and "data" in doc:
        doc = doc["data"]
    traces = doc if isinstance(doc, list) else [doc]
    return [jaeger_trace_to_records(t, limits) for t in traces]
