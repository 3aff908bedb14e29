"""OTLP logs: GenAI evaluation events (``gen_ai.evaluation.result``) sent by the real
OpenTelemetry SDK logs pipeline (LoggerProvider, Simple/BatchLogRecordProcessor, the
OTLP gRPC and HTTP log exporters) to the receivers on free loopback ports, plus raw
JSON, gzip and hostile bodies: evaluation records in the span sink, other log records
counted and discarded, partial success and backpressure answered as for traces."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from assaywatch.monitor.receivers.files import logs_request_to_json
from assaywatch.monitor.receivers.otlp.decode import DecodeError
from assaywatch.monitor.receivers.otlp.decode_logs import decode_proto_logs
from assaywatch.monitor.receivers.otlp.decode_logs_json import decode_json_logs
from assaywatch.monitor.receivers.otlp.grpc_receiver import GrpcReceiver
from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    KIND_EVALUATION,
    IngestCounters,
    SpanRecord,
)
from tests.monitor.sdkspans import RecordingSink

GRPC, HTTP = "otlp_grpc", "otlp_http"
LOGS_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
TID, SID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

#: What each evaluation emitted by :func:`emit` must arrive as (explanation never kept).
EXPECTED = [
    {"gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.75,
     "gen_ai.evaluation.score.label": "relevant", "gen_ai.agent.name": "planner"},
    {"gen_ai.evaluation.name": "tone", "assaywatch.evaluation.passed": True},
]


# --------------------------------------------------------------------------- helpers


def logs_provider(*processors_for: Any, batch: bool = False) -> tuple[LoggerProvider,
                                                                       InMemoryLogRecordExporter]:
    provider = LoggerProvider(resource=Resource.create({"service.name": "agent-svc"}))
    for exporter in processors_for:
        provider.add_log_record_processor(
            BatchLogRecordProcessor(exporter, schedule_delay_millis=50) if batch
            else SimpleLogRecordProcessor(exporter))
    memory = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    return provider, memory


def emit(exporter: Any, batch: bool = False) -> tuple[str, str, list[int]]:
    """Inside a span: two evaluation events (one named by ``event_name``, one by the older
    ``event.name`` attribute) and one plain log record, through ``exporter``.

    Returns the span's trace and span ids (hex) and the evaluations' times."""
    provider, memory = logs_provider(exporter, batch=batch)
    logger = provider.get_logger("assaywatch.test.evals")
    tracer = TracerProvider().get_tracer("assaywatch.test")
    with tracer.start_as_current_span("invoke_agent planner") as span:
        logger.emit(event_name=EVALUATION_EVENT, body={"content": "the whole answer"},
                    attributes={**EXPECTED[0],
                                "gen_ai.evaluation.explanation": "it answered the question",
                                "user.id": "u-1"})
        logger.emit(body="an application log line", severity_text="INFO")
        logger.emit(attributes={"event.name": EVALUATION_EVENT, **EXPECTED[1],
                                "gen_ai.evaluation.explanation": "polite"})
    provider.shutdown()
    ctx = span.get_span_context()
    times = [lr.log_record.timestamp or lr.log_record.observed_timestamp
             for lr in memory.get_finished_logs()]
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), [times[0], times[2]]


def assert_evaluations(records: list[SpanRecord], trace_id: str, span_id: str,
                       times: list[int] | None = None) -> None:
    assert [r.attributes for r in records] == EXPECTED
    for i, r in enumerate(records):
        assert (r.trace_id, r.span_id, r.parent_span_id, r.name, r.kind) == (
            trace_id, span_id, "", EVALUATION_EVENT, KIND_EVALUATION)
        assert r.start_ns == r.end_ns > 0
        if times is not None:
            assert r.start_ns == times[i]
        assert r.resource["service.name"] == "agent-svc"
        assert r.scope_name == "assaywatch.test.evals"


def evaluation_request(**overrides: Any) -> ExportLogsServiceRequest:
    """One evaluation log record (ids ``TID``/``SID``), fields replaced by ``overrides``."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="service.name").value.string_value = "agent-svc"
    sl = rl.scope_logs.add()
    sl.scope.name = "assaywatch.test.evals"
    lr = sl.log_records.add(time_unix_nano=1_700_000_000_000_000_000,
                            trace_id=bytes.fromhex(TID), span_id=bytes.fromhex(SID),
                            event_name=EVALUATION_EVENT)
    lr.body.string_value = "content"
    for key, value in EXPECTED[0].items():
        v = lr.attributes.add(key=key).value
        if isinstance(value, float):
            v.double_value = value
        else:
            v.string_value = value
    lr.attributes.add(key="gen_ai.evaluation.explanation").value.string_value = "why"
    for key, value in overrides.items():
        setattr(lr, key, value)
    return req


