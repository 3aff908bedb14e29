"""Span-file readers: OTLP JSON Lines (plain, gzip), Collector proto, Jaeger, Tempo."""

from __future__ import annotations

import base64
import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from assaywatch.monitor.receivers.files import (
    ReadIssue,
    ReadStats,
    SpanFileError,
    read_spans,
    request_to_json,
    write_otlp_json_lines,
    write_proto_frame,
)
from assaywatch.monitor.receivers.spans import STATUS_ERROR, SpanRecord
from tests.monitor.sdkspans import assert_received_exactly, sdk_spans

TID = "4bf92f3577b34da6a3ce929d0e0e4736"


def assert_same(records: list[SpanRecord], spans: list[Any]) -> None:
    assert_received_exactly(records, spans, status_message=False, event_times=False)


def flat(batches: Any) -> list[SpanRecord]:
    return [s for batch in batches for s in batch]


@pytest.mark.parametrize("name", ["spans.jsonl", "spans.jsonl.gz", "no-extension"])
def test_json_lines_written_from_sdk_spans_round_trip(tmp_path: Path, name: str) -> None:
    path = str(tmp_path / name)
    first, second = sdk_spans(2), sdk_spans(1)
    compress = name == "no-extension"  # gzip detected by magic bytes, not the name
    write_otlp_json_lines(path, first, compress=compress or None)
    write_otlp_json_lines(path, second, compress=compress or None)
    with open(path, "rb") as fh:
        assert (fh.read(2) == b"\x1f\x8b") == (name != "spans.jsonl")
    batches = list(read_spans([path]))
    assert [len(b) for b in batches] == [len(first), len(second)]  # one batch per line
    assert_same(flat(batches), first + second)


def test_collector_proto_frames(tmp_path: Path) -> None:
    path = tmp_path / "spans.pb"
    groups = [sdk_spans(1), sdk_spans(2)]
    with open(path, "wb") as fh:
        for g in groups:
            payload = encode_spans(g).SerializeToString()
            fh.write(len(payload).to_bytes(4, "big") + payload)  # the Collector's framing
    batches = list(read_spans([str(path)]))
    assert [len(b) for b in batches] == [len(g) for g in groups]
    assert_same(flat(batches), groups[0] + groups[1])


def test_truncated_and_corrupt_proto_frames_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.pb"
    good = encode_spans(sdk_spans(1)).SerializeToString()
    with open(path, "wb") as fh:
        write_proto_frame(fh, good)
        write_proto_frame(fh, good[:-5])  # framing intact, payload unparsable
        write_proto_frame(fh, good)
        fh.write((len(good) + 100).to_bytes(4, "big") + good)  # truncated last frame
    issues: list[ReadIssue] = []
    batches = list(read_spans([str(path)], on_error=issues.append))
    assert len(batches) == 2
    assert [(i.line, "ExportTraceServiceRequest" in i.reason) for i in issues[:1]] == [(2, True)]
    assert issues[1].line == 4 and "truncated frame" in issues[1].reason


def jaeger_document() -> dict[str, Any]:
    """A Jaeger v1 API answer per jaegertracing model/json (times in microseconds)."""
    return {
        "data": [
            {
                "traceID": TID,
                "spans": [
                    {
                        "traceID": TID, "spanID": "00f067aa0ba902b7", "flags": 1,
                        "operationName": "invoke_agent planner", "references": [],
                        "startTime": 1700000000000000, "duration": 2500,
                        "tags": [
                            {"key": "gen_ai.agent.name", "type": "string", "value": "planner"},
                            {"key": "span.kind", "type": "string", "value": "server"},
                            {"key": "otel.scope.name", "type": "string", "value": "lib"},
                        ],
                        "logs": [], "processID": "p1",
                    },
                    {
                        "traceID": TID, "spanID": "53995c3f42cd8ad8", "flags": 1,
                        "operationName": "execute_tool search",
                        "references": [
                            {"refType": "FOLLOWS_FROM", "traceID": TID,
                             "spanID": "1111111111111111"},
                            {"refType": "CHILD_OF", "traceID": TID, "spanID": "00f067aa0ba902b7"},
                        ],
                        "startTime": 1700000000000100, "duration": 1000,
                        "tags": [
                            {"key": "gen_ai.usage.input_tokens", "type": "int64", "value": 42},
                            {"key": "temperature", "type": "float64", "value": 0.5},
                            {"key": "cached", "type": "bool", "value": False},
                            {"key": "blob", "type": "binary", "value": "AAE="},
                            {"key": "error", "type": "bool", "value": True},
                        ],
                        "logs": [{"timestamp": 1700000000000200, "fields": [
                            {"key": "event", "type": "string", "value": "exception"},
                            {"key": "exception.type", "type": "string", "value": "Timeout"},
                        ]}],
                        "processID": "p1", "warnings": None,
                    },
                ],
                "processes": {"p1": {"serviceName": "agent-svc", "tags": [
                    {"key": "service.version", "type": "string", "value": "2.0"}]}},
                "warnings": None,
            }
        ]
    }  # fmt: skip


