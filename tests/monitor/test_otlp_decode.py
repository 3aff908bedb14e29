"""OTLP decoding: protobuf and OTLP/JSON to SpanRecord, validation and limits."""

from __future__ import annotations

import base64
import copy
import json
import math
from typing import Any

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto_json.collector.trace.v1.trace_service import (
    ExportTraceServiceRequest as JsonRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from assaywatch.monitor.receivers.files import request_to_json
from assaywatch.monitor.receivers.otlp import (
    DecodeError,
    DecodeLimits,
    decode_json_request,
    decode_proto_request,
)
from assaywatch.monitor.receivers.spans import SpanRecord
from tests.monitor.decoders import each_decoder  # noqa: F401 (fixture)

# Every test runs with the Python and the compiled protobuf decoder (tests/monitor/decoders.py).
pytestmark = pytest.mark.usefixtures("each_decoder")

TID = "0af7651916cd43dd8448eb211c80319c"
SID = "b7ad6b7169203331"


def sdk_agent_spans(n_runs: int = 2) -> list[Any]:
    """Finished SDK spans of small agent runs: agent -> chat, tool (error), chat."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "agent-svc", "service.version": "1.2"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("assaywatch.test", "0.1")
    for i in range(n_runs):
        with tracer.start_as_current_span(
            "invoke_agent planner",
            kind=SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"},
        ):
            with tracer.start_as_current_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 100 + i,
                    "gen_ai.request.temperature": 0.25,
                    "gen_ai.response.finish_reasons": ("stop", "length"),
                    "flag": True,
                },
            ) as chat:
                chat.add_event("gen_ai.choice", {"index": 0, "ok": True})
            with tracer.start_as_current_span(
                "execute_tool search", attributes={"gen_ai.tool.name": "search"}
            ) as tool:
                tool.set_status(Status(StatusCode.ERROR, "tool timed out"))
                tool.add_event("exception", {"exception.type": "TimeoutError"})
    provider.shutdown()
    return list(exporter.get_finished_spans())


def assert_matches_sdk(records: list[SpanRecord], sdk_spans: list[Any]) -> None:
    by_id = {r.span_id: r for r in records}
    assert len(by_id) == len(sdk_spans) == len(records)
    for s in sdk_spans:
        r = by_id[format(s.context.span_id, "016x")]
        assert r.trace_id == format(s.context.trace_id, "032x")
        assert r.parent_span_id == (format(s.parent.span_id, "016x") if s.parent else "")
        assert r.name == s.name
        assert r.kind == s.kind.value + 1  # SDK SpanKind INTERNAL=0; OTLP INTERNAL=1
        assert (r.start_ns, r.end_ns) == (s.start_time, s.end_time)
        assert r.status_code == s.status.status_code.value
        assert r.status_message == (s.status.description or "")
        assert r.attributes == {
            k: tuple(v) if isinstance(v, tuple | list) else v for k, v in s.attributes.items()
        }
        assert [(e.name, e.time_ns, e.attributes) for e in r.events] == [
            (e.name, e.timestamp, dict(e.attributes)) for e in s.events
        ]
        assert r.resource == dict(s.resource.attributes)
        assert r.scope_name == s.instrumentation_scope.name


def test_proto_request_decodes_every_field_of_sdk_spans() -> None:
    spans = sdk_agent_spans()
    result = decode_proto_request(encode_spans(spans).SerializeToString())
    assert not result.rejected and not result.limited
    assert_matches_sdk(result.spans, spans)
    # Spans of one ResourceSpans share one resource dict object.
    assert len({id(r.resource) for r in result.spans}) == 1


def test_json_request_decodes_same_records_as_proto() -> None:
    spans = sdk_agent_spans()
    req = encode_spans(spans)
    from_json = decode_json_request(json.dumps(request_to_json(req)))
    assert from_json.spans == decode_proto_request(req.SerializeToString()).spans
    assert_matches_sdk(from_json.spans, spans)


def _pj_any(v: Any) -> Any:
    """Independent reading of an opentelemetry-proto-json AnyValue (cross-check)."""
    if v is None:
        return None
    for name in ("string_value", "bool_value", "int_value", "double_value", "bytes_value"):
        if getattr(v, name) is not None:
            return getattr(v, name)
    if v.array_value is not None:
        return tuple(_pj_any(x) for x in v.array_value.values)
    if v.kvlist_value is not None:
        return {kv.key: _pj_any(kv.value) for kv in v.kvlist_value.values}
    return None


def _pj_records(text: str) -> list[tuple[Any, ...]]:
    out = []
    for rs in JsonRequest.from_json(text).resource_spans:
        res = {kv.key: _pj_any(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {kv.key: _pj_any(kv.value) for kv in s.attributes}
                events = [
                    (e.name, e.time_unix_nano, {kv.key: _pj_any(kv.value) for kv in e.attributes})
                    for e in s.events
                ]
                out.append(
                    (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                     int(s.kind), s.start_time_unix_nano, s.end_time_unix_nano,
                     int(s.status.code), s.status.message, attrs, events, res, ss.scope.name)
                )  # fmt: skip
    return out


def _ours(records: list[SpanRecord]) -> list[tuple[Any, ...]]:
    return [
        (r.trace_id, r.span_id, r.parent_span_id, r.name, r.kind, r.start_ns, r.end_ns,
         r.status_code, r.status_message, r.attributes,
         [(e.name, e.time_ns, e.attributes) for e in r.events], r.resource, r.scope_name)
        for r in records
    ]  # fmt: skip


def tolerant_document() -> dict[str, Any]:
    """Hand-written OTLP/JSON exercising every tolerated form."""
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "a"}}]
                },
                "unknownField": {"x": 1},
                "scopeSpans": [
                    {
                        "scope": {"name": "scope-a"},
                        "spans": [
                            {
                                "traceId": TID.upper(),
                                "spanId": SID.upper(),
                                "name": "root",
                                "kind": 2,
                                "startTimeUnixNano": 1700000000000000001,  # number form
                                "endTimeUnixNano": "1700000000000000999",
                                "status": {"code": 2, "message": "boom"},
                                "attributes": [
                                    {"key": "s", "value": {"stringValue": "x"}},
                                    {"key": "i", "value": {"intValue": "-12"}},
                                    {"key": "i2", "value": {"intValue": 7}},
                                    {"key": "d", "value": {"doubleValue": 2.5}},
                                    {"key": "b", "value": {"boolValue": False}},
                                    {"key": "y", "value": {"bytesValue": "AAH/"}},
                                    {
                                        "key": "arr",
                                        "value": {
                                            "arrayValue": {
                                                "values": [{"stringValue": "p"}, {"intValue": "3"}]
                                            }
                                        },
                                    },
                                    {
                                        "key": "kv",
                                        "value": {
                                            "kvlistValue": {
                                                "values": [
                                                    {"key": "n", "value": {"doubleValue": 1.0}}
                                                ]
                                            }
                                        },
                                    },
                                    {"key": "empty", "value": {}},
                                ],  # fmt: skip
                                "events": [
                                    {
                                        "timeUnixNano": "5",
                                        "name": "e1",
                                        "attributes": [{"key": "k", "value": {"stringValue": "v"}}],
                                    }
                                ],  # fmt: skip
                                "links": [{"traceId": TID, "spanId": SID}],
                            }
                        ],
                    }
                ],
            }
        ]
    }


def test_json_walker_agrees_with_opentelemetry_proto_json() -> None:
    spans = sdk_agent_spans()
    for text in (json.dumps(request_to_json(encode_spans(spans))), json.dumps(tolerant_document())):
        ours = _ours(decode_json_request(text).spans)
        assert ours == _pj_records(text)
        assert ours  # the comparison is over real spans


def test_json_tolerates_case_numbers_unknown_fields_and_any_value_forms() -> None:
    (r,) = decode_json_request(tolerant_document()).spans
    assert (r.trace_id, r.span_id, r.parent_span_id) == (TID, SID, "")
    assert (r.start_ns, r.end_ns, r.kind, r.status_code) == (
        1700000000000000001, 1700000000000000999, 2, 2
    )  # fmt: skip
    assert r.attributes == {
        "s": "x", "i": -12, "i2": 7, "d": 2.5, "b": False, "y": b"\x00\x01\xff",
        "arr": ("p", 3), "kv": {"n": 1.0}, "empty": None,
    }  # fmt: skip
    assert r.events[0].name == "e1" and r.events[0].time_ns == 5


def test_json_accepts_snake_case_enum_names_legacy_scope_and_base64_ids() -> None:
    doc = {
        "resource_spans": [
            {
                "instrumentationLibrarySpans": [
                    {
                        "instrumentationLibrary": {"name": "legacy"},
                        "spans": [
                            {
                                "trace_id": base64.b64encode(bytes.fromhex(TID)).decode(),
                                "span_id": base64.b64encode(bytes.fromhex(SID)).decode(),
                                "parent_span_id": "00" * 8,
                                "kind": "SPAN_KIND_CLIENT",
                                "status": {"code": "STATUS_CODE_OK"},
                                "start_time_unix_nano": "10",
                                "attributes": [
                                    {"key": "d", "value": {"double_value": "NaN"}},
                                    {"key": "s", "value": {"string_value": "snake"}},
                                ],
                            }
                        ],
                    }
                ]
            }
        ]
    }
    (r,) = decode_json_request(json.dumps(doc).encode()).spans
    assert (r.trace_id, r.span_id, r.parent_span_id, r.kind, r.status_code) == (
        TID, SID, "", 3, 1
    )  # fmt: skip
    assert r.scope_name == "legacy" and r.start_ns == 10
    assert math.isnan(r.attributes["d"]) and r.attributes["s"] == "snake"  # type: ignore[arg-type]


BAD_IDS = [
    ({"traceId": ""}, "missing_trace_id"),
    ({"traceId": "00" * 16}, "invalid_trace_id"),
    ({"traceId": "ab" * 15}, "invalid_trace_id"),
    ({"traceId": "zz" * 16}, "invalid_trace_id"),
    ({"spanId": ""}, "missing_span_id"),
    ({"spanId": "00" * 8}, "invalid_span_id"),
    ({"spanId": "ab" * 9}, "invalid_span_id"),
    ({"parentSpanId": "ab" * 4}, "invalid_parent_span_id"),
]


@pytest.mark.parametrize(("patch", "reason"), BAD_IDS)
def test_bad_ids_reject_only_that_span_in_json(patch: dict[str, str], reason: str) -> None:
    doc = tolerant_document()
    good = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    bad = {**copy.deepcopy(good), "spanId": "cd" * 8, **patch}
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"].append(bad)
    result = decode_json_request(doc)
    assert [r.span_id for r in result.spans] == [SID]
    assert result.rejected == {reason: 1}
    assert result.error_message == f"rejected 1 span(s): {reason}=1"


@pytest.mark.parametrize(("patch", "reason"), BAD_IDS[:7] + [({"parentSpanId": "ab"}, "")])
def test_bad_ids_reject_only_that_span_in_proto(patch: dict[str, str], reason: str) -> None:
    spans = sdk_agent_spans(1)
    req = encode_spans(spans)
    target = req.resource_spans[0].scope_spans[0].spans[0]
    key = next(iter(patch))
    try:
        raw = bytes.fromhex(patch[key])
    except ValueError:
        raw = b"\x01" * 3  # non-hex stands for "garbage bytes of the wrong length"
        reason = "invalid_trace_id"
    field = {"traceId": "trace_id", "spanId": "span_id", "parentSpanId": "parent_span_id"}[key]
    setattr(target, field, raw)
    reason = reason or "invalid_parent_span_id"
    result = decode_proto_request(req.SerializeToString())
    assert len(result.spans) == len(spans) - 1
    assert result.rejected == {reason: 1}


def test_limits_truncate_long_values_and_drop_extra_attributes_and_events() -> None:
    big = "é" * (5 * 1024 * 1024)  # 10 MB of UTF-8: 2 bytes per character
    attrs = [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(300)]
    attrs.insert(0, {"key": "big", "value": {"stringValue": big}})
    span = {"traceId": TID, "spanId": SID, "attributes": attrs,
            "events": [{"name": f"e{i}", "timeUnixNano": str(i)} for i in range(200)]}  # fmt: skip
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    (r,) = decode_json_request(doc).spans
    value = r.attributes["big"]
    assert isinstance(value, str)
    # 64 KiB cap falls between the two bytes of a character: the split one is dropped.
    assert len(value.encode()) <= 64 * 1024 and len(value) == 64 * 1024 // 2
    assert len(r.attributes) == 256 and len(r.events) == 128
    result = decode_json_request(doc)
    assert result.limited == {
        "attribute_value_truncated": 1, "attributes_dropped": 301 - 256, "events_dropped": 72
    }  # fmt: skip

    # The protobuf path applies the same limits.
    req = encode_spans(sdk_agent_spans(1))
    target = req.resource_spans[0].scope_spans[0].spans[0]
    target.attributes.add(key="big").value.string_value = big
    small = DecodeLimits(max_value_bytes=1000, max_attributes=300, max_events=0)
    presult = decode_proto_request(req.SerializeToString(), small)
    rec = next(s for s in presult.spans if s.span_id == target.span_id.hex())
    assert rec.attributes["big"] == "é" * 500
    assert presult.limited["attribute_value_truncated"] == 1
    assert all(not s.events for s in presult.spans)


def test_truncated_protobuf_raises_decode_error() -> None:
    data = encode_spans(sdk_agent_spans(1)).SerializeToString()
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError) as info:
            decode_proto_request(data[:cut])
        assert info.value.reason == "malformed_protobuf"
        assert "ExportTraceServiceRequest" in info.value.message


@pytest.mark.parametrize(
    "body", [b"{bad json", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"resourceSpans": 3}']
)
def test_invalid_json_raises_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_json_request(body)
    assert info.value.reason == "malformed_json"


def test_empty_requests_decode_to_nothing() -> None:
    assert decode_proto_request(b"").spans == []
    assert decode_json_request(b"{}").spans == []
    assert decode_json_request({"resourceSpans": []}).spans == []


def test_random_corruption_never_escapes_as_another_exception() -> None:
    """Mutated inputs either decode or raise DecodeError: no other exception type."""
    rng = np.random.default_rng(20260101)
    proto = bytearray(encode_spans(sdk_agent_spans(1)).SerializeToString())
    text = bytearray(json.dumps(request_to_json(encode_spans(sdk_agent_spans(1)))).encode())
    for base, decode in ((proto, decode_proto_request), (text, decode_json_request)):
        for _ in range(600):
            arr = np.frombuffer(bytes(base), dtype=np.uint8).copy()
            idx = rng.integers(0, len(arr), size=int(rng.integers(1, 6)))
            arr[idx] = rng.integers(0, 256, size=len(idx))
            data = arr.tobytes()
            try:
                result = decode(data)
            except DecodeError:
                continue
            assert all(len(s.trace_id) == 32 and len(s.span_id) == 16 for s in result.spans)


def test_decode_limits_validate_arguments() -> None:
    with pytest.raises(ValueError, match="max_attributes"):
        DecodeLimits(max_attributes=-1)


def test_request_to_json_follows_otlp_json_rules() -> None:
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name, sp.kind = bytes.fromhex(TID), bytes.fromhex(SID), "x", 3
    sp.start_time_unix_nano = 2**62
    doc = request_to_json(req)
    out = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert out["traceId"] == TID and out["spanId"] == SID and "parentSpanId" not in out
    assert out["startTimeUnixNano"] == str(2**62) and out["kind"] == 3


# --------------------------------------------------------------------------- hostile input


def test_label_keys_cover_every_key_the_stream_key_and_labels_come_from() -> None:
    """Every attribute the pipeline makes a stream key, tool, model or provider of is
    capped at 256 characters at the edge (receivers/otlp/bounds.py LABEL_KEYS)."""
    from assaywatch.monitor.pipeline import dialects
    from assaywatch.monitor.receivers.otlp.bounds import LABEL_KEYS

    for table in ("SCENARIO_KEYS", "MODEL_KEYS", "PROVIDER_KEYS"):
        assert set(getattr(dialects, table)) <= LABEL_KEYS, table
    assert {"gen_ai.agent.name", "agent.name", "gen_ai.agent.version", "service.name",
            "service.version", "gen_ai.tool.name", "tool.name",
            "traceloop.entity.name"} <= LABEL_KEYS


def test_json_lone_surrogates_long_names_and_times_are_repaired() -> None:
    from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request

    doc = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "s" * 1000}}]},
        "scopeSpans": [{"scope": {"name": "SURR"}, "spans": [
            {"traceId": "01" * 16, "spanId": "02" * 8, "name": "n" * 300,
             "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1",
             "attributes": [{"key": "gen_ai.agent.name", "value": {"stringValue": "aSURR"}}]},
            {"traceId": "01" * 16, "spanId": "03" * 8, "startTimeUnixNano": "-1"},
        ]}]}]}
    body = json.dumps(doc).encode().replace(b"SURR", b"\\ud800")
    result = decode_json_request(body)
    (span,) = result.spans
    assert span.attributes["gen_ai.agent.name"] == "a\ufffd\ufffd\ufffd"
    assert span.scope_name == "\ufffd\ufffd\ufffd" and len(span.name) == 256
    assert len(span.resource["service.name"]) == 256
    assert span.end_ns == span.start_ns  # end before start: clamped
    assert result.rejected == {"invalid_timestamp": 1}
    assert result.sanitised == {"invalid_utf8": 2, "name_truncated": 1,
                                "label_value_truncated": 1, "end_before_start": 1,
                                "time_out_of_range": 1}


def test_request_caps_answer_413_before_building() -> None:
    from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request

    with pytest.raises(DecodeError) as err:
        decode_json_request(b'{"resourceSpans":[' + b"{}," * 5000 + b"{}]}", max_values=1000)
    assert (err.value.status, err.value.reason) == (413, "too_many_values")
    spans = [{"traceId": "01" * 16, "spanId": "02" * 8}] * 11
    with pytest.raises(DecodeError) as err:
        decode_json_request(json.dumps({"resourceSpans": [{"scopeSpans": [
            {"spans": spans}]}]}), max_spans=10)
    assert (err.value.status, err.value.reason) == (413, "too_many_spans")
    empty_spans = b"\x0a\x84\x80\x20\x12\x80\x80\x20" + b"\x12\x00" * (1 << 18)
    with pytest.raises(DecodeError) as err:
        decode_proto_request(empty_spans, max_spans=1000, max_elements=10**6)
    assert (err.value.status, err.value.reason) == (413, "too_many_spans")
