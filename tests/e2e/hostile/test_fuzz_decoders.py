"""Seeded, bounded fuzzing of the OTLP decoders (hypothesis): no crash, every output
sanitised, the protobuf pre-walk agreeing with upb, and no memory kept between requests.

Runs in-process (the decoders are pure functions); the receivers' wiring of them is what
the rest of tests/e2e/hostile exercises against a monitor process.
"""

from __future__ import annotations

import gc
import json
import math
import tracemalloc
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from assaywatch.monitor.receivers.otlp.bounds import (
    LABEL_KEYS,
    MAX_NAME_CHARS,
    proto_element_count,
)
from assaywatch.monitor.receivers.otlp.decode import (
    DecodeError,
    DecodeLimits,
    DecodeResult,
    decode_proto_request,
)
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request
from assaywatch.monitor.service.wal import decode_batch, encode_batch
from tests.monitor.sdkspans import same_values

#: The record fields the write-ahead log keeps (events compared on their own).
SPAN_FIELDS = ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns", "kind",
               "status_code", "status_message", "attributes", "resource", "scope_name")
FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CAPS = {"max_spans": 50, "max_elements": 5_000}

# Any code point, lone surrogates included (hypothesis leaves them out by default).
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
               max_size=40) | st.sampled_from(["x" * 300, "\ud800", "a\udfffb", ""])
KEYS = st.sampled_from(sorted(LABEL_KEYS)[:8] + ["k", "gen_ai.usage.input_tokens"]) | TEXT
JUNK = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT


def _json_value(leaf: Any) -> Any:
    return st.one_of(
        st.fixed_dictionaries({"stringValue": TEXT}),
        st.fixed_dictionaries({"intValue": st.integers(-(2**70), 2**70) | TEXT}),
        st.fixed_dictionaries({"doubleValue": st.floats() | TEXT}),
        st.fixed_dictionaries({"boolValue": JUNK}),
        st.fixed_dictionaries({"bytesValue": TEXT}),
        st.fixed_dictionaries({"arrayValue": st.fixed_dictionaries(
            {"values": st.lists(leaf, max_size=3)})}),
        st.fixed_dictionaries({"kvlistValue": st.fixed_dictionaries(
            {"values": st.lists(st.fixed_dictionaries({"key": KEYS, "value": leaf}),
                                max_size=3)})}),
        JUNK,
    )


JSON_VALUE = st.recursive(st.fixed_dictionaries({"stringValue": TEXT}), _json_value,
                          max_leaves=8)
JSON_ATTRS = st.lists(st.fixed_dictionaries({"key": KEYS, "value": JSON_VALUE}), max_size=6)
HEX = st.sampled_from(["", "0" * 32, "ab" * 16, "AB" * 8, "zz" * 16, "q" * 24, "01" * 8])
TIME = st.integers(-5, 2**65) | st.sampled_from(["1e999", "12", "-1", str(2**64)]) | JUNK
JSON_SPAN = st.fixed_dictionaries({
    "traceId": HEX | st.just("5b8efff798038103d269b633813fc60c"),
    "spanId": HEX | st.just("eee19b7ec3c1b174"),
    "parentSpanId": HEX,
    "name": TEXT | JUNK,
    "kind": st.integers(-3, 9) | TEXT | JUNK,
    "startTimeUnixNano": TIME,
    "endTimeUnixNano": TIME,
    "attributes": JSON_ATTRS | JUNK,
    "events": st.lists(st.fixed_dictionaries({"name": TEXT, "timeUnixNano": TIME,
                                              "attributes": JSON_ATTRS}), max_size=2) | JUNK,
    "status": st.fixed_dictionaries({"code": st.integers(-1, 3) | JUNK,
                                     "message": TEXT | JUNK}) | JUNK,
}) | JUNK
JSON_DOC = st.fixed_dictionaries({"resourceSpans": st.lists(st.fixed_dictionaries({
    "resource": st.fixed_dictionaries({"attributes": JSON_ATTRS}) | JUNK,
    "scopeSpans": st.lists(st.fixed_dictionaries({
        "scope": st.fixed_dictionaries({"name": TEXT | JUNK}) | JUNK,
        "spans": st.lists(JSON_SPAN, max_size=4) | JUNK,
    }), max_size=2) | JUNK,
}), max_size=2) | JUNK})


def _strings(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, tuple):
        return [s for x in v for s in _strings(x)]
    if isinstance(v, dict):
        return [s for k, x in v.items() for s in [k, *_strings(x)]]
    return []