def test_jaeger_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(jaeger_document(), indent=2))  # pretty: a whole document
    (batch,) = list(read_spans([str(path)]))
    root, tool = batch
    assert (root.trace_id, root.span_id, root.parent_span_id) == (TID, "00f067aa0ba902b7", "")
    assert (root.kind, root.scope_name, root.attributes) == (
        2, "lib", {"gen_ai.agent.name": "planner"}
    )  # fmt: skip
    assert tool.parent_span_id == "00f067aa0ba902b7"  # CHILD_OF wins over FOLLOWS_FROM
    assert (tool.start_ns, tool.end_ns) == (1700000000000100_000, 1700000000001100_000)
    assert tool.status_code == STATUS_ERROR
    assert tool.attributes == {
        "gen_ai.usage.input_tokens": 42, "temperature": 0.5, "cached": False, "blob": b"\x00\x01"
    }  # fmt: skip
    assert [(e.name, e.time_ns, e.attributes) for e in tool.events] == [
        ("exception", 1700000000000200_000, {"exception.type": "Timeout"})
    ]
    assert root.resource == {"service.name": "agent-svc", "service.version": "2.0"}
    assert root.resource is tool.resource


def test_tempo_json_batches_with_base64_ids(tmp_path: Path) -> None:
    spans = sdk_spans(1)
    doc = request_to_json(encode_spans(spans))
    for rs in doc["resourceSpans"]:  # Tempo writes ids as base64
        for sp in rs["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in sp:
                    sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
    for i, wrapped in enumerate(
        [{"batches": doc["resourceSpans"]}, {"trace": {"resourceSpans": doc["resourceSpans"]}}]
    ):
        path = tmp_path / f"tempo{i}.json"
        path.write_text(json.dumps(wrapped))
        (batch,) = list(read_spans([str(path)]))
        assert_same(batch, spans)


def test_malformed_line_reports_file_and_line(tmp_path: Path) -> None:
    path = str(tmp_path / "mixed.jsonl")
    write_otlp_json_lines(path, sdk_spans(1))
    with open(path, "a") as fh:
        fh.write('{"resourceSpans": [ broken\n\n{"unexpected": 1}\n')
    write_otlp_json_lines(path, sdk_spans(1))
    issues: list[ReadIssue] = []
    stats = ReadStats()
    batches = list(read_spans([path], on_error=issues.append, stats=stats))
    assert len(batches) == 2
    assert [(i.path, i.line) for i in issues] == [(path, 2), (path, 4)]
    assert "invalid JSON" in issues[0].reason and str(issues[0]).startswith(f"{path}:2: ")
    assert stats.issues == 2 and stats.spans == 6 and stats.files == 1


def test_strict_mode_raises_with_location(tmp_path: Path) -> None:
    path = str(tmp_path / "bad.jsonl")
    write_otlp_json_lines(path, sdk_spans(1))
    doc = request_to_json(encode_spans(sdk_spans(1)))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = ""
    with open(path, "a") as fh:
        fh.write(json.dumps(doc) + "\n")
    with pytest.raises(SpanFileError) as info:
        list(read_spans([path], strict=True))
    assert info.value.issue.line == 2 and "missing_span_id=1" in str(info.value)
    # Non-strict: the bad span is counted, its valid siblings kept.
    stats = ReadStats()
    assert len(flat(read_spans([path], stats=stats))) == 3 + 2
    assert stats.rejected == {"missing_span_id": 1}


def test_missing_and_unknown_files_are_issues(tmp_path: Path) -> None:
    (tmp_path / "zstd.bin").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 10)
    issues: list[ReadIssue] = []
    paths = [str(tmp_path / "nope.jsonl"), str(tmp_path / "zstd.bin")]
    assert list(read_spans(paths, on_error=issues.append)) == []
    assert "cannot open" in issues[0].reason and "zstd" in issues[1].reason
    with pytest.raises(TypeError):
        read_spans("one-path-string")


