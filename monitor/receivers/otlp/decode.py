"""OTLP trace requests (protobuf bytes or OTLP/JSON) to :class:`SpanRecord` lists.

The decoder is the receiving edge's only contact with protocol types: everything past it
sees :class:`~assaywatch.monitor.spans.SpanRecord`. It is

* **strict where the protocol requires** - an undecodable request raises
  :class:`DecodeError` (the receiver answers 400 / INVALID_ARGUMENT), and a span whose
  trace or span id is missing, of the wrong length or all zeros is rejected
  individually while the rest of its batch is kept (the receiver answers with a partial
  success);
* **tolerant elsewhere** - unknown JSON fields are ignored, int64 values may be numbers
  or decimal strings, enums integers or their names, hex ids any case (and base64 ids,
  which protobuf's ``json_format`` writes, are recognised by their length), snake_case
  keys are accepted beside the lowerCamelCase ones the OTLP/JSON spec prescribes;
* **bounded** - string and bytes values above :attr:`DecodeLimits.max_value_bytes` are
  truncated, attributes beyond :attr:`DecodeLimits.max_attributes` and events beyond
  :attr:`DecodeLimits.max_events` per span are dropped, and each is counted in
  :attr:`DecodeResult.limited`; a request with more than ``max_spans`` spans or
  ``max_elements`` messages is refused before it is built (:class:`DecodeError` with
  status 413), see :mod:`~assaywatch.monitor.receivers.otlp.bounds`;
* **sanitising** - names and label-source values are cut to 256 characters, strings made
  valid UTF-8 and span times checked, each repair counted in :attr:`DecodeResult.sanitised`
  (:mod:`~assaywatch.monitor.receivers.otlp.bounds` has the rules).

Links, trace state, flags and dropped-count fields are not read: no pipeline stage uses
them. Spans of one ``ResourceSpans`` share a single resource dict.

The JSON walker lives in :mod:`assaywatch.monitor.receivers.otlp.decode_json`, which
imports this module; this module holds the shared types and the protobuf path.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from assaywatch.monitor.receivers.otlp.bounds import (
    FUTURE_SLACK_NS,
    LABEL_KEYS,
    MAX_NAME_CHARS,
    MIN_TIME_NS,
    PROTO_WALK_MIN_BYTES,
    SAN_LABEL_TRUNCATED,
    WireError,
    cap_name,
    check_times,
    proto_element_count,
)
from assaywatch.monitor.receivers.spans import (
    ATTR_BYTES,
    EVENT_BYTES,
    RECORD_BYTES,
    AttrValue,
    SpanBatch,
    SpanEvent,
    SpanRecord,
)

try:  # the optional compiled decoder (native/: ``pip install ./native``, needs Rust)
    import assaywatch_native as _native_module
except ImportError:  # pragma: no cover - depends on the install
    _native_module = None


_T = TypeVar("_T")


def _tracked_as_is(obj: _T) -> _T:
    return obj


#: ``gc_untrack(obj)`` returns ``obj`` no longer tracked by the cycle collector (the
#: compiled module's ``untrack``; without it, ``obj`` as is). For long-lived objects that
#: cannot be part of a reference cycle (tuples of strings and numbers, slots objects
#: holding only such values), so young collections stop walking them while reference
#: counting still frees them; the caller vouches for the shape (an untracked cycle leaks).
#: A compiled module built before ``untrack`` existed leaves objects tracked.
gc_untrack: Callable[[_T], _T] = getattr(_native_module, "untrack", None) or _tracked_as_is

__all__ = [
    "DEFAULT_MAX_ATTRIBUTES",
    "DEFAULT_MAX_EVENTS",
    "DEFAULT_MAX_VALUE_BYTES",
    "DecodeError",
    "DecodeLimits",
    "DecodeResult",
    "decode_proto_request",
    "gc_untrack",
    "records_from_request",
]

#: Default cap on one string/bytes attribute value, in bytes (UTF-8 for strings).
DEFAULT_MAX_VALUE_BYTES = 64 * 1024
#: Default cap on attributes kept per span, per event and per resource.
DEFAULT_MAX_ATTRIBUTES = 256
#: Default cap on events kept per span.
DEFAULT_MAX_EVENTS = 128

#: ``limited`` counter labels.
LIMIT_VALUE_TRUNCATED = "attribute_value_truncated"
LIMIT_ATTRIBUTES_DROPPED = "attributes_dropped"
LIMIT_EVENTS_DROPPED = "events_dropped"


class DecodeError(ValueError):
    """A request that cannot be decoded at all.

    Parameters
    ----------
    reason:
        Short counter label (``malformed_protobuf``, ``malformed_json``, ...), used as
        the ``reason`` label of ``assaywatch_spans_rejected_total``.
    message:
        Human-readable explanation returned to the client.
    status:
        HTTP status of the answer: 400 (undecodable) or 413 (more spans or elements than
        the receiver's caps: RESOURCE_EXHAUSTED over gRPC; neither is retried).
    """

    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Per-span resource limits applied while decoding.

    The defaults follow the OTel SDK's own span limits in spirit (128 attributes and
    events there; we allow 256 attributes because GenAI instrumentations set many keys)
    and keep one span's decoded size bounded even for a hostile client.
    """

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_attributes: int = DEFAULT_MAX_ATTRIBUTES
    max_events: int = DEFAULT_MAX_EVENTS
    #: When set, only attributes (of spans, events and resources) whose key is in
    #: ``keep_keys`` or starts with one of ``keep_prefixes`` are converted and kept; the
    #: others are skipped before their value is read. The monitor's receivers set it to
    #: the keys its normalizer reads (reading only what the pipeline needs); None (the
    #: default) keeps every attribute, as readers and tools need.
    keep_keys: frozenset[str] | None = None
    keep_prefixes: tuple[str, ...] = ()
    #: The pipeline's tables for classifying the common GenAI span while decoding
    #: (``pipeline.normalize.native_classify_context``, passed in by whoever wires the
    #: receivers to a pipeline, since the receivers do not depend on it): the compiled
    #: decoder then sets ``SpanRecord.norm``. None (the default): no span is classified
    #: here, the assembler classifies every one.
    classify: Callable[[], dict[str, object]] | None = None
    #: False: a span classified while decoding keeps no attributes (an empty dict): its
    #: ``SpanRecord.norm`` holds what the pipeline reads of them. For a monitor without a
    #: write-ahead log, which would need them to replay the span; building the dict and
    #: dropping it at once saves the memory it would hold while the span waits in the
    #: queue. True (the default): every record keeps its attributes.
    classified_attributes: bool = True

    def __post_init__(self) -> None:
        for name in ("max_value_bytes", "max_attributes", "max_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DecodeLimits.{name} must be an int >= 0, got {value!r}")
        if self.keep_keys is not None and not isinstance(self.keep_keys, frozenset):
            raise ValueError("DecodeLimits.keep_keys must be a frozenset of attribute keys "
                             f"or None, got {type(self.keep_keys).__name__}")
        if not isinstance(self.keep_prefixes, tuple):
            raise ValueError("DecodeLimits.keep_prefixes must be a tuple of key prefixes, "
                             f"got {type(self.keep_prefixes).__name__}")
        if not isinstance(self.classified_attributes, bool):
            raise ValueError("DecodeLimits.classified_attributes must be a bool, got "
                             f"{self.classified_attributes!r}")


DEFAULT_LIMITS = DecodeLimits()


@dataclass(slots=True)
class DecodeResult:
    """Decoded spans plus what was refused or cut.

    Attributes
    ----------
    spans:
        The valid spans, in request order.
    rejected:
        Spans rejected individually, by reason (``missing_trace_id``, ...).
    limited:
        Values truncated and attributes/events dropped by the limits, by kind.
    sanitised:
        Values repaired and kept (invalid UTF-8, names and label values cut to 256
        characters, span times), by reason.
    """

    spans: list[SpanRecord] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    limited: Counter[str] = field(default_factory=Counter)
    sanitised: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_count(self) -> int:
        return sum(self.rejected.values())

    @property
    def error_message(self) -> str:
        """Partial-success message, e.g. ``"rejected 2 spans: missing_trace_id=2"``."""
        if not self.rejected:
            return ""
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items()))
        return f"rejected {self.rejected_count} span(s): {parts}"

    def merge(self, other: DecodeResult) -> None:
        self.spans.extend(other.spans)
        self.rejected.update(other.rejected)
        self.limited.update(other.limited)
        self.sanitised.update(other.sanitised)


