"""The protobuf decoder's inlined hot paths give what the general code gives: a string
read without ``WhichOneof`` (and every value that is not a non-empty string), ids checked
inline, times checked inline, one hex trace id per trace."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from assaywatch.monitor.receivers.otlp.bounds import MIN_TIME_NS
from assaywatch.monitor.receivers.otlp.decode import DecodeLimits, decode_proto_request
from tests.monitor.decoders import each_decoder  # noqa: F401 (fixture)

# Every test runs with the Python and the compiled protobuf decoder (tests/monitor/decoders.py).
pytestmark = pytest.mark.usefixtures("each_decoder")

T1 = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
T2 = bytes.fromhex("1af7651916cd43dd8448eb211c80319d")
START = 1_700_000_000 * 10**9


def _request(spans: list[Span]) -> bytes:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.extend(spans)
    return req.SerializeToString()


def _span(trace_id: bytes = T1, span_id: bytes = b"\x01" * 8, parent: bytes = b"",
          attributes: list[KeyValue] | None = None, start: int = START,
          end: int = START + 10) -> Span:
    return Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="s",
                start_time_unix_nano=start, end_time_unix_nano=end,
                attributes=attributes or [])


def test_every_value_kind_decodes_to_its_python_value() -> None:
    values = {
        "s": AnyValue(string_value="chat"), "empty": AnyValue(string_value=""),
        "zero": AnyValue(int_value=0), "n": AnyValue(int_value=-7),
        "f": AnyValue(bool_value=False), "t": AnyValue(bool_value=True),
        "d0": AnyValue(double_value=0.0), "d": AnyValue(double_value=2.5),
        "b0": AnyValue(bytes_value=b""), "unset": AnyValue(),
    }
    body = _request([_span(attributes=[KeyValue(key=k, value=v) for k, v in values.items()])])
    for limits in (None, DecodeLimits(keep_keys=frozenset(values))):
        attrs = decode_proto_request(body, limits).spans[0].attributes
        assert attrs == {"s": "chat", "empty": "", "zero": 0, "n": -7, "f": False, "t": True,
                         "d0": 0.0, "d": 2.5, "b0": b"", "unset": None}
        assert type(attrs["f"]) is bool and type(attrs["d0"]) is float


def test_long_strings_are_still_capped_and_label_values_cut() -> None:
    body = _request([_span(attributes=[
        KeyValue(key="gen_ai.agent.name", value=AnyValue(string_value="a" * 300)),
        KeyValue(key="note", value=AnyValue(string_value="é" * 40)),
    ])])
    result = decode_proto_request(body, DecodeLimits(max_value_bytes=50))
    attrs = result.spans[0].attributes
    assert attrs["gen_ai.agent.name"] == "a" * 50  # cut to 256 chars, then to 50 bytes
    assert attrs["note"] == "é" * 25  # 2 bytes a character
    assert result.sanitised["label_value_truncated"] == 1
    assert result.limited["attribute_value_truncated"] == 2


def test_ids_checked_inline_reject_what_check_ids_rejects() -> None:
    cases = [
        (_span(trace_id=bytes(16)), "invalid_trace_id"),
        (_span(trace_id=T1[:15]), "invalid_trace_id"),
        (_span(trace_id=b""), "missing_trace_id"),
        (_span(span_id=bytes(8)), "invalid_span_id"),
        (_span(span_id=b"\x01" * 9), "invalid_span_id"),
        (_span(span_id=b""), "missing_span_id"),
        (_span(parent=b"\x02" * 4), "invalid_parent_span_id"),
    ]
    good = [_span(span_id=b"\x03" * 8, parent=bytes(8)), _span(span_id=b"\x04" * 8,
                                                               parent=b"\x03" * 8)]
    result = decode_proto_request(_request([c for c, _ in cases] + good))
    assert sorted(result.rejected.elements()) == sorted(r for _, r in cases)
    assert [(s.span_id, s.parent_span_id) for s in result.spans] == [
        ("03" * 8, ""), ("04" * 8, "03" * 8)]  # an all-zero parent is no parent


def test_trace_ids_of_interleaved_traces_are_right_and_shared_within_a_run() -> None:
    spans = [_span(T1, b"\x01" * 8), _span(T1, b"\x02" * 8), _span(T2, b"\x03" * 8),
             _span(T1, b"\x04" * 8)]
    out = decode_proto_request(_request(spans)).spans
    assert [s.trace_id for s in out] == [T1.hex(), T1.hex(), T2.hex(), T1.hex()]
    assert out[0].trace_id is out[1].trace_id  # consecutive spans of a trace: one string


def test_times_checked_inline_count_what_check_times_counts() -> None:
    spans = [_span(span_id=b"\x01" * 8),  # fine
             _span(span_id=b"\x02" * 8, start=START, end=START - 5),  # ends before start
             _span(span_id=b"\x03" * 8, start=MIN_TIME_NS - 1, end=START),  # too early
             _span(span_id=b"\x04" * 8, start=START, end=START)]  # zero length: fine
    result = decode_proto_request(_request(spans))
    assert [s.end_ns for s in result.spans] == [START + 10, START, START, START]
    assert dict(result.sanitised) == {"end_before_start": 1, "time_out_of_range": 1}
