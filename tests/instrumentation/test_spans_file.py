"""``ASSAYWATCH_SPANS_FILE``: ``import assaywatch.auto`` also appends the process's spans
to a file as OTLP JSON Lines, the span file ``baseline build`` and ``gate`` read.

Agents run in fresh interpreters (SDK configuration is global and one-shot); the file is
read back with the monitor's own reader. Nothing binds or contacts the default ports.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from assaywatch.instrumentation import setup
from assaywatch.monitor.receivers.files import read_spans

AGENT = textwrap.dedent("""
    import assaywatch.auto
    import os, sys
    from opentelemetry import trace
    from assaywatch.instrumentation import agent_run, record_evaluation, tool

    pad = "p" * int(os.environ.get("PAD", "0"))
    for i in range(int(os.environ.get("RUNS", "3"))):
        with agent_run("file-agent", version="1.0", scenario="s") as run:
            tool("lookup")(lambda: "x" * 10)()
            if pad:
                trace.get_current_span().set_attribute("pad", pad)
            run.set_output("done")
            record_evaluation(passed=True)
    heavy = sorted(m for m in list(sys.modules)
                   if m == "numpy" or m.startswith(("assaywatch.monitor", "assaywatch.analyzers")))
    print(",".join(heavy))
""")


def clean_env() -> dict[str, str]:
    """The test's environment without OTEL_/ASSAYWATCH_ settings; no agent framework is
    instrumented (none is used, and importing them is slow)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ASSAYWATCH_"))}
    env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "*"
    return env


def run_agent(tmp_path: Path, env: dict[str, str],
              check: bool = True) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    res = subprocess.run([sys.executable, str(script)], env={**clean_env(), **env}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def records(*paths: Path) -> list:
    return [s for b in read_spans([str(p) for p in paths], strict=True) for s in b]


def test_line_is_otlp_json_with_hex_ids_and_integer_enums() -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        with tracer.start_as_current_span("child", links=[]):
            pass
    other = tracer.start_span("linked", links=[__import__("opentelemetry").trace.Link(
        parent.get_span_context())])
    other.end()
    spans = memory.get_finished_spans()
    line = setup.spans_to_json_line(spans)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    out = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    by_name = {s["name"]: s for s in out}
    ctx = parent.get_span_context()
    assert by_name["parent"]["traceId"] == format(ctx.trace_id, "032x")
    assert by_name["child"]["parentSpanId"] == format(ctx.span_id, "016x")
    assert by_name["linked"]["links"][0]["spanId"] == format(ctx.span_id, "016x")
    assert by_name["parent"]["kind"] == 1  # integer enum, not "SPAN_KIND_INTERNAL"
    assert isinstance(by_name["parent"]["startTimeUnixNano"], str)  # int64 as a string


def test_auto_writes_the_file_readable_by_the_gate_and_stays_light(tmp_path: Path) -> None:
    out = tmp_path / "spans" / "agent.jsonl"  # the folder is created
    res = run_agent(tmp_path, {"ASSAYWATCH_SPANS_FILE": str(out), "OTEL_TRACES_EXPORTER": "none",
                               "RUNS": "4"})
    assert res.stdout.strip() == ""  # no numpy, monitor or analyzers in the agent
    got = records(out)
    assert len(got) == 8 and len({s.trace_id for s in got}) == 4
    assert {s.attributes.get("gen_ai.agent.name") for s in got} >= {"file-agent"}
    from assaywatch.monitor.offline.load import load_runs

    runs, _ = load_runs([str(out)])
    assert len(runs) == 4


def test_file_is_written_in_addition_to_the_otlp_export(tmp_path: Path) -> None:
    """Both the OTLP export (to a real ``assaywatch record``) and the file get every span."""
    rec_out = tmp_path / "recorded.jsonl"
    rec = subprocess.Popen(
        [sys.executable, "-m", "assaywatch.monitor.commands.cli", "record", "-o", str(rec_out),
         "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = rec.stdout.readline()  # type: ignore[union-attr]
        grpc = line.split("otlp_grpc=", 1)[1].split()[0]
        file_out = tmp_path / "own.jsonl.gz"
        run_agent(tmp_path, {"ASSAYWATCH_SPANS_FILE": str(file_out),
                             "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{grpc}"})
    finally:
        rec.send_signal(signal.SIGTERM)
        rec.communicate(timeout=30)
    assert rec.returncode == 0
    own, recorded = records(file_out), records(rec_out)
    assert len(own) == 6
    assert sorted((s.span_id, s.name, s.start_ns) for s in own) == sorted(
        (s.span_id, s.name, s.start_ns) for s in recorded)


@pytest.mark.parametrize("name", ["shared.jsonl", "shared.jsonl.gz"])
def test_processes_appending_to_one_file_never_interleave(tmp_path: Path, name: str) -> None:
    """Lines far above PIPE_BUF (about 100 KB each) from 4 concurrent processes."""
    out = tmp_path / name
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {**clean_env(), "ASSAYWATCH_SPANS_FILE": str(out), "OTEL_TRACES_EXPORTER": "none",
           "RUNS": "10", "PAD": "20000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
           "OTEL_BSP_SCHEDULE_DELAY": "1"}
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    raw = gzip.decompress(out.read_bytes()) if name.endswith(".gz") else out.read_bytes()
    lines = raw.splitlines()
    assert len(lines) >= 4 * 2 and max(len(ln) for ln in lines) > 65536
    for ln in lines:
        json.loads(ln)  # every line whole
    got = records(out)
    assert len(got) == 4 * 10 * 2 and len({s.trace_id for s in got}) == 4 * 10


def test_an_app_provider_is_kept_and_the_variable_is_not_applied(tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    script = tmp_path / "own_provider.py"
    script.write_text(textwrap.dedent("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())
        import assaywatch.auto
        with trace.get_tracer("t").start_as_current_span("x"):
            pass
    """))
    env = {**clean_env(), "ASSAYWATCH_SPANS_FILE": str(out), "OTEL_TRACES_EXPORTER": "none"}
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert not out.exists()
    assert "ASSAYWATCH_SPANS_FILE" in res.stderr


def test_an_unwritable_file_never_breaks_the_agent(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    res = run_agent(tmp_path, {"ASSAYWATCH_SPANS_FILE": str(blocker / "spans.jsonl"),
                               "OTEL_TRACES_EXPORTER": "none"})
    assert res.returncode == 0
    assert "spans_file" in res.stderr  # logged once by the telemetry safety net