# --------------------------------------------------------------------------- values


def cap_str(s: str, cap: int, limited: Counter[str]) -> str:
    """Truncate ``s`` to at most ``cap`` UTF-8 bytes (dropping a split character)."""
    # A str of n characters encodes to at most 4n bytes, so short strings skip encoding.
    if len(s) * 4 <= cap:
        return s
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) <= cap:
        return s
    limited[LIMIT_VALUE_TRUNCATED] += 1
    return raw[:cap].decode("utf-8", "ignore")


def cap_bytes(b: bytes, cap: int, limited: Counter[str]) -> bytes:
    if len(b) <= cap:
        return b
    limited[LIMIT_VALUE_TRUNCATED] += 1
    return b[:cap]


def _proto_any(v: Any, lim: DecodeLimits, limited: Counter[str],
               sanitised: Counter[str]) -> AttrValue:
    which = v.WhichOneof("value")
    if which == "string_value":
        return cap_str(v.string_value, lim.max_value_bytes, limited)
    if which == "int_value":
        return int(v.int_value)
    if which == "bool_value":
        return bool(v.bool_value)
    if which == "double_value":
        return float(v.double_value)
    if which == "array_value":
        return tuple(_proto_any(x, lim, limited, sanitised) for x in v.array_value.values)
    if which == "kvlist_value":
        return cast("dict[str, object]",
                    _proto_attrs(v.kvlist_value.values, lim, limited, sanitised))
    if which == "bytes_value":
        return cap_bytes(bytes(v.bytes_value), lim.max_value_bytes, limited)
    return None  # unset, or string_value_strindex (profiles only)


