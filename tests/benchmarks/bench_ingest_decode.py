"""Ingest decode throughput: spans/s for protobuf parsing, our decoders, and OTLP/JSON.

Requests are pre-serialized batches of realistic 9-span agent runs (one ``invoke_agent``
root, four ``chat`` spans with GenAI attributes and a choice event, three
``execute_tool`` spans, one ``embeddings`` retrieval), built with the real OTel SDK and
its OTLP encoder. Run: ``python -m tests.benchmarks`` (or this module's ``main``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from assaywatch.monitor.receivers.files import request_to_json
from assaywatch.monitor.receivers.otlp import decode_json_request, decode_proto_request

SPANS_PER_RUN = 9


def agent_runs(n_runs: int) -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "support-agent", "service.version": "3.1.0", "host.name": "pod-7"}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("opentelemetry.instrumentation.genai.openai", "1.3b0")
    for r in range(n_runs):
        with tracer.start_as_current_span(
            "invoke_agent support",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "support",
                "gen_ai.agent.id": "agt_123",
                "gen_ai.conversation.id": f"conv-{r}",
                "gen_ai.provider.name": "openai",
            },
        ):
            for step in range(4):
                with tracer.start_as_current_span(
                    "chat gpt-4o-mini",
                    kind=SpanKind.CLIENT,
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o-mini",
                        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
                        "gen_ai.request.temperature": 0.2,
                        "gen_ai.request.max_tokens": 1024,
                        "gen_ai.usage.input_tokens": 812 + step,
                        "gen_ai.usage.output_tokens": 97,
                        "gen_ai.response.id": f"chatcmpl-{r}-{step}",
                        "gen_ai.response.finish_reasons": ("tool_calls",),
                        "server.address": "api.openai.com",
                        "server.port": 443,
                    },
                ) as chat:
                    chat.add_event("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls"})
                if step < 3:
                    with tracer.start_as_current_span(
                        f"execute_tool tool_{step}",
                        attributes={
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": f"tool_{step}",
                            "gen_ai.tool.call.id": f"call_{r}_{step}",
                            "gen_ai.tool.type": "function",
                        },
                    ) as tool:
                        if step == 2 and r % 5 == 0:
                            tool.set_status(Status(StatusCode.ERROR, "timeout"))
            with tracer.start_as_current_span(
                "embeddings text-embedding-3-small",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "embeddings",
                    "gen_ai.request.model": "text-embedding-3-small",
                    "gen_ai.usage.input_tokens": 64,
                },
            ):
                pass
    provider.shutdown()
    spans = list(exporter.get_finished_spans())
    assert len(spans) == n_runs * SPANS_PER_RUN
    return spans


def _rate(fn: Callable[[], object], n_spans: int, min_seconds: float = 0.4) -> float:
    fn()  # warm-up
    reps, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_seconds:
        fn()
        reps += 1
        elapsed = time.perf_counter() - t0
    return reps * n_spans / elapsed


def main() -> None:
    rows = []
    for n_runs in (11, 33, 55):
        spans = agent_runs(n_runs)
        req = encode_spans(spans)
        proto = req.SerializeToString()
        text = json.dumps(request_to_json(req), separators=(",", ":")).encode()
        n = len(spans)

        def parse_only(data: bytes = proto) -> object:
            return ExportTraceServiceRequest.FromString(data)

        rows.append(
            (
                n,
                len(proto),
                len(text),
                _rate(parse_only, n),
                _rate(lambda p=proto: decode_proto_request(p), n),
                _rate(lambda t=text: json.loads(t), n),
                _rate(lambda t=text: decode_json_request(t), n),
            )
        )
    print("ingest decode throughput (spans/s; 9-span GenAI agent runs per request)")
    header = (
        f"{'spans/req':>9} {'proto B':>8} {'json B':>8} {'pb parse':>10} "
        f"{'decode_pb':>10} {'json.loads':>10} {'decode_json':>11}"
    )
    print(header)
    print("-" * len(header))
    for n, pb, js, parse, dpb, jl, djs in rows:
        print(f"{n:>9} {pb:>8} {js:>8} {parse:>10,.0f} {dpb:>10,.0f} {jl:>10,.0f} {djs:>11,.0f}")
    print("decode_pb = parse + walk every attribute/event into SpanRecords;")
    print("decode_json = json.loads + our OTLP/JSON walker into SpanRecords.")


if __name__ == "__main__":
    main()
