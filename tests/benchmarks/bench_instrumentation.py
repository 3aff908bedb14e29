"""Overhead of the instrumentation per agent run (9 spans), beside the bare SDK's cost.

One agent run = 1 ``invoke_agent`` + 4 ``chat`` + 4 ``execute_tool`` spans. Two pipelines:
a no-op exporter behind a SimpleSpanProcessor (pure span cost) and the production one,
BatchSpanProcessor + OTLP/HTTP exporter to a loopback sink. For each, the same process
measures:

- **bare SDK**: 9 nested ``start_as_current_span`` spans with the same attributes;
- **assaywatch**: ``agent_run`` + 4 ``@tool`` calls + 4 ``chat`` invocations through
  util-genai (what the upstream OpenAI/Anthropic instrumentation runs per call, minus the
  client library's own work), with our completion hook and scenario processor.

Printed: median and interquartile range over repetitions, in microseconds per run.
Run with ``python -m tests.benchmarks`` (or this module's ``main``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

REPS = 25
RUNS_PER_REP = 100


class _NoOpExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _sink() -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces"


def _bare_run(provider: TracerProvider) -> Callable[[], None]:
    tracer = provider.get_tracer("bench.bare")

    def run() -> None:
        with tracer.start_as_current_span("invoke_agent bot", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bot"}):
            for _ in range(4):
                with tracer.start_as_current_span("chat m", attributes={
                        "gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}) as s:
                    s.set_attributes({"gen_ai.usage.input_tokens": 10,
                                      "gen_ai.usage.output_tokens": 5})
                with tracer.start_as_current_span("execute_tool t", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}):
                    pass
    return run


def _ours_run(provider: TracerProvider) -> Callable[[], None]:
    from opentelemetry.util.genai.handler import TelemetryHandler
    from opentelemetry.util.genai.types import OutputMessage, Text

    from assaywatch.instrumentation import agent_run, instrument, tool
    from assaywatch.instrumentation.frameworks import LengthHook

    instrument(tracer_provider=provider, frameworks=[])
    handler = TelemetryHandler(tracer_provider=provider, completion_hook=LengthHook(),
                               instrumentation_scope_name="bench.genai")

    @tool("t")
    def t() -> str:
        return "result"

    def run() -> None:
        with agent_run("bot", scenario="bench") as r:
            for _ in range(4):
                inv = handler.inference("openai", request_model="m")
                inv.output_messages = [OutputMessage(role="assistant", parts=[Text("hello")],
                                                     finish_reason="stop")]
                inv.usage_input_tokens, inv.usage_output_tokens = 10, 5
                inv.stop()
                t()
            r.set_output("answer")
    return run


def _measure(run: Callable[[], None], flush: Callable[[], Any]) -> list[float]:
    for _ in range(50):
        run()
    flush()
    per_run_us = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(RUNS_PER_REP):
            run()
        per_run_us.append((time.perf_counter() - t0) / RUNS_PER_REP * 1e6)
        flush()
    return per_run_us


def _summary(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):9.1f}  [{q[0]:7.1f}, {q[2]:7.1f}]"


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from assaywatch.instrumentation import uninstrument

    httpd, url = _sink()
    pipelines: list[tuple[str, Callable[[], Any]]] = [
        ("no-op exporter", lambda: SimpleSpanProcessor(_NoOpExporter())),
        ("batch + OTLP/HTTP", lambda: BatchSpanProcessor(OTLPSpanExporter(endpoint=url))),
    ]
    print("Instrumentation overhead per agent run (9 spans), microseconds: median [IQR] over "
          f"{REPS} x {RUNS_PER_REP} runs")
    print(f"{'pipeline':<20} {'bare SDK':>26} {'assaywatch':>26} {'overhead':>10}")
    try:
        for label, make in pipelines:
            bare_p, ours_p = TracerProvider(), TracerProvider()
            bare_p.add_span_processor(make())
            ours_p.add_span_processor(make())
            bare = _measure(_bare_run(bare_p), bare_p.force_flush)
            ours = _measure(_ours_run(ours_p), ours_p.force_flush)
            uninstrument()
            over = statistics.median(ours) - statistics.median(bare)
            print(f"{label:<20} {_summary(bare):>26} {_summary(ours):>26} {over:10.1f}")
            bare_p.shutdown()
            ours_p.shutdown()
    finally:
        httpd.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
