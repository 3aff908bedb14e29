"""What the receiving edge refuses or repairs before anything is built from a request.

Two kinds of protection, both applied by the decoders in
:mod:`~assaywatch.monitor.receivers.otlp.decode` and
:mod:`~assaywatch.monitor.receivers.otlp.decode_json`:

**Sanitising (the span is kept, the value repaired, each repair counted).**

* Every string is valid UTF-8. OTLP/JSON can carry lone UTF-16 surrogates (``"\\ud800"``,
  or the raw bytes ``ED A0 80`` that ``json.loads`` lets through); they are replaced with
  U+FFFD (reason ``invalid_utf8``). Protobuf needs no repair: upb refuses a request with a
  string field that is not UTF-8 (400 ``malformed_protobuf``).
* Names are cut to :data:`MAX_NAME_CHARS` (256) characters: span, event and scope names
  and attribute keys (reason ``name_truncated``), and the values of the attributes a stream
  key or a metric label can be made of, :data:`LABEL_KEYS` (reason
  ``label_value_truncated``). Other values keep the byte cap of
  :class:`~assaywatch.monitor.receivers.otlp.decode.DecodeLimits`.
* Times: a span that ends before it starts gets ``end = start`` (reason
  ``end_before_start``; the pipeline counted its latency as 0 anyway). A start or end before
  2000-01-01 or more than one day after the monitor's clock is kept unchanged and counted
  (reason ``time_out_of_range``): run assembly runs on the monitor's arrival clock, so a
  wrong sender clock can only distort its own run's latency, and clamping single spans
  would reorder a run's steps. A JSON time that no fixed64 can hold (negative, or 2^64 and
  above) rejects its span (``invalid_timestamp``), as protobuf cannot even express it.

These counts are ``assaywatch_values_sanitised_total{receiver, reason}``.

**Bounding a request before its objects are built (413, never retried).**

* OTLP/JSON: :func:`json_value_count` counts the values of the document (commas and
  opening brackets outside strings) before ``json.loads`` builds a single object, so
  59 KB of gzip that inflates to 64 MiB of ``{},`` (20 million dicts, 1.6 GB) is refused
  for the price of a byte count.
* Protobuf: :func:`proto_element_count` walks the wire format and counts the messages upb
  would allocate (resource and scope spans, spans, events, links, attributes, nested
  values; :func:`proto_logs_element_count` the same for a logs request), stopping as soon
  as the cap is passed: 8 MiB of empty ``Span`` messages
  allocate ~720 MB in upb. Requests under :data:`PROTO_WALK_MIN_BYTES` are not walked (at
  most ~90 bytes of upb per wire byte keeps them under ~25 MB).
"""

from __future__ import annotations

import re
from collections import Counter

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAX_SPANS",
    "LABEL_KEYS",
    "MAX_NAME_CHARS",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "PROTO_WALK_MIN_BYTES",
    "TooLarge",
    "WireError",
    "clean_str",
    "json_value_count",
    "may_have_surrogates",
    "proto_element_count",
    "proto_logs_element_count",
]

#: Longest span, event or scope name, attribute key and label-source value, in characters.
MAX_NAME_CHARS = 256
#: Attributes whose values can become a stream key (agent, version, scenario), a tool or
#: model name, or a metric label: capped at :data:`MAX_NAME_CHARS` like names.
#: tests/monitor/test_otlp_decode.py checks that the pipeline's key tables are covered.
LABEL_KEYS: frozenset[str] = frozenset({
    "service.name", "service.version",
    "gen_ai.agent.name", "agent.name", "gen_ai.agent.version",
    "traceloop.entity.name", "traceloop.entity.version", "langfuse.version",
    "assaywatch.scenario", "gen_ai.workflow.name", "traceloop.workflow.name",
    "gen_ai.tool.name", "tool.name", "gen_ai.transfer.target.name",
    "gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind",
    "langfuse.observation.type", "gen_ai.provider.name", "gen_ai.system",
    "gen_ai.request.model", "gen_ai.response.model", "llm.model_name",
    "llm.response.model_name", "llm.request.model", "llm.request.model_name",
    "embedding.model_name", "langfuse.observation.model.name", "llm.system", "llm.provider",
    "error.type", "gen_ai.evaluation.name", "gen_ai.evaluation.score.label",
})
#: 2000-01-01T00:00:00Z: earlier span times are counted as ``time_out_of_range``.
MIN_TIME_NS = 946_684_800 * 10**9
#: Tolerated clock lead of a sender over the monitor.
FUTURE_SLACK_NS = 86_400 * 10**9
#: Largest fixed64.
MAX_TIME_NS = 2**64 - 1
#: Default cap on spans per request (receivers): more is a 413 / RESOURCE_EXHAUSTED.
DEFAULT_MAX_SPANS = 100_000
#: Default cap on JSON values / protobuf messages per request (receivers).
DEFAULT_MAX_ELEMENTS = 1_000_000
#: Protobuf requests at least this long are walked before upb parses them.
PROTO_WALK_MIN_BYTES = 256 * 1024