class Sink(RecordingSink):
    pass


@pytest.fixture
def grpc_server() -> Iterator[tuple[GrpcReceiver, Sink, IngestCounters, int]]:
    sink, counters = Sink(GRPC), IngestCounters()
    rec = GrpcReceiver(sink, counters, port=0, max_message_bytes=1 << 20, retry_delay_s=0.1)
    port = rec.start()
    yield rec, sink, counters, port
    rec.stop(0)


@pytest.fixture
def http_server() -> Iterator[tuple[HttpReceiver, Sink, IngestCounters, str]]:
    sink, counters = Sink(HTTP), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, retry_after_s=0)
    port = rec.start()
    yield rec, sink, counters, f"http://127.0.0.1:{port}/v1/logs"
    rec.stop()


def raw_grpc(port: int, data: bytes) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return ch.unary_unary(LOGS_METHOD)(data, timeout=5)


# --------------------------------------------------------------------------- the SDK


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip])
def test_grpc_log_exporter_delivers_evaluation_records(grpc_server: Any,
                                                       compression: grpc.Compression) -> None:
    _, sink, counters, port = grpc_server
    exporter = GrpcLogExporter(endpoint=f"127.0.0.1:{port}", insecure=True,
                               compression=compression, timeout=5)
    trace_id, span_id, times = emit(exporter)
    assert_evaluations(sink.spans, trace_id, span_id, times)
    assert counters.logs_received == {(GRPC, EVALUATION_EVENT): 2, (GRPC, "other"): 1}
    assert not counters.logs_rejected
    assert not counters.received and not counters.rejected  # the span counters


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate])
def test_http_log_exporter_delivers_evaluation_records(http_server: Any, batch: bool,
                                                       compression: Compression) -> None:
    _, sink, counters, url = http_server
    exporter = HttpLogExporter(endpoint=url, compression=compression, timeout=5)
    trace_id, span_id, times = emit(exporter, batch=batch)
    assert_evaluations(sorted(sink.spans, key=lambda r: r.start_ns), trace_id, span_id, times)
    assert counters.logs_received[(HTTP, EVALUATION_EVENT)] == 2
    assert counters.logs_received[(HTTP, "other")] == 1
    assert not counters.logs_rejected and not counters.received


def test_evaluation_outside_a_span_is_rejected_in_partial_success(grpc_server: Any,
                                                                   http_server: Any) -> None:
    """No trace id: the exporter gets a partial success (not retried), the rest is kept."""
    for (_, sink, counters, where), receiver in ((grpc_server, GRPC), (http_server, HTTP)):
        exporter = (GrpcLogExporter(endpoint=f"127.0.0.1:{where}", insecure=True, timeout=5)
                    if receiver == GRPC else HttpLogExporter(endpoint=where, timeout=5))
        provider, memory = logs_provider(exporter)
        logger = provider.get_logger("assaywatch.test.evals")
        logger.emit(event_name=EVALUATION_EVENT, attributes=EXPECTED[0])
        logger.emit(body="plain")
        provider.shutdown()
        assert len(memory.get_finished_logs()) == 2
        assert sink.spans == [] and sink.offers == 0
        assert counters.logs_rejected == {(receiver, "missing_trace_id"): 1}
        assert counters.logs_received == {(receiver, "other"): 1}


# --------------------------------------------------------------------------- raw HTTP


