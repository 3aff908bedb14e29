"""OTLP/HTTP receiver: real SDK exporter, JSON bodies, and every hostile input."""

from __future__ import annotations

import gzip
import json
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from assaywatch.monitor.receivers.files import request_to_json
from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver
from assaywatch.monitor.receivers.spans import IngestCounters
from tests.monitor.sdkspans import RecordingSink, assert_received_exactly, sdk_spans

R = "otlp_http"
PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


class Sink(RecordingSink):
    def __init__(self, refuse: int = 0) -> None:
        super().__init__(R, refuse)


@pytest.fixture
def server() -> Iterator[tuple[HttpReceiver, Sink, IngestCounters, str]]:
    sink, counters = Sink(), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, retry_after_s=0)
    port = rec.start()
    yield rec, sink, counters, f"http://127.0.0.1:{port}/v1/traces"
    rec.stop()


def proto_body(spans: list[Any]) -> bytes:
    return encode_spans(spans).SerializeToString()


def assert_still_serving(url: str, sink: Sink) -> None:
    before = len(sink.spans)
    spans = sdk_spans(1)
    resp = requests.post(url, data=proto_body(spans), headers=PB, timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == PB["Content-Type"]
    assert len(sink.spans) == before + len(spans)


def rpc_status(resp: requests.Response) -> status_pb2.Status:
    return status_pb2.Status.FromString(resp.content)


def test_an_answer_goes_out_in_one_write(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # headers and body in one write: one system call and one wait for the interpreter
    # lock (two writes also waited for the client's delayed ACK without TCP_NODELAY)
    import socketserver

    _, sink, _, url = server
    writes: list[bytes] = []
    real = socketserver._SocketWriter.write  # type: ignore[attr-defined]

    def write(self: Any, b: Any) -> int:
        writes.append(bytes(b))
        return real(self, b)  # type: ignore[no-any-return]

    monkeypatch.setattr(socketserver._SocketWriter, "write", write)  # type: ignore[attr-defined]
    with requests.Session() as session:
        for _ in range(2):  # a keep-alive connection: two answers, two writes
            resp = session.post(url, data=proto_body(sdk_spans(1)), headers=PB, timeout=5)
            assert resp.status_code == 200
    assert len(writes) == 2
    assert all(w.startswith(b"HTTP/1.1 200") and w.endswith(b"\r\n\r\n" + resp.content)
               for w in writes)


@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate]
)
def test_real_exporter_delivers_exact_spans(server: Any, compression: Compression) -> None:
    _, sink, counters, url = server
    spans = sdk_spans(3)
    exporter = OTLPSpanExporter(endpoint=url, compression=compression, timeout=5)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert_received_exactly(sink.spans, spans)
    assert counters.received[R] == len(spans)


def test_json_body_gets_json_answer_with_partial_success(server: Any) -> None:
    _, sink, counters, url = server
    spans = sdk_spans(1)
    doc = request_to_json(encode_spans(spans))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "00" * 16
    resp = requests.post(url, data=json.dumps(doc), headers=JS, timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "application/json"
    partial = resp.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "invalid_trace_id=1" in partial["errorMessage"]
    assert len(sink.spans) == len(spans) - 1
    assert counters.rejected[(R, "invalid_trace_id")] == 1
    # A clean JSON request gets an empty response object.
    ok = requests.post(url, data=json.dumps(request_to_json(encode_spans(spans))), headers=JS)
    assert ok.status_code == 200 and ok.json() == {}


def test_proto_partial_success_for_missing_ids(server: Any) -> None:
    _, sink, _, url = server
    req = encode_spans(sdk_spans(1))
    req.resource_spans[0].scope_spans[0].spans[1].span_id = b""
    resp = requests.post(url, data=req.SerializeToString(), headers=PB, timeout=5)
    body = ExportTraceServiceResponse.FromString(resp.content)
    assert resp.status_code == 200 and body.partial_success.rejected_spans == 1
    assert "missing_span_id" in body.partial_success.error_message


def test_truncated_protobuf_gets_400_status_with_bad_request(server: Any) -> None:
    _, sink, counters, url = server
    data = proto_body(sdk_spans(1))
    resp = requests.post(url, data=data[:-7], headers=PB, timeout=5)
    assert resp.status_code == 400 and resp.headers["Content-Type"] == PB["Content-Type"]
    st = rpc_status(resp)
    assert st.code == code_pb2.INVALID_ARGUMENT and "ExportTraceServiceRequest" in st.message
    assert st.details[0].Is(error_details_pb2.BadRequest.DESCRIPTOR)
    assert counters.rejected[(R, "malformed_protobuf")] == 1
    assert_still_serving(url, sink)


def test_invalid_json_gets_400_json_status(server: Any) -> None:
    _, sink, counters, url = server
    resp = requests.post(url, data=b'{"resourceSpans": [', headers=JS, timeout=5)
    assert resp.status_code == 400 and resp.json()["code"] == code_pb2.INVALID_ARGUMENT
    assert counters.rejected[(R, "malformed_json")] == 1
    assert_still_serving(url, sink)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"Content-Type": "text/plain"}, "unsupported_content_type"),
        ({}, "unsupported_content_type"),
        ({**PB, "Content-Encoding": "br"}, "unsupported_encoding"),
    ],
)
def test_unsupported_type_or_encoding_gets_415(
    server: Any, headers: dict[str, str], reason: str
) -> None:
    _, sink, counters, url = server
    resp = requests.post(url, data=b"xx", headers=headers, timeout=5)
    assert resp.status_code == 415
    assert counters.rejected[(R, reason)] == 1
    assert_still_serving(url, sink)