#: ``sanitised`` counter labels.
SAN_INVALID_UTF8 = "invalid_utf8"
SAN_NAME_TRUNCATED = "name_truncated"
SAN_LABEL_TRUNCATED = "label_value_truncated"
SAN_END_BEFORE_START = "end_before_start"
SAN_TIME_OUT_OF_RANGE = "time_out_of_range"


class TooLarge(Exception):
    """The request holds more than a cap allows; ``reason`` is the counter label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class WireError(Exception):
    """The protobuf wire format is broken (the walker found it before upb did)."""


# --------------------------------------------------------------------------- strings

_SURROGATE_HINT = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")


def may_have_surrogates(data: bytes | bytearray | str) -> bool:
    """Cheap test: can ``json.loads(data)`` produce a lone surrogate?"""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if b"\\u" not in data and b"\xed" not in data:
        return False
    return _SURROGATE_HINT.search(data) is not None


def clean_str(s: str, sanitised: Counter[str]) -> str:
    """``s`` with lone surrogates replaced by U+FFFD (counted once per string)."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        sanitised[SAN_INVALID_UTF8] += 1
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return s


def cap_name(s: str, sanitised: Counter[str], reason: str = SAN_NAME_TRUNCATED) -> str:
    if len(s) <= MAX_NAME_CHARS:
        return s
    sanitised[reason] += 1
    return s[:MAX_NAME_CHARS]


def check_times(start: int, end: int, max_ns: int, sanitised: Counter[str]) -> int:
    """The span's end time after the checks (``end`` clamped up to ``start``)."""
    if not (MIN_TIME_NS <= start <= max_ns and MIN_TIME_NS <= end <= max_ns):
        sanitised[SAN_TIME_OUT_OF_RANGE] += 1
    if end < start:
        sanitised[SAN_END_BEFORE_START] += 1
        return start
    return end


# --------------------------------------------------------------------------- JSON

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _structural(data: bytes | bytearray) -> int:
    return data.count(b",") + data.count(b"{") + data.count(b"[") + 1


def json_value_count(data: bytes | bytearray, cap: int) -> int:
    """Upper bound on the values ``json.loads(data)`` would build, exact enough to compare
    with ``cap``: commas and opening brackets outside strings, plus one.

    Counting every comma and bracket (in strings too) costs one pass per byte kind and
    settles the common case; only a body over ``cap`` by that count is scanned again with
    its strings removed, so text full of commas is not mistaken for a flood of values.
    """
    n = _structural(data)
    if n <= cap:
        return n
    if data.count(b'"') <= 200_000:  # few strings: subtract theirs, without a copy
        for m in _JSON_STRING.finditer(data):
            n -= _structural(m.group()) - 1
        return n
    return _structural(_JSON_STRING.sub(b"", data))


# --------------------------------------------------------------------------- protobuf

_Schema = dict[int, "dict[int, object] | None"]