def test_json_body_with_hex_ids_and_gzip(http_server: Any) -> None:
    _, sink, counters, url = http_server
    provider, memory = logs_provider()
    tracer = TracerProvider().get_tracer("t")
    logger = provider.get_logger("assaywatch.test.evals")
    with tracer.start_as_current_span("invoke_agent planner") as span:
        logger.emit(event_name=EVALUATION_EVENT, attributes={
            **EXPECTED[0], "gen_ai.evaluation.explanation": "x"})
        logger.emit(attributes={"event.name": EVALUATION_EVENT, **EXPECTED[1]})
    provider.shutdown()
    doc = logs_request_to_json(encode_logs(memory.get_finished_logs()))
    record = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert record["traceId"] == format(span.get_span_context().trace_id, "032x")  # hex
    record["traceId"] = record["traceId"].upper()  # OTLP/JSON ids are case-insensitive
    resp = requests.post(url, data=json.dumps(doc), headers=JS, timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == JS["Content-Type"]
    assert resp.json() == {}
    resp = requests.post(url, data=gzip.compress(json.dumps(doc).encode()),
                         headers={**JS, "Content-Encoding": "gzip"}, timeout=5)
    assert resp.status_code == 200 and resp.json() == {}
    ctx = span.get_span_context()
    for half in (sink.spans[:2], sink.spans[2:]):
        assert_evaluations(half, format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
    assert counters.logs_received == {(HTTP, EVALUATION_EVENT): 4}


def test_json_partial_success_counts_rejected_log_records(http_server: Any) -> None:
    _, sink, counters, url = http_server
    doc = logs_request_to_json(evaluation_request())
    records = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    no_trace = dict(records[0])
    del no_trace["traceId"]
    no_score = dict(records[0], attributes=[{"key": "gen_ai.evaluation.name",
                                             "value": {"stringValue": "relevance"}}])
    no_span = dict(records[0])
    del no_span["spanId"]
    records += [no_trace, no_score, no_span, {"body": {"stringValue": "plain"}}]
    resp = requests.post(url, data=json.dumps(doc), headers=JS, timeout=5)
    partial = resp.json()["partialSuccess"]
    assert resp.status_code == 200 and partial["rejectedLogRecords"] == "2"
    assert "missing_trace_id=1" in partial["errorMessage"]
    assert "evaluation_without_score=1" in partial["errorMessage"]
    assert [r.span_id for r in sink.spans] == [SID, ""]  # no span id: joins by trace
    assert counters.logs_rejected == {(HTTP, "missing_trace_id"): 1,
                                      (HTTP, "evaluation_without_score"): 1}
    assert counters.logs_received == {(HTTP, EVALUATION_EVENT): 2, (HTTP, "other"): 1}


def test_proto_partial_success_and_bad_bodies(http_server: Any) -> None:
    _, sink, counters, url = http_server
    req = evaluation_request(trace_id=b"\x01" * 8)
    resp = requests.post(url, data=req.SerializeToString(), headers=PB, timeout=5)
    body = ExportLogsServiceResponse.FromString(resp.content)
    assert resp.status_code == 200 and body.partial_success.rejected_log_records == 1
    assert "invalid_trace_id=1" in body.partial_success.error_message
    data = evaluation_request().SerializeToString()
    resp = requests.post(url, data=data[:-5], headers=PB, timeout=5)
    assert resp.status_code == 400
    st = status_pb2.Status.FromString(resp.content)
    assert st.code == code_pb2.INVALID_ARGUMENT and "ExportLogsServiceRequest" in st.message
    resp = requests.post(url, data=b'["not", "an object"]', headers=JS, timeout=5)
    assert resp.status_code == 400 and "resourceLogs" in resp.json()["message"]
    assert counters.logs_rejected == {(HTTP, "invalid_trace_id"): 1,
                                      (HTTP, "malformed_protobuf"): 1,
                                      (HTTP, "malformed_json"): 1}
    assert not counters.rejected and sink.spans == []


def test_full_sink_answers_503_with_retry_after(http_server: Any) -> None:
    rec, sink, counters, url = http_server
    sink.refuse = 1
    resp = requests.post(url, data=evaluation_request().SerializeToString(), headers=PB,
                         timeout=5)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "0"
    st = status_pb2.Status.FromString(resp.content)
    assert st.code == code_pb2.UNAVAILABLE
    assert st.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)
    assert counters.logs_rejected == {(HTTP, "pipeline_full"): 1}
    assert not counters.logs_received  # the client retries the whole request
    resp = requests.post(url, data=evaluation_request().SerializeToString(), headers=PB,
                         timeout=5)
    assert resp.status_code == 200 and len(sink.spans) == 1


def test_metrics_are_still_accepted_and_discarded(http_server: Any) -> None:
    _, sink, counters, url = http_server
    resp = requests.post(url.replace("/v1/logs", "/v1/metrics"), data=b"{}", headers=JS,
                         timeout=5)
    assert resp.status_code == 200 and resp.json() == {}
    assert not counters.logs_received and not counters.logs_rejected and not sink.spans


# --------------------------------------------------------------------------- raw gRPC


def test_grpc_full_sink_answers_unavailable_with_retry_info(grpc_server: Any) -> None:
    rec, sink, counters, port = grpc_server
    sink.refuse = 1
    with pytest.raises(grpc.RpcError) as info:
        raw_grpc(port, evaluation_request().SerializeToString())
    err = info.value
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    retry = error_details_pb2.RetryInfo.FromString(
        dict(err.trailing_metadata())["google.rpc.retryinfo-bin"])
    assert retry.retry_delay.ToTimedelta().total_seconds() == pytest.approx(rec.retry_delay_s)
    assert counters.logs_rejected == {(GRPC, "pipeline_full"): 1}


def test_grpc_exporter_retries_after_unavailable(grpc_server: Any) -> None:
    _, sink, counters, port = grpc_server
    sink.refuse = 1
    provider, memory = logs_provider()
    exporter = GrpcLogExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=10)
    tracer = TracerProvider().get_tracer("t")
    logger = provider.get_logger("assaywatch.test.evals")
    with tracer.start_as_current_span("s"):
        logger.emit(event_name=EVALUATION_EVENT, attributes=EXPECTED[1])
    provider.shutdown()
    assert exporter.export(memory.get_finished_logs()) is LogRecordExportResult.SUCCESS
    exporter.shutdown()
    assert sink.offers == 2 and len(sink.spans) == 1
    assert counters.logs_rejected[(GRPC, "pipeline_full")] == 1