def test_wrong_path_and_method(server: Any) -> None:
    _, sink, counters, url = server
    assert requests.post(url + "/x", data=b"", headers=PB, timeout=5).status_code == 404
    resp = requests.get(url, timeout=5)
    assert resp.status_code == 405 and resp.headers["Allow"] == "POST"
    assert counters.rejected[(R, "not_found")] == counters.rejected[(R, "method_not_allowed")] == 1
    assert_still_serving(url, sink)


def test_malformed_gzip_gets_400(server: Any) -> None:
    _, sink, counters, url = server
    data = gzip.compress(proto_body(sdk_spans(1)))
    resp = requests.post(
        url, data=data[:-12], headers={**PB, "Content-Encoding": "gzip"}, timeout=5
    )
    assert resp.status_code == 400 and counters.rejected[(R, "malformed_gzip")] == 1
    assert_still_serving(url, sink)


def gzip_bomb(total: int = 1 << 30, chunk: int = 1 << 20) -> bytes:
    """A valid gzip of ``total`` zero bytes, built without ever holding them.

    After ``Z_FULL_FLUSH`` the compressor keeps no history, so every 1 MiB block of zeros
    compresses to the same bytes: compress one, repeat it, add header and CRC trailer.
    """
    zeros = bytes(chunk)
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(total // chunk):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, total & 0xFFFFFFFF)
    return header + block * (total // chunk) + comp.flush(zlib.Z_FINISH) + trailer


def test_gzip_bomb_helper_is_a_valid_gzip_of_zeros() -> None:
    assert gzip.decompress(gzip_bomb(4 << 20)) == bytes(4 << 20)


def test_gzip_bomb_is_refused_while_streaming(server: Any) -> None:
    _, sink, counters, url = server
    bomb = gzip_bomb()
    assert len(bomb) < 2 << 20  # ~1 MB on the wire, 1 GiB inflated
    tracemalloc.start()
    try:
        resp = requests.post(url, data=bomb, headers={**PB, "Content-Encoding": "gzip"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 413 and rpc_status(resp).code == code_pb2.RESOURCE_EXHAUSTED
    assert counters.rejected[(R, "decompressed_too_large")] == 1
    # Inflation stops one 1 MiB step past the 64 MiB cap; 1 GiB was never materialised.
    # (peak also holds the test's own ~1 MB bomb and requests' buffers; 100 MiB is slack.)
    assert peak < 100 << 20
    assert_still_serving(url, sink)


def big_attribute_body() -> bytes:
    req = encode_spans(sdk_spans(1))
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="big")
    kv.value.string_value = "x" * (10 << 20)
    return req.SerializeToString()


def test_ten_megabyte_attribute_over_body_cap_gets_413(server: Any) -> None:
    _, sink, counters, url = server
    resp = requests.post(url, data=big_attribute_body(), headers=PB, timeout=5)
    assert resp.status_code == 413 and counters.rejected[(R, "body_too_large")] == 1
    assert resp.headers.get("Connection") == "close"
    assert_still_serving(url, sink)


def test_ten_megabyte_attribute_gzipped_is_truncated_and_counted(server: Any) -> None:
    _, sink, counters, url = server
    data = gzip.compress(big_attribute_body())
    resp = requests.post(url, data=data, headers={**PB, "Content-Encoding": "gzip"}, timeout=5)
    assert resp.status_code == 200
    (big,) = [s for s in sink.spans if "big" in s.attributes]
    assert big.attributes["big"] == "x" * (64 * 1024)
    assert counters.dropped["attribute_value_truncated"] == 1


def test_chunked_body_and_raw_garbage_on_the_socket(server: Any) -> None:
    rec, sink, _, url = server
    spans = sdk_spans(1)
    resp = requests.post(url, data=iter([proto_body(spans)]), headers=PB, timeout=5)
    assert resp.status_code == 200 and len(sink.spans) == len(spans)
    for junk in (
        b"\x16\x03\x01\x00\xff" * 50,
        b"POST /v1/traces HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", rec.bound_port), timeout=5) as sock:
            sock.sendall(junk)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass
    assert_still_serving(url, sink)


def test_overload_gets_503_with_retry_after(server: Any) -> None:
    _, sink, counters, url = server
    sink.refuse = 1
    resp = requests.post(url, data=proto_body(sdk_spans(1)), headers=PB, timeout=5)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "0"
    assert rpc_status(resp).code == code_pb2.UNAVAILABLE
    assert counters.rejected[(R, "pipeline_full")] == 3


def test_real_exporter_honours_retry_after_and_succeeds(server: Any) -> None:
    _, sink, _, url = server
    sink.refuse = 2
    spans = sdk_spans(1)
    exporter = OTLPSpanExporter(endpoint=url, timeout=10)
    t0 = time.monotonic()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    elapsed = time.monotonic() - t0
    exporter.shutdown()
    assert sink.offers == 3
    assert_received_exactly(sink.spans, spans)
    # Retry-After: 0 replaced the exporter's own backoff (>= 0.8 s + 1.6 s with jitter).
    assert elapsed < 0.8


# --------------------------------------------------------------------------- hostile clients


def test_slow_drip_body_is_cut_at_the_request_deadline() -> None:
    sink, counters = Sink(), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, request_deadline_s=1.0)
    port = rec.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/x-protobuf\r\nContent-Length: 1000\r\n\r\n")
            t0 = time.monotonic()
            for _ in range(4):  # one byte every 0.4 s: each read is quick, the whole is not
                sock.sendall(b"a")
                time.sleep(0.4)
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5
        assert counters.rejected[(R, "body_timeout")] == 1
        assert_still_serving(f"http://127.0.0.1:{port}/v1/traces", sink)
    finally:
        rec.stop()


def test_busy_decoders_answer_503_and_a_request_that_never_fits_413() -> None:
    class Small(Sink):
        capacity_spans = 3  # the pipeline's queue can never hold more

    sink, counters = Small(), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, max_concurrent_decodes=1, retry_after_s=2)
    port = rec.start()
    url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        resp = requests.post(url, data=proto_body(sdk_spans(4)), headers=PB, timeout=5)
        assert resp.status_code == 413 and "Retry-After" not in resp.headers
        assert counters.rejected[(R, "too_many_spans")] == 1
        rec.endpoint._decodes.acquire()  # one decode in progress: the only slot taken
        try:
            resp = requests.post(url, data=proto_body(sdk_spans(1)), headers=PB, timeout=5)
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "2"
        finally:
            rec.endpoint._decodes.release()
        assert counters.rejected[(R, "decoder_busy")] == 1
        assert_still_serving(url, sink)
    finally:
        rec.stop()


