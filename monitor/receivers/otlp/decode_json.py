"""OTLP/JSON walker: dicts straight to :class:`SpanRecord`, without protobuf.

protobuf's ``json_format`` decodes the hex ``traceId`` of OTLP/JSON as base64 and yields
garbage ids (shared/reference/otel-conventions.md section 0), so this is a hand-written
walker over the ``json.loads`` result. Rules (OTLP spec "JSON Protobuf Encoding"):

* ids are case-insensitive hex; base64 ids (what ``json_format`` and Tempo write) are
  recognised by their length (24 characters for a trace id, 12 for a span id) and
  accepted too;
* int64/fixed64 values may be decimal strings or numbers;
* enums are integers, or their names (``SPAN_KIND_SERVER``, ``STATUS_CODE_ERROR``);
* keys are lowerCamelCase; snake_case is accepted as well; unknown keys are ignored;
* ``scopeSpans`` and the legacy ``instrumentationLibrarySpans`` both hold spans.

Strings are made valid UTF-8 (``json.loads`` lets lone surrogates through), names and
label-source values capped, times checked, and a request's values counted before
``json.loads`` builds them (:mod:`~assaywatch.monitor.receivers.otlp.bounds`).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

from assaywatch.monitor.receivers.otlp.bounds import (
    FUTURE_SLACK_NS,
    LABEL_KEYS,
    MAX_NAME_CHARS,
    MAX_TIME_NS,
    SAN_LABEL_TRUNCATED,
    cap_name,
    check_times,
    clean_str,
    json_value_count,
    may_have_surrogates,
)
from assaywatch.monitor.receivers.otlp.decode import (
    DEFAULT_LIMITS,
    LIMIT_ATTRIBUTES_DROPPED,
    LIMIT_EVENTS_DROPPED,
    DecodeError,
    DecodeLimits,
    DecodeResult,
    cap_bytes,
    cap_str,
    check_ids,
)
from assaywatch.monitor.receivers.spans import AttrValue, SpanEvent, SpanRecord

_SPAN_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


class _BadSpan(Exception):
    """A span-level problem: the span is rejected with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class _Ctx:
    """One request's decoding state: limits, counters, and whether strings need cleaning."""

    lim: DecodeLimits
    limited: Counter[str]
    sanitised: Counter[str]
    #: The document may hold lone surrogates: every kept string is checked.
    clean: bool
    max_ns: int

    def text(self, s: str) -> str:
        """A name: valid UTF-8, at most 256 characters."""
        if self.clean:
            s = clean_str(s, self.sanitised)
        return s if len(s) <= MAX_NAME_CHARS else cap_name(s, self.sanitised)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    v = d.get(camel)
    return d.get(snake) if v is None else v


def _int(v: Any, what: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool):
        raise _BadSpan(f"invalid_{what}")
    if isinstance(v, int):
        return v
    try:
        return int(v)  # decimal string (the spec's form) or a float-typed number
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e999 is inf
        raise _BadSpan(f"invalid_{what}") from None


def _time(v: Any) -> int:
    """A fixed64 time: anything outside 0 .. 2^64-1 rejects the span."""
    t = _int(v, "timestamp")
    if not 0 <= t <= MAX_TIME_NS:
        raise _BadSpan("invalid_timestamp")
    return t


def _enum(v: Any, names: dict[str, int], what: str) -> int:
    if v is None:
        return 0
    if isinstance(v, str) and v in names:
        return names[v]
    n = _int(v, what)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise _BadSpan(f"invalid_{what}")
    return n