def test_grpc_partial_success_and_invalid_argument(grpc_server: Any) -> None:
    _, sink, counters, port = grpc_server
    req = evaluation_request(trace_id=b"")
    resp = ExportLogsServiceResponse.FromString(raw_grpc(port, req.SerializeToString()))
    assert resp.partial_success.rejected_log_records == 1
    assert "missing_trace_id=1" in resp.partial_success.error_message
    with pytest.raises(grpc.RpcError) as info:
        raw_grpc(port, evaluation_request().SerializeToString()[:-5])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert counters.logs_rejected == {(GRPC, "missing_trace_id"): 1,
                                      (GRPC, "malformed_protobuf"): 1}
    assert sink.spans == [] and not counters.rejected


# --------------------------------------------------------------------------- decoding


def test_decoders_agree_and_keep_no_content() -> None:
    req = evaluation_request()
    from_proto = decode_proto_logs(req.SerializeToString()).records
    from_json = decode_json_logs(json.dumps(logs_request_to_json(req))).records
    assert from_proto == from_json
    (r,) = from_proto
    assert (r.trace_id, r.span_id, r.start_ns) == (TID, SID, 1_700_000_000_000_000_000)
    assert r.attributes == EXPECTED[0]  # no explanation, no body


def test_observed_time_zero_span_id_and_base64_json_ids() -> None:
    req = evaluation_request(time_unix_nano=0, observed_time_unix_nano=5, span_id=bytes(8))
    (r,) = decode_proto_logs(req.SerializeToString()).records
    assert (r.start_ns, r.span_id) == (5, "")
    doc = logs_request_to_json(evaluation_request())
    lr = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    lr["traceId"] = base64.b64encode(bytes.fromhex(TID)).decode()
    (r,) = decode_json_logs(doc).records
    assert r.trace_id == TID


def test_other_event_names_are_not_evaluations() -> None:
    req = evaluation_request(event_name="gen_ai.client.inference.operation.details")
    result = decode_proto_logs(req.SerializeToString())
    assert (result.records, result.other, dict(result.rejected)) == ([], 1, {})


def test_request_caps_are_413() -> None:
    data = evaluation_request().SerializeToString()
    with pytest.raises(DecodeError) as info:
        decode_proto_logs(data, max_records=0)
    assert (info.value.reason, info.value.status) == ("too_many_log_records", 413)
    with pytest.raises(DecodeError) as info:
        decode_json_logs(json.dumps(logs_request_to_json(evaluation_request())), max_values=5)
    assert info.value.status == 413


def test_capacity_bounds_evaluations_not_other_log_records() -> None:
    """The sink's queue size refuses (413) only evaluation events it could never hold; a
    big batch of application logs beside a few evaluations is accepted."""

    class Small(Sink):
        capacity_spans = 2

    sink, counters = Small(HTTP), IngestCounters()
    with HttpReceiver(sink, counters, port=0) as rec:
        url = f"http://127.0.0.1:{rec.bound_port}/v1/logs"
        req = evaluation_request()
        records = req.resource_logs[0].scope_logs[0].log_records
        for _ in range(10):
            records.add(time_unix_nano=1).body.string_value = "application log"
        resp = requests.post(url, data=req.SerializeToString(), headers=PB, timeout=5)
        assert resp.status_code == 200 and len(sink.spans) == 1
        for _ in range(2):
            records.append(records[0])
        resp = requests.post(url, data=req.SerializeToString(), headers=PB, timeout=5)
        assert resp.status_code == 413
    assert counters.logs_rejected == {(HTTP, "too_many_log_records"): 1}
    assert counters.logs_received == {(HTTP, EVALUATION_EVENT): 1, (HTTP, "other"): 10}
