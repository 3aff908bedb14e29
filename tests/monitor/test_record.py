"""``assaywatch record``: the real command in a subprocess, fed by the real OTel SDK
exporters (gRPC and HTTP) on free loopback ports, writing real files that the readers
``baseline build`` and ``gate`` use read back span for span."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from assaywatch.monitor.commands.record import SpanFileWriter, records_to_json
from assaywatch.monitor.receivers.files import read_spans
from assaywatch.monitor.receivers.otlp.decode import DecodeLimits, decode_proto_request
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request
from tests.monitor.sdkspans import assert_received_exactly, sdk_spans

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "assaywatch.monitor.commands.cli", "record"]
UNLIMITED = DecodeLimits(max_value_bytes=1 << 30, max_attributes=1 << 30, max_events=1 << 30)


# --------------------------------------------------------------------------- helpers


class Recorder:
    """A running ``assaywatch record`` subprocess and its bound addresses."""

    def __init__(self, output: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.output = output
        self.proc = subprocess.Popen(
            [*CLI, "--output", str(output), "--otlp-grpc", "127.0.0.1:0",
             "--otlp-http", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        line = self._readline(30.0)
        assert "listening" in line, line + self.proc.stderr.read()  # type: ignore[union-attr]
        fields = dict(f.split("=", 1) for f in line.split(";")[0].split() if "=" in f)
        self.grpc, self.http = fields["otlp_grpc"], fields["otlp_http"]

    def _readline(self, timeout: float) -> str:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                             daemon=True)
        t.start()
        t.join(timeout)
        if not out:
            self.proc.kill()
            raise AssertionError(f"assaywatch record printed nothing in {timeout}s")
        return out[0]

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


@pytest.fixture
def recorders() -> Iterator[list[Recorder]]:
    started: list[Recorder] = []
    yield started
    for r in started:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait(10)


def send(spans_per_exporter: dict[str, str], n_runs: int = 3) -> list[Any]:
    """Emit ``n_runs`` runs per exporter through the real OTLP exporters; the finished
    SDK spans (what was sent)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    sent: list[Any] = []
    for protocol, address in spans_per_exporter.items():
        exporter = (GrpcExporter(endpoint=f"http://{address}", insecure=True)
                    if protocol == "grpc" else
                    HttpExporter(endpoint=f"http://{address}/v1/traces"))
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{protocol}"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("assaywatch.test.record")
        for i in range(n_runs):
            with tracer.start_as_current_span(
                    "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                  "gen_ai.agent.name": "a", "run": i,
                                                  "tags": ("x", "y"), "score": 0.5,
                                                  "ok": True}):
                with tracer.start_as_current_span("execute_tool t") as tool:
                    tool.add_event("gen_ai.tool.result", {"length": 12})
        provider.shutdown()
        sent.extend(memory.get_finished_spans())
    return sent


def read_all(*paths: Path) -> list[Any]:
    return [s for batch in read_spans([str(p) for p in paths], strict=True) for s in batch]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- encoding