def check_sanitised(result: DecodeResult) -> None:
    assert len(result.spans) <= CAPS["max_spans"]
    for sp in result.spans:
        texts = [sp.name, sp.scope_name, sp.status_message, *_strings(sp.attributes),
                 *_strings(sp.resource)]
        for ev in sp.events:
            texts += [ev.name, *_strings(ev.attributes)]
        for s in texts:
            s.encode("utf-8")  # no lone surrogate survives
        assert len(sp.name) <= MAX_NAME_CHARS and len(sp.scope_name) <= MAX_NAME_CHARS
        for attrs in (sp.attributes, sp.resource):
            for k, v in attrs.items():
                assert len(k) <= MAX_NAME_CHARS
                if k in LABEL_KEYS and isinstance(v, str):
                    assert len(v) <= MAX_NAME_CHARS
        assert 0 <= sp.start_ns <= sp.end_ns < 2**64


@seed(20260515)
@FUZZ
@given(doc=JSON_DOC, raw=st.booleans())
def test_json_decoder_never_crashes_and_sanitises(doc: dict[str, Any], raw: bool) -> None:
    body = json.dumps(doc, allow_nan=True).encode()
    if raw:  # the same surrogates as raw bytes, which json.loads also accepts
        body = body.replace(b"\\ud800", b"\xed\xa0\x80")
    try:
        result = decode_json_request(body, DecodeLimits(), max_spans=CAPS["max_spans"],
                                     max_values=CAPS["max_elements"])
    except DecodeError as err:
        assert err.status in (400, 413)
        return
    check_sanitised(result)


#: Spans the decoder keeps (valid ids and times) with hostile attribute values.
KEPT_ATTRS = st.lists(st.fixed_dictionaries({"key": KEYS, "value": st.one_of(
    st.fixed_dictionaries({"doubleValue": st.sampled_from([math.nan, math.inf, -math.inf])
                           | st.floats()}),
    st.fixed_dictionaries({"intValue": st.integers(-(2**63), 2**63 - 1)}),
    st.fixed_dictionaries({"bytesValue": st.sampled_from(["", "AAE=", "/w=="])}),
    JSON_VALUE)}), min_size=1, max_size=6)
KEPT_DOC = st.fixed_dictionaries({"resourceSpans": st.lists(st.fixed_dictionaries({
    "resource": st.fixed_dictionaries({"attributes": KEPT_ATTRS}),
    "scopeSpans": st.lists(st.fixed_dictionaries({"spans": st.lists(st.fixed_dictionaries({
        "traceId": st.just("5b8efff798038103d269b633813fc60c"),
        "spanId": st.sampled_from(["eee19b7ec3c1b174", "0102030405060708"]),
        "name": TEXT, "startTimeUnixNano": st.integers(1, 2**62),
        "endTimeUnixNano": st.integers(1, 2**62), "attributes": KEPT_ATTRS,
        "events": st.lists(st.fixed_dictionaries({"name": TEXT, "timeUnixNano": TIME,
                                                  "attributes": KEPT_ATTRS}), max_size=2),
    }), min_size=1, max_size=3)}), min_size=1, max_size=2),
}), min_size=1, max_size=2)})


@seed(20260518)
@FUZZ
@given(doc=KEPT_DOC | JSON_DOC)
def test_every_decoded_batch_comes_back_from_the_write_ahead_log(doc: dict[str, Any]) -> None:
    """What the JSON decoder accepts from a hostile document (floats NaN and infinite,
    integers of any size, bytes, nested arrays and maps) is written to the write-ahead log
    (orjson, or json where orjson would not write it exactly) and read back equal."""
    body = json.dumps(doc, allow_nan=True).encode()
    try:
        result = decode_json_request(body, DecodeLimits(), max_spans=CAPS["max_spans"],
                                     max_values=CAPS["max_elements"])
    except DecodeError:
        return
    receiver, back = decode_batch(encode_batch("otlp_http", result.spans))
    assert receiver == "otlp_http" and len(back) == len(result.spans)
    for sent, got in zip(result.spans, back, strict=True):
        assert same_values([getattr(sent, f) for f in SPAN_FIELDS],
                     [getattr(got, f) for f in SPAN_FIELDS])
        assert same_values([(e.name, e.time_ns, e.attributes) for e in sent.events],
                     [(e.name, e.time_ns, e.attributes) for e in got.events])


def _any_value(depth: int) -> Any:
    leaf = st.one_of(
        st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=20) |
                  st.just("y" * 300)),
        st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda d: AnyValue(double_value=d), st.floats()),
        st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=10)),
        st.just(AnyValue()),
    )
    if depth == 0:
        return leaf

    def array(vals: list[Any]) -> AnyValue:
        v = AnyValue()
        v.array_value.values.extend(vals)
        return v

    def kvlist(kvs: list[tuple[str, Any]]) -> AnyValue:
        v = AnyValue()
        v.kvlist_value.values.extend(KeyValue(key=k, value=x) for k, x in kvs)
        return v

    sub = _any_value(depth - 1)
    return leaf | st.builds(array, st.lists(sub, max_size=3)) | st.builds(
        kvlist, st.lists(st.tuples(st.text(max_size=5), sub), max_size=3))


