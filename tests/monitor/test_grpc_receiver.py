"""OTLP/gRPC receiver driven by the real OTel SDK exporter and raw grpc calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from assaywatch.monitor.receivers.otlp.grpc_receiver import GrpcReceiver
from assaywatch.monitor.receivers.spans import IngestCounters
from tests.monitor.sdkspans import RecordingSink, assert_received_exactly, sdk_spans

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
R = "otlp_grpc"


class Sink(RecordingSink):
    def __init__(self, refuse: int = 0) -> None:
        super().__init__(R, refuse)


@pytest.fixture
def server() -> Iterator[tuple[GrpcReceiver, Sink, IngestCounters, int]]:
    sink, counters = Sink(), IngestCounters()
    rec = GrpcReceiver(sink, counters, port=0, max_message_bytes=1 << 20, retry_delay_s=0.1)
    port = rec.start()
    yield rec, sink, counters, port
    rec.stop(0)


def raw_call(port: int, data: bytes, **kw: Any) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return ch.unary_unary(METHOD)(data, timeout=5, **kw)


def assert_still_serving(port: int, sink: Sink) -> None:
    before = len(sink.spans)
    spans = sdk_spans(1)
    resp = ExportTraceServiceResponse.FromString(raw_call(port, _bytes(spans)))
    assert not resp.HasField("partial_success")
    assert len(sink.spans) == before + len(spans)


def _bytes(spans: list[Any]) -> bytes:
    return encode_spans(spans).SerializeToString()


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip])
def test_real_exporter_delivers_exact_spans(server: Any, compression: grpc.Compression) -> None:
    _, sink, counters, port = server
    spans = sdk_spans(3)
    exporter = OTLPSpanExporter(
        endpoint=f"127.0.0.1:{port}", insecure=True, compression=compression, timeout=5
    )
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert_received_exactly(sink.spans, spans)
    assert counters.received[R] == len(spans)


def test_truncated_protobuf_gets_invalid_argument_and_is_counted(server: Any) -> None:
    _, sink, counters, port = server
    data = _bytes(sdk_spans(1))
    with pytest.raises(grpc.RpcError) as info:
        raw_call(port, data[: len(data) // 2])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid ExportTraceServiceRequest" in info.value.details()
    assert counters.rejected[(R, "malformed_protobuf")] == 1
    assert sink.spans == []
    assert_still_serving(port, sink)


def test_oversized_and_gzip_bomb_get_resource_exhausted(server: Any) -> None:
    _, sink, _, port = server
    with pytest.raises(grpc.RpcError) as info:
        raw_call(port, b"\x00" * (2 << 20))
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    # 64 MiB of zeros compresses to ~64 KiB: under the wire cap, over it once inflated.
    with pytest.raises(grpc.RpcError) as info:
        raw_call(port, b"\x00" * (64 << 20), compression=grpc.Compression.Gzip)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serving(port, sink)


def test_missing_ids_give_partial_success(server: Any) -> None:
    _, sink, counters, port = server
    spans = sdk_spans(1)
    req = encode_spans(spans)
    bad = req.resource_spans[0].scope_spans[0].spans
    bad[0].trace_id = b""
    bad[1].span_id = b"\x00" * 8
    resp = ExportTraceServiceResponse.FromString(raw_call(port, req.SerializeToString()))
    assert resp.partial_success.rejected_spans == 2
    assert "missing_trace_id=1" in resp.partial_success.error_message
    assert len(sink.spans) == len(spans) - 2
    assert counters.rejected[(R, "missing_trace_id")] == 1
    assert counters.rejected[(R, "invalid_span_id")] == 1
    assert counters.received[R] == len(spans) - 2


def test_big_attribute_is_truncated_when_message_fits_the_cap() -> None:
    sink, counters = Sink(), IngestCounters()
    with GrpcReceiver(sink, counters, port=0, max_message_bytes=16 << 20) as rec:
        assert rec.bound_port
        spans = sdk_spans(1)
        req = encode_spans(spans)
        req.resource_spans[0].scope_spans[0].spans[0].attributes.add(
            key="big"
        ).value.string_value = "x" * (10 << 20)
        raw_call(rec.bound_port, req.SerializeToString())
    (big,) = [s for s in sink.spans if "big" in s.attributes]
    assert big.attributes["big"] == "x" * (64 * 1024)
    assert counters.dropped["attribute_value_truncated"] == 1


def test_overload_sends_unavailable_with_retry_info(server: Any) -> None:
    rec, sink, counters, port = server
    sink.refuse = 1
    with pytest.raises(grpc.RpcError) as info:
        raw_call(port, _bytes(sdk_spans(1)))
    err = info.value
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    trailers = dict(err.trailing_metadata())
    retry = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert retry.retry_delay.ToTimedelta().total_seconds() == pytest.approx(rec.retry_delay_s)
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == code_pb2.UNAVAILABLE and status.details[0].Is(retry.DESCRIPTOR)
    assert counters.rejected[(R, "pipeline_full")] == 3


def test_real_exporter_retries_after_unavailable_and_succeeds(server: Any) -> None:
    rec, sink, counters, port = server
    sink.refuse = 2
    spans = sdk_spans(1)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=10)
    t0 = time.monotonic()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    elapsed = time.monotonic() - t0
    exporter.shutdown()
    assert sink.offers == 3  # two refusals, then the accepted retry
    assert_received_exactly(sink.spans, spans)
    # The exporter waited the advertised RetryInfo delay (0.1 s) twice, not its own
    # exponential backoff (1 s, 2 s): so between 0.2 s and well under 1 s.
    assert 2 * rec.retry_delay_s <= elapsed < 1.0
    assert counters.rejected[(R, "pipeline_full")] == 2 * len(spans)


class BlockingSink(Sink):
    """Holds every offer until ``release`` is set: the workers stay busy."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def offer(self, spans: list[Any], receiver: str) -> bool:
        assert self.release.wait(20)
        return super().offer(spans, receiver)