def test_records_round_trip_through_the_written_json() -> None:
    """What the recorder writes reads back as the very records the receiver decoded."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    spans = sdk_spans(3, chat_attributes={
        "gen_ai.request.model": "m", "n": 7, "big": 2**62, "x": 1.5, "nan": float("nan"),
        "flag": False, "list": (1, 2, 3), "strs": ("a", "é"), "empty": ""})
    records = decode_proto_request(encode_spans(spans).SerializeToString(), UNLIMITED).spans
    doc = json.loads(json.dumps(records_to_json(records)))
    back = decode_json_request(doc, UNLIMITED).spans
    assert len(back) == len(records) == len(spans)
    for a, b in zip(records, back, strict=True):
        assert (a.trace_id, a.span_id, a.parent_span_id, a.name, a.kind, a.start_ns, a.end_ns,
                a.status_code, a.status_message, a.scope_name) == (
            b.trace_id, b.span_id, b.parent_span_id, b.name, b.kind, b.start_ns, b.end_ns,
            b.status_code, b.status_message, b.scope_name)
        assert a.resource == b.resource
        assert repr(a.attributes) == repr(b.attributes)  # repr: NaN != NaN
        assert [(e.name, e.time_ns, e.attributes) for e in a.events] == [
            (e.name, e.time_ns, e.attributes) for e in b.events]
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16  # hex, not base64


def test_writer_is_thread_safe_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    writer = SpanFileWriter(str(path), rotate_bytes=4000)
    writer.open()
    line = (json.dumps({"resourceSpans": [], "pad": "x" * 300}) + "\n").encode()

    def work(k: int) -> None:
        for i in range(50):
            assert writer.write(line, 1, [f"{k:02d}{i:030d}"])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert not writer.write(line, 1, ["late"])  # closed: refused, not written
    files = [path, *sorted(tmp_path.glob("spans.jsonl.*"))]
    assert writer.rotations == len(files) - 1 >= 10
    lines = [ln for f in files for ln in f.read_bytes().splitlines()]
    assert len(lines) == 400 and all(json.loads(ln)["pad"] == "x" * 300 for ln in lines)
    assert all(f.stat().st_size < 4000 + len(line) for f in files)
    assert (writer.spans, writer.traces) == (400, 400)


def test_appending_to_a_file_cut_mid_line_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b'{"resourceSpans": [')  # a crash mid-write
    writer = SpanFileWriter(str(path))
    writer.open()
    writer.write(b'{"resourceSpans":[]}\n', 0, [])
    writer.close()
    assert path.read_bytes().splitlines()[1] == b'{"resourceSpans":[]}'


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_record_grpc_and_http_then_sigterm(tmp_path: Path, recorders: list[Recorder],
                                           suffix: str) -> None:
    out = tmp_path / f"spans{suffix}"
    rec = Recorder(out)
    recorders.append(rec)
    sent = send({"grpc": rec.grpc, "http": rec.http})
    code, stdout, stderr = rec.stop(signal.SIGTERM)
    assert code == 0, stderr
    traces = len({s.context.trace_id for s in sent})
    assert f"wrote {len(sent)} spans ({traces} traces) to {out}" in stdout
    if suffix.endswith(".gz"):
        gzip.decompress(out.read_bytes())  # a complete gzip stream: trailer written
    assert_received_exactly(read_all(out), sent)


def test_appending_to_a_gz_adds_a_member_the_readers_read(tmp_path: Path,
                                                         recorders: list[Recorder]) -> None:
    out = tmp_path / "spans.jsonl.gz"
    sent: list[Any] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        rec = Recorder(out)
        recorders.append(rec)
        sent += send({"http": rec.http}, n_runs=2)
        code, stdout, _ = rec.stop(sig)
        assert code == 0 and "wrote 4 spans (2 traces)" in stdout
    data = out.read_bytes()
    assert data.count(b"\x1f\x8b\x08") >= 2  # two gzip members
    # one line per request; SimpleSpanProcessor sends one span per request
    assert len(gzip.decompress(data).splitlines()) == len(sent) == 8
    assert_received_exactly(read_all(out), sent)


def test_record_then_baseline_build(tmp_path: Path, recorders: list[Recorder]) -> None:
    """The file is what the offline commands read (the gate: tests/e2e/test_gate_workflow)."""
    out = tmp_path / "known-good.jsonl"
    rec = Recorder(out)
    recorders.append(rec)
    send({"grpc": rec.grpc}, n_runs=5)
    assert rec.stop()[0] == 0
    base = tmp_path / "baseline.json"
    cli = [sys.executable, "-m", "assaywatch.monitor.commands.cli"]
    res = subprocess.run([*cli, "baseline", "build", str(out), "-o", str(base)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(base.read_text())
    assert [b["n_runs"] for b in doc["baselines"]] == [5]


def test_rotation_keeps_every_span_across_files(tmp_path: Path,
                                                recorders: list[Recorder]) -> None:
    out = tmp_path / "spans.jsonl"
    rec = Recorder(out, "--rotate-bytes", "1500")
    recorders.append(rec)
    sent = send({"http": rec.http}, n_runs=6)
    code, stdout, _ = rec.stop()
    assert code == 0 and "rotated" in stdout
    files = [out, *sorted(tmp_path.glob("spans.jsonl.*"))]
    assert len(files) >= 3
    assert_received_exactly(read_all(*files), sent)


@pytest.mark.parametrize("flag,name", [("--otlp-grpc", "OTLP/gRPC"), ("--otlp-http", "OTLP/HTTP")])
def test_port_in_use_is_exit_3_with_one_line(tmp_path: Path, flag: str, name: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        other = "--otlp-http" if flag == "--otlp-grpc" else "--otlp-grpc"
        res = subprocess.run([*CLI, "-o", str(tmp_path / "s.jsonl"), flag, f"127.0.0.1:{port}",
                              other, "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert name in lines[0] and f"127.0.0.1:{port}" in lines[0]


def test_a_second_recorder_on_the_same_grpc_port_is_refused(tmp_path: Path,
                                                            recorders: list[Recorder]) -> None:
    """gRPC's SO_REUSEPORT would let a second server bind silently and split the traffic."""
    rec = Recorder(tmp_path / "a.jsonl")
    recorders.append(rec)
    res = subprocess.run([*CLI, "-o", str(tmp_path / "b.jsonl"), "--otlp-grpc", rec.grpc,
                          "--otlp-http", "127.0.0.1:0"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 3 and rec.grpc in res.stderr


def test_unwritable_output_is_exit_3(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = subprocess.run([*CLI, "-o", str(blocker / "spans.jsonl"), "--otlp-grpc", "127.0.0.1:0",
                          "--otlp-http", "127.0.0.1:0"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert "cannot open" in res.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_error_refuses_the_request_and_exits_3(recorders: list[Recorder]) -> None:
    rec = Recorder(Path("/dev/full"))
    recorders.append(rec)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    result = OTLPSpanExporter(endpoint=f"http://{rec.http}/v1/traces", timeout=5).export(
        sdk_spans(1))
    assert result == SpanExportResult.FAILURE  # not acknowledged: the exporter keeps them
    rec.proc.wait(30)
    err = rec.proc.stderr.read()  # type: ignore[union-attr]
    assert rec.proc.returncode == 3 and "cannot write /dev/full" in err
    assert "Traceback" not in err


def test_help_names_defaults_and_the_logs_it_keeps() -> None:
    res = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0
    assert "127.0.0.1:4317" in text and "127.0.0.1:4318" in text
    assert "/v1/logs" in text and "gen_ai.evaluation.result" in text


# --------------------------------------------------------------------------- OTLP logs

EVALUATION = {"gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.75,
              "gen_ai.evaluation.score.label": "relevant"}


def send_evaluations(protocol: str, address: str) -> tuple[str, str]:
    """Through the real OTLP log exporter: an evaluation event of a span (with an
    explanation and a body, which are content) and a plain log record. The span's ids."""
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
        OTLPLogExporter as GrpcLogExporter,
    )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    exporter = (GrpcLogExporter(endpoint=f"http://{address}", insecure=True)
                if protocol == "grpc" else HttpLogExporter(endpoint=f"http://{address}/v1/logs"))
    provider = LoggerProvider(resource=Resource.create({"service.name": f"svc-{protocol}"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("assaywatch.test.record")
    tracer = TracerProvider().get_tracer("assaywatch.test.record")
    with tracer.start_as_current_span("invoke_agent a") as span:
        logger.emit(event_name="gen_ai.evaluation.result", body="the whole answer",
                    attributes={**EVALUATION, "gen_ai.evaluation.explanation": "it did"})
        logger.emit(body="an application log line")
    provider.shutdown()
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def test_evaluations_round_trip_through_the_written_json() -> None:
    from assaywatch.monitor.receivers.files import evaluations_to_json
    from assaywatch.monitor.receivers.otlp.decode_logs_json import decode_json_logs
    from assaywatch.monitor.receivers.spans import evaluation_record

    resource = {"service.name": "svc"}
    records = [evaluation_record("ab" * 16, "cd" * 8, 7, dict(EVALUATION), resource, "s"),
               evaluation_record("ab" * 16, "", 8, {"assaywatch.evaluation.passed": False},
                                 resource, "s")]
    doc = json.loads(json.dumps(evaluations_to_json(records)))
    assert decode_json_logs(doc, UNLIMITED).records == records
    assert doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["traceId"] == "ab" * 16


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_record_logs_then_read_evaluation_records(tmp_path: Path, recorders: list[Recorder],
                                                  suffix: str) -> None:
    from assaywatch.monitor.receivers.spans import KIND_EVALUATION

    out = tmp_path / f"spans{suffix}"
    rec = Recorder(out)
    recorders.append(rec)
    sent = send({"http": rec.http}, n_runs=1)
    ids = [send_evaluations("grpc", rec.grpc), send_evaluations("http", rec.http)]
    code, stdout, stderr = rec.stop()
    assert code == 0, stderr
    assert f"wrote {len(sent)} spans (1 traces) to {out}" in stdout
    assert "wrote 2 evaluations" in stdout
    records = read_all(out)
    spans = [r for r in records if r.kind != KIND_EVALUATION]
    evaluations = [r for r in records if r.kind == KIND_EVALUATION]
    assert_received_exactly(spans, sent)
    assert [(r.trace_id, r.span_id) for r in evaluations] == ids
    for r, protocol in zip(evaluations, ("grpc", "http"), strict=True):
        assert r.attributes == EVALUATION  # never the explanation, never the body
        assert r.resource["service.name"] == f"svc-{protocol}"
        assert r.name == "gen_ai.evaluation.result" and r.start_ns > 0
    text = (gzip.decompress(out.read_bytes()) if suffix.endswith(".gz")
            else out.read_bytes()).decode()
    assert "it did" not in text and "the whole answer" not in text
    assert sum('"resourceLogs"' in line for line in text.splitlines()) == 2
