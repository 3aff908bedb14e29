"""Handoff spans for the OpenAI Agents SDK, which its GenAI instrumentation leaves out.

``opentelemetry-instrumentation-genai-openai-agents`` 1.3b0 maps agent and function spans
and ignores ``HandoffSpanData`` ("no semconv yet"). A handoff is a step the monitor
counts (action ``handoff``, DESIGN.md "Data model"), so this thin agents-SDK tracing
processor emits one INTERNAL span per handoff, as the conventions' in-progress
agent-transfer refinement shapes it (shared/reference/otel-conventions.md 1.1):
``execute_tool transfer_to_{target}`` with ``gen_ai.operation.name=execute_tool``,
``gen_ai.tool.name=transfer_to_{target}`` (the SDK's default handoff tool name),
``gen_ai.tool.type=function`` and ``gen_ai.transfer.target.name={target}``. It starts in
the current context, i.e. under the handing-off agent's ``invoke_agent`` span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from assaywatch.instrumentation import attributes as A
from assaywatch.instrumentation._safety import guarded

TRANSFER_TARGET = "gen_ai.transfer.target.name"


class HandoffProcessor:
    """An agents-SDK ``TracingProcessor`` turning handoff spans into OpenTelemetry spans."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("assaywatch.instrumentation.openai_agents",
                                        tracer_provider=tracer_provider)
        self._open: dict[int, trace.Span] = {}

    def on_trace_start(self, trace_: Any) -> None:
        return None

    def on_trace_end(self, trace_: Any) -> None:
        return None

    def on_span_start(self, span: Any) -> None:
        with guarded("agents_handoff.start"):
            data = span.span_data
            if getattr(data, "type", None) != "handoff":
                return
            # The SDK fills ``to_agent`` only when the handoff completes; named at the end.
            otel_span = self._tracer.start_span(
                "execute_tool transfer", kind=SpanKind.INTERNAL,
                attributes={A.GEN_AI_OPERATION_NAME: A.OP_EXECUTE_TOOL,
                            A.GEN_AI_TOOL_TYPE: "function"})
            self._open[id(span)] = otel_span

    def on_span_end(self, span: Any) -> None:
        with guarded("agents_handoff.end"):
            otel_span = self._open.pop(id(span), None)
            if otel_span is None:
                return
            target = span.span_data.to_agent or "unknown"
            name = f"transfer_to_{target}"
            otel_span.update_name(f"execute_tool {name}")
            otel_span.set_attributes({A.GEN_AI_TOOL_NAME: name, TRANSFER_TARGET: target})
            error = getattr(span, "error", None)
            if error is not None:
                otel_span.set_attribute(A.ERROR_TYPE, "_OTHER")
                otel_span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))
            otel_span.end()

    def shutdown(self) -> None:
        for otel_span in self._open.values():
            otel_span.end()
        self._open.clear()

    def force_flush(self) -> None:
        return None


def install(tracer_provider: trace.TracerProvider | None) -> HandoffProcessor:
    """Register a :class:`HandoffProcessor` with the agents SDK and return it."""
    from agents import add_trace_processor

    processor = HandoffProcessor(tracer_provider)
    add_trace_processor(processor)  # type: ignore[arg-type]
    return processor


def remove(processor: HandoffProcessor) -> None:
    """Unregister ``processor``, keeping every other agents-SDK trace processor."""
    from agents import set_trace_processors
    from agents.tracing import get_trace_provider

    current = getattr(getattr(get_trace_provider(), "_multi_processor", None), "_processors", ())
    set_trace_processors([p for p in current if p is not processor])
    processor.shutdown()