def _call_all(port: int, body: bytes, n: int, timeout: float) -> list[Any]:
    """``n`` calls at once, each on its own channel: (code, trailers) each."""
    out: list[Any] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def one() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(METHOD)
            grpc.channel_ready_future(ch).result(timeout=10)
            start.wait()
            try:
                call(body, timeout=timeout)
                got = (grpc.StatusCode.OK, {})
            except grpc.RpcError as err:
                got = (err.code(), dict(err.trailing_metadata() or ()))
        with lock:
            out.append(got)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return [threads, out]


def test_calls_beyond_the_cap_are_told_to_retry_and_counted() -> None:
    """30 calls at once at 2 workers and a cap of 4 calls in progress or waiting: the 4
    first are served, every other is answered UNAVAILABLE with the retry hint (never
    grpc's RESOURCE_EXHAUSTED, which OTLP clients do not retry) and counted as
    decoder_busy; calls that gave up while waiting are counted out, so the cap is free
    again after them."""
    sink, counters = BlockingSink(), IngestCounters()
    rec = GrpcReceiver(sink, counters, port=0, max_workers=2, max_concurrent_rpcs=4,
                       retry_delay_s=0.1)
    port = rec.start()
    try:
        body = _bytes(sdk_spans(1))
        threads, out = _call_all(port, body, 30, timeout=15)
        time.sleep(1.0)  # every call has arrived; the two workers wait on the sink
        sink.release.set()
        for t in threads:
            t.join(20)
        codes = [c for c, _ in out]
        assert len(codes) == 30
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
        assert codes.count(grpc.StatusCode.OK) == 4, codes
        assert counters.rejected[(R, "decoder_busy")] == codes.count(grpc.StatusCode.UNAVAILABLE)
        for code, trailers in out:
            if code is grpc.StatusCode.UNAVAILABLE:
                retry = error_details_pb2.RetryInfo.FromString(
                    trailers["google.rpc.retryinfo-bin"])
                assert retry.retry_delay.ToTimedelta().total_seconds() == pytest.approx(0.1)
        assert sink.offers == 4
        # calls that time out while they wait are counted out: afterwards the cap is free
        sink.release.clear()
        threads, out = _call_all(port, body, 4, timeout=0.5)
        for t in threads:
            t.join(20)
        assert [c for c, _ in out] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 4
        sink.release.set()
        time.sleep(0.5)  # the workers finish the calls their clients gave up on
        busy = counters.rejected[(R, "decoder_busy")]
        assert_still_serving(port, sink)
        assert counters.rejected[(R, "decoder_busy")] == busy
    finally:
        sink.release.set()
        rec.stop(0)


def test_calls_past_grpcs_own_limit_are_counted() -> None:
    """A cap of 2 calls in progress or waiting and grpc's own limit at 4, 12 calls at once
    while the workers wait on the sink: 2 are served, 2 told to retry (UNAVAILABLE,
    decoder_busy) and the 8 others refused by grpc itself (RESOURCE_EXHAUSTED), each of
    those counted as too_many_calls."""
    sink, counters = BlockingSink(), IngestCounters()
    rec = GrpcReceiver(sink, counters, port=0, max_workers=1, max_concurrent_rpcs=2,
                       max_queued_rpcs=4, retry_delay_s=0.1)
    port = rec.start()
    try:
        threads, out = _call_all(port, _bytes(sdk_spans(1)), 12, timeout=15)
        time.sleep(1.0)
        sink.release.set()
        for t in threads:
            t.join(20)
        codes = [c for c, _ in out]
        assert sorted(codes, key=str) == sorted(
            [grpc.StatusCode.OK] * 2 + [grpc.StatusCode.UNAVAILABLE] * 2
            + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8, key=str), codes
        assert counters.rejected[(R, "decoder_busy")] == 2
        assert counters.rejected[(R, "too_many_calls")] == 8
    finally:
        sink.release.set()
        rec.stop(0)


def test_invalid_constructor_arguments_raise() -> None:
    with pytest.raises(ValueError, match="port"):
        GrpcReceiver(Sink(), IngestCounters(), port=70000)
    with pytest.raises(ValueError, match="max_workers"):
        GrpcReceiver(Sink(), IngestCounters(), max_workers=0)