def _id(v: Any, nbytes: int, what: str) -> bytes:
    """Hex (any case) or base64 id to raw bytes; b"" when absent."""
    if v is None or v == "":
        return b""
    if not isinstance(v, str):
        raise _BadSpan(f"invalid_{what}")
    if len(v) == 2 * nbytes:
        try:
            return bytes.fromhex(v)
        except ValueError:
            raise _BadSpan(f"invalid_{what}") from None
    if len(v) == 4 * ((nbytes + 2) // 3):  # base64 of nbytes, with padding
        try:
            raw = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise _BadSpan(f"invalid_{what}") from None
        if len(raw) == nbytes:
            return raw
    raise _BadSpan(f"invalid_{what}")


def _any(v: Any, ctx: _Ctx) -> AttrValue:
    if not isinstance(v, dict):
        return None
    lim, limited = ctx.lim, ctx.limited
    for key, val in v.items():
        if key in ("stringValue", "string_value"):
            if not isinstance(val, str):
                raise _BadSpan("invalid_attribute")
            if ctx.clean:
                val = clean_str(val, ctx.sanitised)
            return cap_str(val, lim.max_value_bytes, limited)
        if key in ("intValue", "int_value"):
            n = _int(val, "attribute")
            if not _INT64_MIN <= n <= _INT64_MAX:
                raise _BadSpan("invalid_attribute")
            return n
        if key in ("boolValue", "bool_value"):
            if not isinstance(val, bool):
                raise _BadSpan("invalid_attribute")
            return val
        if key in ("doubleValue", "double_value"):
            try:
                return float(val)  # numbers, or "NaN" / "Infinity" strings
            except (TypeError, ValueError, OverflowError):
                raise _BadSpan("invalid_attribute") from None
        if key in ("arrayValue", "array_value"):
            vals = val.get("values") if isinstance(val, dict) else None
            return tuple(_any(x, ctx) for x in vals or ())
        if key in ("kvlistValue", "kvlist_value"):
            vals = val.get("values") if isinstance(val, dict) else None
            return cast("dict[str, object]", attrs(vals, ctx.lim, ctx.limited, ctx))
        if key in ("bytesValue", "bytes_value"):
            try:
                raw = base64.b64decode(val, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise _BadSpan("invalid_attribute") from None
            return cap_bytes(raw, lim.max_value_bytes, limited)
    return None  # empty AnyValue, or only unknown / profiles-only keys


def attrs(
    kvs: Any, lim: DecodeLimits, limited: Counter[str], ctx: _Ctx | None = None
) -> dict[str, AttrValue]:
    """OTLP/JSON ``[{"key": ..., "value": {...}}, ...]`` to a dict (last key wins)."""
    out: dict[str, AttrValue] = {}
    if not kvs:
        return out
    if not isinstance(kvs, list):
        raise _BadSpan("invalid_attribute")
    if ctx is None:
        ctx = _Ctx(lim, limited, Counter(), True, time.time_ns() + FUTURE_SLACK_NS)
    if len(kvs) > lim.max_attributes:
        limited[LIMIT_ATTRIBUTES_DROPPED] += len(kvs) - lim.max_attributes
        kvs = kvs[: lim.max_attributes]
    cap = lim.max_value_bytes
    clean = ctx.clean
    for kv in kvs:
        if not isinstance(kv, dict):
            raise _BadSpan("invalid_attribute")
        key = kv.get("key")
        if not isinstance(key, str):
            raise _BadSpan("invalid_attribute")
        if clean or len(key) > MAX_NAME_CHARS:
            key = ctx.text(key)
        v = kv.get("value")
        # Fast path for the overwhelmingly common string attribute.
        if type(v) is dict and len(v) == 1:
            s = v.get("stringValue")
            if type(s) is str and len(s) * 4 <= cap:
                if clean:
                    s = clean_str(s, ctx.sanitised)
                if len(s) > MAX_NAME_CHARS and key in LABEL_KEYS:
                    s = cap_name(s, ctx.sanitised, SAN_LABEL_TRUNCATED)
                out[key] = s
                continue
        value = _any(v, ctx)
        if type(value) is str and len(value) > MAX_NAME_CHARS and key in LABEL_KEYS:
            value = cap_name(value, ctx.sanitised, SAN_LABEL_TRUNCATED)
        out[key] = value
    keep = lim.keep_keys
    if keep is not None:
        # Filtered after conversion, so a malformed value on a skipped key still rejects
        # its span exactly as without the filter.
        prefixes = lim.keep_prefixes
        return {k: v for k, v in out.items() if k in keep or k.startswith(prefixes)}
    return out


def _span(
    sp: Any,
    resource: dict[str, AttrValue],
    scope_name: str,
    ctx: _Ctx,
) -> SpanRecord:
    if not isinstance(sp, dict):
        raise _BadSpan("malformed_span")
    lim, limited = ctx.lim, ctx.limited
    trace_id = _id(_get(sp, "traceId", "trace_id"), 16, "trace_id")
    span_id = _id(_get(sp, "spanId", "span_id"), 8, "span_id")
    parent = _id(_get(sp, "parentSpanId", "parent_span_id"), 8, "parent_span_id")
    bad = check_ids(trace_id, span_id, parent)
    if bad is not None:
        raise _BadSpan(bad)
    events: list[SpanEvent] = []
    raw_events = sp.get("events")
    if raw_events:
        if not isinstance(raw_events, list):
            raise _BadSpan("malformed_span")
        if len(raw_events) > lim.max_events:
            limited[LIMIT_EVENTS_DROPPED] += len(raw_events) - lim.max_events
            raw_events = raw_events[: lim.max_events]
        for e in raw_events:
            if not isinstance(e, dict):
                raise _BadSpan("malformed_span")
            events.append(
                SpanEvent(
                    ctx.text(str(e.get("name") or "")),
                    _time(_get(e, "timeUnixNano", "time_unix_nano")),
                    attrs(e.get("attributes"), lim, limited, ctx),
                )
            )
    status = sp.get("status") or {}
    if not isinstance(status, dict):
        raise _BadSpan("malformed_span")
    name = sp.get("name") or ""
    start = _time(_get(sp, "startTimeUnixNano", "start_time_unix_nano"))
    end = _time(_get(sp, "endTimeUnixNano", "end_time_unix_nano"))
    message = str(status.get("message") or "")
    if ctx.clean:
        message = clean_str(message, ctx.sanitised)
    return SpanRecord(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent.hex() if any(parent) else "",
        name=ctx.text(name if isinstance(name, str) else str(name)),
        start_ns=start,
        end_ns=check_times(start, end, ctx.max_ns, ctx.sanitised),
        kind=_enum(sp.get("kind"), _SPAN_KINDS, "kind"),
        status_code=_enum(status.get("code"), _STATUS_CODES, "status"),
        status_message=cap_str(message, lim.max_value_bytes, limited),
        attributes=attrs(sp.get("attributes"), lim, limited, ctx),
        events=events,
        resource=resource,
        scope_name=scope_name,
    )


def _count(items: Any) -> int:
    return len(items) if isinstance(items, list) else 1


def _scopes(rs: dict[str, Any]) -> Any:
    scopes = _get(rs, "scopeSpans", "scope_spans")
    legacy = _get(rs, "instrumentationLibrarySpans", "instrumentation_library_spans")
    if legacy:
        scopes = (scopes if isinstance(scopes, list) else []) + (
            legacy if isinstance(legacy, list) else [legacy]
        )
    return scopes


def count_spans(resource_spans: Any) -> int:
    """Spans of a JSON ``resourceSpans`` list, counted without decoding any."""
    n = 0
    if not isinstance(resource_spans, list):
        return 0
    for rs in resource_spans:
        if not isinstance(rs, dict):
            continue
        scopes = _scopes(rs)
        if not isinstance(scopes, list):
            continue
        for ss in scopes:
            if isinstance(ss, dict):
                spans = ss.get("spans")
                if isinstance(spans, list):
                    n += len(spans)
    return n


def walk_resource_spans(
    resource_spans: Any, lim: DecodeLimits = DEFAULT_LIMITS, clean: bool = True
) -> DecodeResult:
    """Decode a JSON list of ``ResourceSpans``; span-level problems become rejects.

    ``clean`` False skips the UTF-8 check of every string: only for documents parsed from
    bytes that :func:`~assaywatch.monitor.receivers.otlp.bounds.may_have_surrogates`
    cleared.
    """
    result = DecodeResult()
    if resource_spans is None:
        return result
    if not isinstance(resource_spans, list):
        raise DecodeError("malformed_json", "resourceSpans must be a JSON array")
    rejected, limited, out = result.rejected, result.limited, result.spans
    ctx = _Ctx(lim, limited, result.sanitised, clean, time.time_ns() + FUTURE_SLACK_NS)
    for rs in resource_spans:
        if not isinstance(rs, dict):
            rejected["malformed_resource_spans"] += 1
            continue
        scopes = _scopes(rs)
        if not scopes:
            continue
        if not isinstance(scopes, list):
            rejected["malformed_scope_spans"] += 1
            continue
        try:
            res = rs.get("resource") or {}
            resource = attrs(res.get("attributes"), lim, limited, ctx)
        except (_BadSpan, AttributeError):
            n = sum(_count(s.get("spans")) for s in scopes if isinstance(s, dict))
            rejected["malformed_resource"] += max(n, 1)
            continue
        for ss in scopes:
            if not isinstance(ss, dict):
                rejected["malformed_scope_spans"] += 1
                continue
            scope = (
                ss.get("scope")
                or _get(ss, "instrumentationLibrary", "instrumentation_library")
                or {}
            )
            scope_name = scope.get("name") if isinstance(scope, dict) else None
            spans = ss.get("spans")
            if not spans:
                continue
            if not isinstance(spans, list):
                rejected["malformed_span"] += 1
                continue
            sname = ctx.text(scope_name) if isinstance(scope_name, str) else ""
            for sp in spans:
                try:
                    out.append(_span(sp, resource, sname, ctx))
                except _BadSpan as bad:
                    rejected[bad.reason] += 1
                except (AttributeError, TypeError, ValueError, OverflowError, RecursionError):
                    rejected["malformed_span"] += 1
    return result


def parse_json(
    obj: dict[str, Any] | bytes | bytearray | str, max_values: int | None = None
) -> dict[str, Any]:
    """``json.loads`` with the receiver's error contract (DecodeError ``malformed_json``;
    ``too_many_values``, status 413, when the document holds more than ``max_values``)."""
    if isinstance(obj, dict):
        return obj
    if max_values is not None:
        raw = obj if isinstance(obj, (bytes, bytearray)) else obj.encode(
            "utf-8", "surrogatepass")
        n = json_value_count(raw, max_values)
        if n > max_values:
            raise DecodeError(
                "too_many_values",
                f"request holds about {n} JSON values, more than the {max_values} one "
                "request may carry; send smaller batches",
                413,
            )
    try:
        doc = json.loads(obj)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DecodeError("malformed_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise DecodeError(
            "malformed_json",
            f"expected a JSON object with 'resourceSpans', got {type(doc).__name__}",
        )
    return doc


def decode_json_request(
    obj: dict[str, Any] | bytes | bytearray | str,
    limits: DecodeLimits | None = None,
    *,
    max_spans: int | None = None,
    max_values: int | None = None,
) -> DecodeResult:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest`` / ``TracesData``.

    Parameters
    ----------
    obj:
        The parsed document, or its UTF-8 bytes / text.
    limits:
        Value/attribute/event caps; :class:`DecodeLimits` defaults when None.
    max_spans, max_values:
        Caps on the request's spans and JSON values (None: unbounded, as the file readers
        use it); the values are counted before ``json.loads`` builds them.

    Raises
    ------
    DecodeError
        ``malformed_json`` when the body is not JSON, not an object, or
        ``resourceSpans`` is not an array. An object without ``resourceSpans`` is an
        empty request (unknown fields are ignored), which the protocol answers with
        success. ``too_many_values`` / ``too_many_spans`` (status 413) past the caps.
    """
    clean = isinstance(obj, dict) or may_have_surrogates(obj)
    doc = parse_json(obj, max_values)
    resource_spans = _get(doc, "resourceSpans", "resource_spans")
    if max_spans is not None:
        n = count_spans(resource_spans)
        if n > max_spans:
            raise DecodeError(
                "too_many_spans",
                f"request holds {n} spans, more than the {max_spans} one request may "
                "carry; send smaller batches (BatchSpanProcessor max_export_batch_size)",
                413,
            )
    return walk_resource_spans(resource_spans, limits or DEFAULT_LIMITS, clean)


def decode_json_resource_spans(
    resource_spans: object, limits: DecodeLimits | None = None
) -> DecodeResult:
    """Decode a list of OTLP/JSON ``ResourceSpans`` objects (Tempo's ``batches``)."""
    return walk_resource_spans(resource_spans, limits or DEFAULT_LIMITS)