PROTO_ATTRS = st.lists(st.tuples(st.sampled_from(sorted(LABEL_KEYS)[:6] + ["k" * 300, "k"]),
                                 _any_value(2)), max_size=5)


@st.composite
def proto_requests(draw: Any) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(KeyValue(key=k, value=v) for k, v in draw(PROTO_ATTRS))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(st.text(max_size=5) | st.just("s" * 300))
            for _ in range(draw(st.integers(0, 3))):
                sp = ss.spans.add(
                    trace_id=draw(st.sampled_from([b"", b"\x01" * 16, b"\x00" * 16, b"\x02"])),
                    span_id=draw(st.sampled_from([b"", b"\x03" * 8, b"\x04"])),
                    name=draw(st.text(max_size=10) | st.just("n" * 300)),
                    start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
                    end_time_unix_nano=draw(st.integers(0, 2**64 - 1)))
                sp.attributes.extend(KeyValue(key=k, value=v) for k, v in draw(PROTO_ATTRS))
                for _ in range(draw(st.integers(0, 2))):
                    ev = sp.events.add(name=draw(st.text(max_size=5)))
                    ev.attributes.extend(KeyValue(key=k, value=v)
                                         for k, v in draw(PROTO_ATTRS))
                for _ in range(draw(st.integers(0, 1))):
                    sp.links.add(trace_id=b"\x05" * 16, span_id=b"\x06" * 8)
    return req


def _messages(msg: Any) -> int:
    """Sub-messages of a parsed message, as upb allocates them."""
    n = 0
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        items = value if fd.is_repeated else [value]
        for item in items:
            n += 1 + _messages(item)
    return n


@seed(20260516)
@FUZZ
@given(req=proto_requests())
def test_proto_walker_counts_what_upb_builds(req: ExportTraceServiceRequest) -> None:
    data = req.SerializeToString()
    parsed = ExportTraceServiceRequest.FromString(data)
    spans = sum(len(ss.spans) for rs in parsed.resource_spans for ss in rs.scope_spans)
    assert proto_element_count(data, 10**9) == (_messages(parsed), spans)
    result = decode_proto_request(data, DecodeLimits(), max_spans=CAPS["max_spans"],
                                  max_elements=CAPS["max_elements"])
    check_sanitised(result)


@seed(20260517)
@FUZZ
@given(req=proto_requests(), cuts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                           min_size=1, max_size=4), truncate=st.booleans())
def test_proto_decoder_survives_corrupted_bytes(req: ExportTraceServiceRequest,
                                                cuts: list[tuple[int, int]],
                                                truncate: bool) -> None:
    data = bytearray(req.SerializeToString() or b"\x0a\x00")
    for pos, byte in cuts:
        data[pos % len(data)] = byte
    if truncate:
        data = data[: len(data) // 2]
    for walk in (False, True):
        try:
            if walk:  # the pre-walk of large requests must agree with upb or refuse
                proto_element_count(bytes(data), CAPS["max_elements"])
            result = decode_proto_request(bytes(data), DecodeLimits(),
                                          max_spans=CAPS["max_spans"],
                                          max_elements=CAPS["max_elements"])
        except DecodeError as err:
            assert err.status in (400, 413)
            continue
        except Exception as exc:  # the walker's WireError is the only other outcome
            assert walk and type(exc).__name__ == "WireError", exc
            continue
        check_sanitised(result)


def test_decoding_keeps_no_memory_between_requests() -> None:
    """Decode many varied requests; what stays allocated afterwards does not grow."""
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="n" * 1000)
    sp.attributes.add(key="gen_ai.agent.name", value=AnyValue(string_value="a" * 5000))
    data = req.SerializeToString()
    doc = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "01" * 16, "spanId": "02" * 8, "name": "x\\ud800" * 200,
         "attributes": [{"key": "k", "value": {"stringValue": "\\udfff" * 100}}]}]}]}]})
    body = doc.encode().replace(b"\\\\", b"\\")

    def once() -> None:
        for _ in range(200):
            decode_proto_request(data, max_spans=10, max_elements=100)
            decode_json_request(body, max_spans=10, max_values=100)

    once()  # warm caches (interned strings, lazily built tables)
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(3):
            once()
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - start < 256 * 1024, f"{end - start} bytes kept after 1,200 requests"
