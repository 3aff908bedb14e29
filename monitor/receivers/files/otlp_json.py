"""OTLP JSON Lines: the OTel file exporter's and Collector ``fileexporter``'s format.

One ``TracesData`` / ``ExportTraceServiceRequest`` JSON object per line (UTF-8, ``\\n``
separated; shared/reference/otel-conventions.md section 6); a line may also hold a
``LogsData`` / ``ExportLogsServiceRequest`` (``resourceLogs``), whose evaluation events
the readers yield beside the spans. Also the writer used by tests and tools: the SDK's
own encoders (``encode_spans``, ``encode_logs``) build the protobuf request and
:func:`request_to_json` / :func:`logs_request_to_json` render it with the OTLP/JSON
rules (hex ids, integer enums, int64 as decimal strings, default values omitted), which
protobuf's ``json_format`` gets wrong for ids.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from collections.abc import Iterator, Sequence
from typing import IO, Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["iter_json_lines", "logs_request_to_json", "request_to_json",
           "write_otlp_json_lines"]

#: Longest line read; a longer one is reported and skipped (bounded memory).
MAX_LINE_BYTES = 256 * 1024 * 1024


def iter_json_lines(
    stream: IO[bytes], first_line: int = 1, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line_number, parsed_object, error)`` for each non-blank line.

    ``parsed_object`` is None when ``error`` says why the line could not be parsed.
    Reading is line by line, so memory is bounded by the longest line.
    """
    lineno = first_line - 1
    while True:
        line = stream.readline(max_line_bytes + 1)
        if not line:
            return
        lineno += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            while (rest := stream.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield lineno, None, f"line longer than {max_line_bytes} bytes; skipped"
            continue
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line), None
        except (ValueError, RecursionError) as exc:
            yield lineno, None, f"invalid JSON: {exc}"


# --------------------------------------------------------------------------- writer


def _any_json(v: Any) -> dict[str, Any]:
    which = v.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "double_value":
        d = v.double_value
        if math.isfinite(d):
            return {"doubleValue": d}
        return {"doubleValue": "NaN" if math.isnan(d) else ("Infinity" if d > 0 else "-Infinity")}
    if which == "array_value":
        return {"arrayValue": {"values": [_any_json(x) for x in v.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": _kvs_json(v.kvlist_value.values)}}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode("ascii")}
    return {}


def _kvs_json(kvs: Any) -> list[dict[str, Any]]:
    return [{"key": kv.key, "value": _any_json(kv.value)} for kv in kvs]


def _put(d: dict[str, Any], key: str, value: Any) -> None:
    if value:  # OTLP/JSON omits default values
        d[key] = value


def _span_json(sp: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": sp.trace_id.hex(), "spanId": sp.span_id.hex()}
    _put(out, "traceState", sp.trace_state)
    _put(out, "parentSpanId", sp.parent_span_id.hex())
    _put(out, "flags", sp.flags)
    out["name"] = sp.name
    _put(out, "kind", int(sp.kind))
    out["startTimeUnixNano"] = str(sp.start_time_unix_nano)
    out["endTimeUnixNano"] = str(sp.end_time_unix_nano)
    _put(out, "attributes", _kvs_json(sp.attributes))
    _put(out, "droppedAttributesCount", sp.dropped_attributes_count)
    events = []
    for e in sp.events:
        ev: dict[str, Any] = {"timeUnixNano": str(e.time_unix_nano), "name": e.name}
        _put(ev, "attributes", _kvs_json(e.attributes))
        events.append(ev)
    _put(out, "events", events)
    links = []
    for link in sp.links:
        lk: dict[str, Any] = {"traceId": link.trace_id.hex(), "spanId": link.span_id.hex()}
        _put(lk, "attributes", _kvs_json(link.attributes))
        _put(lk, "flags", link.flags)
        links.append(lk)
    _put(out, "links", links)
    status: dict[str, Any] = {}
    _put(status, "message", sp.status.message)
    _put(status, "code", int(sp.status.code))
    out["status"] = status
    return out


def request_to_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """Render an ``ExportTraceServiceRequest`` as an OTLP/JSON dict."""
    resource_spans = []
    for rs in req.resource_spans:
        scope_spans = []
        for ss in rs.scope_spans:
            scope: dict[str, Any] = {}
            _put(scope, "name", ss.scope.name)
            _put(scope, "version", ss.scope.version)
            _put(scope, "attributes", _kvs_json(ss.scope.attributes))
            entry: dict[str, Any] = {"scope": scope, "spans": [_span_json(s) for s in ss.spans]}
            _put(entry, "schemaUrl", ss.schema_url)
            scope_spans.append(entry)
        item: dict[str, Any] = {"resource": {"attributes": _kvs_json(rs.resource.attributes)}}
        item["scopeSpans"] = scope_spans
        _put(item, "schemaUrl", rs.schema_url)
        resource_spans.append(item)
    return {"resourceSpans": resource_spans}


def _log_json(lr: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _put(out, "timeUnixNano", str(lr.time_unix_nano) if lr.time_unix_nano else "")
    _put(out, "observedTimeUnixNano",
         str(lr.observed_time_unix_nano) if lr.observed_time_unix_nano else "")
    _put(out, "severityNumber", int(lr.severity_number))
    _put(out, "severityText", lr.severity_text)
    if lr.HasField("body"):
        out["body"] = _any_json(lr.body)
    _put(out, "attributes", _kvs_json(lr.attributes))
    _put(out, "droppedAttributesCount", lr.dropped_attributes_count)
    _put(out, "flags", lr.flags)
    _put(out, "traceId", lr.trace_id.hex())
    _put(out, "spanId", lr.span_id.hex())
    _put(out, "eventName", lr.event_name)
    return out


def logs_request_to_json(req: Any) -> dict[str, Any]:
    """Render an ``ExportLogsServiceRequest`` (e.g. the SDK's ``encode_logs``) as an
    OTLP/JSON dict (hex ids, int64 as decimal strings, default values omitted)."""
    resource_logs = []
    for rl in req.resource_logs:
        scope_logs = []
        for sl in rl.scope_logs:
            scope: dict[str, Any] = {}
            _put(scope, "name", sl.scope.name)
            _put(scope, "version", sl.scope.version)
            entry: dict[str, Any] = {"scope": scope,
                                     "logRecords": [_log_json(lr) for lr in sl.log_records]}
            _put(entry, "schemaUrl", sl.schema_url)
            scope_logs.append(entry)
        item: dict[str, Any] = {"resource": {"attributes": _kvs_json(rl.resource.attributes)},
                                "scopeLogs": scope_logs}
        _put(item, "schemaUrl", rl.schema_url)
        resource_logs.append(item)
    return {"resourceLogs": resource_logs}


def write_otlp_json_lines(path: str, spans: Sequence[Any], *, compress: bool | None = None) -> int:
    """Append one OTLP/JSON line holding ``spans`` (SDK ``ReadableSpan``\\ s) to ``path``.

    Parameters
    ----------
    path:
        File to append to (created if missing), like the OTel file exporter does.
    spans:
        Finished SDK spans, e.g. from ``InMemorySpanExporter.get_finished_spans()``.
    compress:
        Write gzip (each call appends one gzip member, which readers handle); None
        means "when ``path`` ends in ``.gz``".

    Returns
    -------
    int
        The number of spans written.
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    line = json.dumps(request_to_json(encode_spans(spans)), separators=(",", ":")) + "\n"
    if compress is None:
        compress = path.endswith(".gz")
    if compress:
        with gzip.open(path, "ab") as gz:
            gz.write(line.encode("utf-8"))
    else:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    return len(spans)