def _proto_attrs(kvs: Any, lim: DecodeLimits, limited: Counter[str],
                 sanitised: Counter[str]) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    n = len(kvs)
    if n > lim.max_attributes:
        limited[LIMIT_ATTRIBUTES_DROPPED] += n - lim.max_attributes
        kvs = kvs[: lim.max_attributes]
    cap = lim.max_value_bytes
    keep = lim.keep_keys
    prefixes = lim.keep_prefixes
    for kv in kvs:
        key = kv.key  # read once: each read of a upb field makes a new object
        if keep is not None and key not in keep and not key.startswith(prefixes):
            continue  # never read by the pipeline: skip before converting the value
        if len(key) > MAX_NAME_CHARS:
            key = cap_name(key, sanitised)
        v = kv.value
        # Inline the common scalar cases: this loop is the decoder's hot path. Most values
        # are strings, and a non-empty string_value means the oneof holds a string (an
        # unset member reads as its default), so a string costs no WhichOneof call.
        s = v.string_value
        if s:
            if len(s) > MAX_NAME_CHARS and key in LABEL_KEYS:
                s = cap_name(s, sanitised, SAN_LABEL_TRUNCATED)
            out[key] = s if len(s) * 4 <= cap else cap_str(s, cap, limited)
            continue
        which = v.WhichOneof("value")
        if which == "string_value":
            out[key] = s  # the empty string
        elif which == "int_value":
            out[key] = v.int_value
        else:
            out[key] = _proto_any(v, lim, limited, sanitised)
    return out


# --------------------------------------------------------------------------- ids

_ZERO_SPAN_ID = bytes(8)
_ZERO_TRACE_ID = bytes(16)


def check_ids(trace_id: bytes, span_id: bytes, parent: bytes) -> str | None:
    """Reason to reject a span for its ids, or None when they are valid."""
    if not trace_id:
        return "missing_trace_id"
    if len(trace_id) != 16 or not any(trace_id):
        return "invalid_trace_id"
    if not span_id:
        return "missing_span_id"
    if len(span_id) != 8 or not any(span_id):
        return "invalid_span_id"
    if parent and len(parent) != 8:
        return "invalid_parent_span_id"
    return None


# --------------------------------------------------------------------------- protobuf

#: Environment variable that turns the compiled decoder off (``0``) where it is installed.
NATIVE_ENV = "ASSAYWATCH_NATIVE"