@pytest.mark.slow
def test_reading_is_streaming_with_flat_memory(tmp_path: Path) -> None:
    """A ~9 MB (uncompressed) gzip JSON Lines file is read with memory of one line."""
    path = str(tmp_path / "large.jsonl.gz")
    line = (json.dumps(request_to_json(encode_spans(sdk_spans(40)))) + "\n").encode()
    n_lines = 200
    with gzip.open(path, "wb", compresslevel=1) as gz:
        for _ in range(n_lines):
            gz.write(line)
    total = n_lines * len(line)
    tracemalloc.start()
    try:
        count = 0
        batches = read_spans([path])
        first = next(batches)  # a generator: the first batch comes before the file is read
        count += len(first)
        del first
        for batch in batches:
            count += len(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n_lines * 120
    # Streaming holds about one line of text plus one batch of records (~0.15 MB) and
    # reader buffers: measured ~1.2 MB. Materialising all records of this file takes
    # ~21 MB (measured with list(read_spans(...))), so 3 MiB separates the two clearly.
    assert total > 8 << 20
    assert peak < 3 << 20


# --------------------------------------------------------------------------- OTLP logs


def evaluation_logs(spans: list[Any]) -> Any:
    """An ``ExportLogsServiceRequest`` (the SDK's encoder) holding one evaluation event of
    the first span and one plain application log record."""
    from opentelemetry._logs import LogRecord as ApiLogRecord
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import (
        InMemoryLogRecordExporter,
        SimpleLogRecordProcessor,
    )
    from opentelemetry.trace import NonRecordingSpan, set_span_in_context

    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("evals")
    ctx = set_span_in_context(NonRecordingSpan(spans[0].context))
    logger.emit(ApiLogRecord(timestamp=1_700_000_000_000_000_001, context=ctx,
                             event_name="gen_ai.evaluation.result", body="the answer",
                             attributes={"gen_ai.evaluation.name": "relevance",
                                         "gen_ai.evaluation.score.value": 0.5,
                                         "gen_ai.evaluation.explanation": "because"}))
    logger.emit(ApiLogRecord(timestamp=1, context=ctx, body="plain"))
    provider.shutdown()
    return encode_logs(memory.get_finished_logs())


def assert_evaluation(record: SpanRecord, span: Any) -> None:
    from assaywatch.monitor.receivers.spans import KIND_EVALUATION

    assert (record.kind, record.name, record.start_ns) == (
        KIND_EVALUATION, "gen_ai.evaluation.result", 1_700_000_000_000_000_001)
    assert record.trace_id == format(span.context.trace_id, "032x")
    assert record.span_id == format(span.context.span_id, "016x")
    assert record.attributes == {"gen_ai.evaluation.name": "relevance",
                                 "gen_ai.evaluation.score.value": 0.5}


@pytest.mark.parametrize("name", ["mixed.jsonl", "mixed.jsonl.gz"])
def test_a_logs_line_beside_a_traces_line_gives_evaluation_records(tmp_path: Path,
                                                                   name: str) -> None:
    from assaywatch.monitor.receivers.files import logs_request_to_json

    path = str(tmp_path / name)
    spans = sdk_spans(1)
    write_otlp_json_lines(path, spans)
    line = json.dumps(logs_request_to_json(evaluation_logs(spans))) + "\n"
    opener: Any = gzip.open if name.endswith(".gz") else open
    with opener(path, "ab") as fh:
        fh.write(line.encode())
    stats = ReadStats()
    batches = list(read_spans([path], strict=True, stats=stats))
    assert [len(b) for b in batches] == [len(spans), 1]
    assert_same(batches[0], spans)
    assert_evaluation(batches[1][0], spans[0])
    assert (stats.spans, stats.evaluations, stats.other_log_records) == (len(spans), 1, 1)


def test_logs_frames_beside_traces_frames_in_a_proto_file(tmp_path: Path) -> None:
    path = tmp_path / "mixed.pb"
    spans = sdk_spans(1)
    with open(path, "wb") as fh:
        write_proto_frame(fh, evaluation_logs(spans).SerializeToString())
        write_proto_frame(fh, encode_spans(spans).SerializeToString())
    batches = list(read_spans([str(path)], strict=True))
    assert [len(b) for b in batches] == [1, len(spans)]
    assert_evaluation(batches[0][0], spans[0])
    assert_same(batches[1], spans)


def test_a_rejected_evaluation_is_a_read_issue(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    record = {"eventName": "gen_ai.evaluation.result", "spanId": "00f067aa0ba902b7",
              "attributes": [{"key": "gen_ai.evaluation.score.value",
                              "value": {"doubleValue": 1.0}}]}
    path.write_text(json.dumps({"resourceLogs": [{"scopeLogs": [
        {"logRecords": [record, dict(record, traceId=TID)]}]}]}) + "\n")
    issues: list[ReadIssue] = []
    (batch,) = list(read_spans([str(path)], on_error=issues.append))
    assert [r.trace_id for r in batch] == [TID]
    assert len(issues) == 1 and "missing_trace_id=1" in issues[0].reason