def test_connections_beyond_the_cap_get_503() -> None:
    sink, counters = Sink(), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, max_connections=2)
    port = rec.start()
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            assert extra.recv(4096).startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert_still_serving(f"http://127.0.0.1:{port}/v1/traces", sink)
    rec.stop()


@pytest.mark.parametrize("path", ["/v1/logs", "/v1/metrics"])
def test_other_otlp_signals_are_accepted_and_discarded(server: Any, path: str) -> None:
    """Zero-code set-ups export logs and metrics beside traces: they get an empty OTLP
    success (no retries, no errors in the app) and are not counted as span rejections."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

    _, sink, counters, url = server
    base = url.rsplit("/v1/traces", 1)[0]
    if path == "/v1/logs":
        req: Any = ExportLogsServiceRequest()
        req.resource_logs.add().scope_logs.add().log_records.append(
            LogRecord(time_unix_nano=1, severity_text="INFO"))
    else:
        req = ExportMetricsServiceRequest()
        req.resource_metrics.add().scope_metrics.add().metrics.add(name="requests")
    resp = requests.post(base + path, data=req.SerializeToString(), headers=PB, timeout=5)
    assert resp.status_code == 200 and resp.content == b""
    resp = requests.post(base + path, data=b'{"resourceLogs": []}',
                         headers={"Content-Type": "application/json"}, timeout=5)
    assert resp.status_code == 200 and resp.json() == {}
    assert not counters.rejected and not sink.spans
    assert_still_serving(url, sink)