def native_available() -> bool:
    """Whether :func:`decode_proto_request` uses the compiled decoder (``assaywatch_native``,
    built from native/ with Rust): installed, and not turned off with
    ``ASSAYWATCH_NATIVE=0`` (read at each call, so a test can compare both paths)."""
    return _native_module is not None and os.environ.get(NATIVE_ENV, "1") != "0"


def value_sizes() -> dict[str, int]:
    """``sys.getsizeof`` of the values the compiled decoder makes, as this interpreter
    gives them (the layout of ``str`` and ``int`` objects differs between CPython
    versions), and the constants of the queue's byte estimate: the decoder computes
    ``batch_bytes`` of its records with them."""
    size = sys.getsizeof
    bits = sys.int_info.bits_per_digit
    return {
        "ascii": size(""),
        # a str of n characters, each k bytes wide: compact + (n + 1) * k
        "compact1": size("\xe9") - 2, "compact2": size("\u0101") - 4,
        "compact4": size("\U0001d11e") - 8,
        "int_zero": size(0), "int_one": size(1), "int_digit": size(1 << bits) - size(1),
        "bits_per_digit": bits, "bool_true": size(True), "bool_false": size(False),
        "float": size(0.0), "none": size(None), "bytes": size(b""),
        "record": RECORD_BYTES, "attr": ATTR_BYTES, "event": EVENT_BYTES,
    }


@functools.lru_cache(maxsize=16)
def _native_decoder(lim: DecodeLimits) -> Any:
    assert _native_module is not None
    keep = None if lim.keep_keys is None else sorted(lim.keep_keys)
    return _native_module.Decoder(
        keep, list(lim.keep_prefixes), sorted(LABEL_KEYS), lim.max_value_bytes,
        lim.max_attributes, lim.max_events, MAX_NAME_CHARS, MIN_TIME_NS, SpanRecord, SpanEvent,
        value_sizes(), classify=None if lim.classify is None else lim.classify(),
        classified_attributes=lim.classified_attributes)


def _native_decode(data: bytes | bytearray, lim: DecodeLimits,
                   max_spans: int | None) -> DecodeResult | None:
    """The compiled decoder's result: the same records and counters as
    :func:`records_from_request` on upb's parse (``tests/monitor/test_native_decode.py``).
    Its records come as a :class:`SpanBatch` carrying the queue's byte estimate, the
    common GenAI span already classified (``SpanRecord.norm``).
    None when its protobuf parser refuses the bytes: upb then decodes them again and has
    the last word, its message or its records."""
    try:
        spans, rejected, limited, sanitised, n_spans, nbytes = _native_decoder(lim).decode(
            bytes(data), time.time_ns() + FUTURE_SLACK_NS, max_spans)
    except ValueError:
        return None
    if spans is None:
        assert max_spans is not None
        raise _too_many_spans(n_spans, max_spans)
    return DecodeResult(SpanBatch(spans, nbytes), Counter(rejected), Counter(limited),
                        Counter(sanitised))



def decode_proto_request(
    data: bytes | bytearray,
    limits: DecodeLimits | None = None,
    *,
    max_spans: int | None = None,
    max_elements: int | None = None,
) -> DecodeResult:
    """Decode a serialized ``ExportTraceServiceRequest`` (or ``TracesData``).

    ``max_spans`` and ``max_elements`` (None: unbounded, as the file readers use it) cap
    the spans and the protobuf messages of the request; the elements are counted on the
    wire before upb builds anything (requests of at least 256 KiB).

    Raises
    ------
    DecodeError
        ``malformed_protobuf`` when the bytes are not a valid message (truncated,
        wrong wire types, invalid UTF-8 in a string field, ...); ``too_many_elements``
        or ``too_many_spans`` (status 413) past the caps.
    """
    if max_elements is not None and len(data) >= PROTO_WALK_MIN_BYTES:
        try:
            n, n_spans = proto_element_count(data, max_elements, max_spans)
        except WireError as exc:
            raise DecodeError(
                "malformed_protobuf",
                f"request body is not a valid ExportTraceServiceRequest ({len(data)} bytes): "
                f"{exc}",
            ) from None
        if n > max_elements:
            raise DecodeError(
                "too_many_elements",
                f"request holds more than {max_elements} messages (spans, attributes, "
                "events, ...); send smaller batches",
                413,
            )
        if max_spans is not None and n_spans > max_spans:
            raise _too_many_spans(n_spans, max_spans, exact=False)
    if _native_module is not None and native_available():
        native = _native_decode(data, limits or DEFAULT_LIMITS, max_spans)
        if native is not None:
            return native
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(data)
    except (_ProtoDecodeError, ValueError, TypeError) as exc:
        raise DecodeError(
            "malformed_protobuf",
            f"request body is not a valid ExportTraceServiceRequest ({len(data)} bytes): {exc}",
        ) from None
    if max_spans is not None:
        n_spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        if n_spans > max_spans:
            raise _too_many_spans(n_spans, max_spans)
    return records_from_request(req, limits)