def _schema(root: Descriptor) -> _Schema:
    """Field number -> child schema (None for a message without message fields)."""
    fields_of: dict[str, dict[int, str]] = {}
    todo = [root]
    descs: dict[str, Descriptor] = {}
    while todo:
        d = todo.pop()
        if d.full_name in fields_of:
            continue
        descs[d.full_name] = d
        fields_of[d.full_name] = {}
        for f in d.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                fields_of[d.full_name][f.number] = f.message_type.full_name
                todo.append(f.message_type)
    built: dict[str, dict[int, object]] = {name: {} for name in fields_of}
    for name, fields in fields_of.items():
        for number, child in fields.items():
            built[name][number] = built[child] if fields_of[child] else None
    return built[root.full_name]  # type: ignore[return-value]


_REQUEST_SCHEMA = _schema(ExportTraceServiceRequest.DESCRIPTOR)
#: ResourceSpans.scope_spans (2) -> ScopeSpans.spans (2): the Span schema, by identity.
_SPAN_SCHEMA = _REQUEST_SCHEMA[1][2][2]  # type: ignore[index]
_LOGS_REQUEST_SCHEMA = _schema(ExportLogsServiceRequest.DESCRIPTOR)
#: ResourceLogs.scope_logs (2) -> ScopeLogs.log_records (2): the LogRecord schema.
_LOG_RECORD_SCHEMA = _LOGS_REQUEST_SCHEMA[1][2][2]  # type: ignore[index]
#: upb's default recursion limit.
_MAX_DEPTH = 100


def proto_logs_element_count(buf: bytes | bytearray, cap: int,
                             max_records: int | None = None) -> tuple[int, int]:
    """(messages, log records) a parse of ``buf`` (an ``ExportLogsServiceRequest``) would
    allocate; as :func:`proto_element_count` (log bodies and attributes are counted)."""
    return _element_count(buf, cap, max_records, _LOGS_REQUEST_SCHEMA, _LOG_RECORD_SCHEMA)


def proto_element_count(buf: bytes | bytearray, cap: int,
                        max_spans: int | None = None) -> tuple[int, int]:
    """(messages, spans) a parse of ``buf`` (an ``ExportTraceServiceRequest``) would
    allocate, counted until the messages pass ``cap`` or the spans ``max_spans`` (then
    returned at once).

    Raises
    ------
    WireError
        Truncated data, a bad varint, a group, or nesting deeper than upb allows.
    """
    return _element_count(buf, cap, max_spans, _REQUEST_SCHEMA, _SPAN_SCHEMA)


def _element_count(buf: bytes | bytearray, cap: int, max_spans: int | None,
                   schema: _Schema, item_schema: object) -> tuple[int, int]:
    n = len(buf)
    i = 0
    end = n
    fields: dict[int, object] = schema  # type: ignore[assignment]
    stack: list[tuple[int, dict[int, object]]] = []
    count = 0
    spans = 0
    span_cap = n if max_spans is None else max_spans
    try:
        while True:
            if i >= end:
                if i > end:
                    raise WireError("a field runs past the end of its message")
                if not stack:
                    return count, spans
                end, fields = stack.pop()
                continue
            tag = buf[i]
            i += 1
            if tag >= 0x80:
                tag &= 0x7F
                shift = 7
                while True:
                    b = buf[i]
                    i += 1
                    tag |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > 63:
                        raise WireError("varint longer than 10 bytes")
            wire = tag & 7
            if wire == 2:
                ln = buf[i]
                i += 1
                if ln >= 0x80:
                    ln &= 0x7F
                    shift = 7
                    while True:
                        b = buf[i]
                        i += 1
                        ln |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 63:
                            raise WireError("varint longer than 10 bytes")
                number = tag >> 3
                if number in fields:
                    count += 1
                    if count > cap:
                        return count, spans
                    child = fields[number]
                    if child is item_schema:
                        spans += 1
                        if spans > span_cap:
                            return count, spans
                    if child is not None:
                        if len(stack) >= _MAX_DEPTH:
                            raise WireError(f"messages nested deeper than {_MAX_DEPTH}")
                        stack.append((end, fields))
                        end = i + ln
                        if end > n:
                            raise WireError("a message runs past the end of the request")
                        fields = child  # type: ignore[assignment]
                        continue
                i += ln
            elif wire == 0:
                while buf[i] & 0x80:
                    i += 1
                i += 1
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                raise WireError(f"wire type {wire} (groups are not OTLP)")
    except IndexError:
        raise WireError("the request is truncated") from None