def _too_many_spans(n: int, max_spans: int, exact: bool = True) -> DecodeError:
    held = f"{n} spans" if exact else f"more than {max_spans} spans"
    return DecodeError(
        "too_many_spans",
        f"request holds {held}, more than the {max_spans} one request may carry (or the "
        "pipeline's queue can ever hold); send smaller batches (BatchSpanProcessor "
        "max_export_batch_size)",
        413,
    )


def records_from_request(
    req: ExportTraceServiceRequest, limits: DecodeLimits | None = None
) -> DecodeResult:
    """Walk an already-parsed ``ExportTraceServiceRequest`` into span records."""
    lim = limits or DEFAULT_LIMITS
    result = DecodeResult()
    spans_out = result.spans
    rejected = result.rejected
    limited = result.limited
    sanitised = result.sanitised
    max_events = lim.max_events
    cap = lim.max_value_bytes
    max_ns = time.time_ns() + FUTURE_SLACK_NS
    # The spans of a trace usually follow each other: they share one hex trace id string.
    last_tid, tid_hex = b"", ""
    for rs in req.resource_spans:
        resource = _proto_attrs(rs.resource.attributes, lim, limited, sanitised)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            if len(scope_name) > MAX_NAME_CHARS:
                scope_name = cap_name(scope_name, sanitised)
            for sp in ss.spans:
                trace_id = sp.trace_id
                span_id = sp.span_id
                parent = sp.parent_span_id
                # Valid ids inline (the hot path); check_ids names what is wrong otherwise.
                if not (len(trace_id) == 16 and len(span_id) == 8
                        and trace_id != _ZERO_TRACE_ID and span_id != _ZERO_SPAN_ID
                        and (not parent or len(parent) == 8)):
                    bad = check_ids(trace_id, span_id, parent)
                    if bad is not None:
                        rejected[bad] += 1
                        continue
                if trace_id != last_tid:
                    last_tid, tid_hex = trace_id, trace_id.hex()
                events: list[SpanEvent] = []
                evs: Any = sp.events  # read once: each read of a upb field makes an object
                if evs:
                    if len(evs) > max_events:
                        limited[LIMIT_EVENTS_DROPPED] += len(evs) - max_events
                        evs = evs[:max_events]
                    events = [
                        SpanEvent(
                            cap_name(e.name, sanitised),
                            e.time_unix_nano,
                            _proto_attrs(e.attributes, lim, limited, sanitised),
                        )
                        for e in evs
                    ]
                status = sp.status
                name = sp.name
                if len(name) > MAX_NAME_CHARS:
                    name = cap_name(name, sanitised)
                message = status.message
                if len(message) * 4 > cap:
                    message = cap_str(message, cap, limited)
                start = sp.start_time_unix_nano
                end = sp.end_time_unix_nano
                if not MIN_TIME_NS <= start <= end <= max_ns:  # else check_times keeps end
                    end = check_times(start, end, max_ns, sanitised)
                # Positional (SpanRecord's field order): cheaper than keywords per span.
                # check_ids left parent empty or 8 bytes: all zeros means no parent.
                spans_out.append(
                    SpanRecord(
                        tid_hex,
                        span_id.hex(),
                        parent.hex() if parent and parent != _ZERO_SPAN_ID else "",
                        name,
                        start,
                        end,
                        sp.kind,
                        status.code,
                        message,
                        _proto_attrs(sp.attributes, lim, limited, sanitised),
                        events,
                        resource,
                        scope_name,
                    )
                )
    return result

