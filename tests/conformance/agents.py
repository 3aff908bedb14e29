"""The tiny agents that ``record`` runs, one scenario per function, each in its own process.

Run by ``record`` as ``python -m tests.conformance.agents NAME --base-url URL --out FILE
--runs N [--otlp-endpoint URL]``; each invocation of the agent is flushed and written as one
OTLP/JSON line (``ExportTraceServiceRequest``) to FILE. With ``--otlp-endpoint`` the same
spans (those that reach the capture, i.e. after Langfuse's own filters) also go to a live
collector or ``assaywatch monitor`` over OTLP/HTTP protobuf, through the real
``opentelemetry-exporter-otlp-proto-http`` exporter behind a ``BatchSpanProcessor``, which
is flushed and shut down before the process exits. Third-party packages are imported inside
each scenario function; a missing one makes the process exit with :data:`EXIT_SKIP` and a
``SKIP:`` line on stderr.

Every tool-using agent does the same thing, which is what the expectations count:

1. LLM call offering the tool ``get_weather`` -> the fake server answers with a tool call
   (100 input / 20 output tokens);
2. the tool ``get_weather(city="Paris")`` runs;
3. LLM call with the tool result -> final text (150 input / 30 output tokens).

The "bare" scenarios make one LLM call without tools (50 input / 10 output tokens).
All LLM calls ask for the model :data:`MODEL`; the fake server echoes it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["EXIT_SKIP", "MODEL", "QUESTION", "SCENARIOS", "service_name"]

MODEL = "gpt-4o-mini"
QUESTION = "What is the weather in Paris?"
EXIT_SKIP = 42
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def service_name(scenario: str) -> str:
    """The ``service.name`` resource attribute each scenario sets explicitly."""
    return f"conformance-{scenario}"


def weather(city: str) -> str:
    return f"sunny, 21 degrees in {city}"


class Skip(Exception):
    """A package the scenario needs cannot be imported."""


# --------------------------------------------------------------------------- OTLP JSON


def _b64_to_hex(v: str) -> str:
    return base64.b64decode(v).hex() if v else v


def _fix_ids(obj: Any) -> Any:
    """MessageToDict renders bytes as base64; OTLP/JSON wants hex trace and span ids."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                out[k] = _b64_to_hex(v)
            else:
                out[k] = _fix_ids(v)
        return out
    if isinstance(obj, list):
        return [_fix_ids(x) for x in obj]
    return obj


def request_to_json(req: Any) -> dict[str, Any]:
    """OTLP/JSON dict of an ``ExportTraceServiceRequest``.

    The project's own writer when importable (its module may move), else protobuf's
    ``MessageToDict`` with integer enums and ids converted from base64 to hex.
    """
    for mod in ("assaywatch.monitor.receivers.files.otlp_json",
                "assaywatch.monitor.readers.otlp_json"):
        try:
            fn = __import__(mod, fromlist=["request_to_json"]).request_to_json
        except Exception:  # noqa: BLE001 - not installed here, or moved: use the fallback
            continue
        return dict(fn(req))
    from google.protobuf.json_format import MessageToDict

    return dict(_fix_ids(MessageToDict(req, use_integers_for_enums=True)))


def _exporter_class() -> type:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        """Buffers exported spans; :meth:`write_line` appends them as one OTLP/JSON line.

        ``live``, a span processor (the OTLP ``BatchSpanProcessor``), gets every exported
        span as it arrives, so the live stream and the file hold the same spans.
        """

        def __init__(self, path: str | None, live: Any = None) -> None:
            self.path = path
            self.live = live
            self.buffer: list[Any] = []
            self.lines = 0
            self.spans = 0

        def export(self, spans: Sequence[Any]) -> Any:
            self.buffer.extend(spans)
            if self.live is not None:
                for span in spans:
                    self.live.on_end(span)
            return SpanExportResult.SUCCESS

        def write_line(self) -> int:
            spans, self.buffer = self.buffer, []
            if not spans:
                return 0
            self.spans += len(spans)
            if self.path is None:
                return len(spans)
            spans.sort(key=lambda s: (s.start_time or 0))
            line = json.dumps(request_to_json(encode_spans(spans)), separators=(",", ":"))
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            self.lines += 1
            return len(spans)

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return JsonLinesExporter


def traces_url(endpoint: str) -> str:
    """OTLP/HTTP traces URL of ``endpoint`` (``http://host:port`` or the full URL)."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    url = url.rstrip("/")
    return url if url.endswith("/v1/traces") else f"{url}/v1/traces"


def _live_processor(endpoint: str) -> Any:
    """A ``BatchSpanProcessor`` over the real OTLP/HTTP protobuf exporter to ``endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=10),
                              schedule_delay_millis=200)


def _provider(scenario: str, exporter: Any, provider_cls: Any = None) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    cls = provider_cls or TracerProvider
    provider = cls(resource=Resource.create({"service.name": service_name(scenario)}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _require(*modules: str) -> None:
    import importlib

    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as exc:  # noqa: BLE001 - any import failure means "cannot record"
            raise Skip(f"{m}: {type(exc).__name__}: {exc}") from exc


def _manual_loop(client: Any, call_tool: Callable[[str], str]) -> str:
    """Two chat completions around one tool call (the fake server decides the tool call)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL_SCHEMA])
    call = first.choices[0].message.tool_calls[0]
    result = call_tool(json.loads(call.function.arguments)["city"])
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL_SCHEMA])
    return str(final.choices[0].message.content)


def _openai_client(base_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="sk-fake", max_retries=0)


# --------------------------------------------------------------------------- scenarios
# Each returns a callable running ONE agent invocation, and a flush callable.


def openinference_openai_agent(base_url: str, exp: Any) -> Callable[[], object]:
    _require("openai", "openinference.instrumentation.openai")
    from openinference.instrumentation import TracerProvider as OITracerProvider
    from openinference.instrumentation.openai import OpenAIInstrumentor

    provider = _provider("openinference_openai_agent", exp, OITracerProvider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("conformance.agent")
    client = _openai_client(base_url)

    @tracer.tool(name="get_weather", description="Current weather of a city.")
    def get_weather(city: str) -> str:
        return weather(city)

    @tracer.agent(name="weather_agent")
    def run_agent(question: str) -> str:
        return _manual_loop(client, get_weather)

    return lambda: run_agent(QUESTION)


def openinference_openai_bare(base_url: str, exp: Any) -> Callable[[], object]:
    _require("openai", "openinference.instrumentation.openai")
    from openinference.instrumentation.openai import OpenAIInstrumentor

    provider = _provider("openinference_openai_bare", exp)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = _openai_client(base_url)
    return lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}])


def _langgraph(base_url: str, exp: Any, scenario: str, name: str | None) -> Callable[[], object]:
    _require("langgraph.graph", "langchain_openai", "openinference.instrumentation.langchain")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from openinference.instrumentation import TraceConfig
    from openinference.instrumentation.langchain import LangChainInstrumentor

    provider = _provider(scenario, exp)
    # Inputs and outputs (the whole graph state on every CHAIN span) are hidden to keep the
    # fixture small (< 50 KB for 3 runs); messages, metadata and usage stay as recorded.
    LangChainInstrumentor().instrument(
        tracer_provider=provider, config=TraceConfig(hide_inputs=True, hide_outputs=True))

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return weather(city)

    model = ChatOpenAI(model=MODEL, base_url=base_url, api_key="sk-fake",  # type: ignore[arg-type]
                       max_retries=0).bind_tools([get_weather])

    # No annotations on the nodes: LangGraph resolves them at run time, and this module's
    # `from __future__ import annotations` would hide the locally imported MessagesState.
    def call_model(state):  # type: ignore[no-untyped-def]
        return {"messages": [model.invoke(state["messages"])]}

    def should_continue(state):  # type: ignore[no-untyped-def]
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", should_continue, ["tools", END])
    graph.add_edge("tools", "agent")
    app = graph.compile(name=name) if name else graph.compile()
    return lambda: app.invoke({"messages": [("user", QUESTION)]})


def openinference_langgraph_default(base_url: str, exp: Any) -> Callable[[], object]:
    return _langgraph(base_url, exp, "openinference_langgraph_default", None)


def openinference_langgraph_named(base_url: str, exp: Any) -> Callable[[], object]:
    return _langgraph(base_url, exp, "openinference_langgraph_named", "support_agent")


def traceloop_sdk(base_url: str, exp: Any) -> Callable[[], object]:
    os.environ.setdefault("TRACELOOP_TELEMETRY", "false")
    os.environ.setdefault("TRACELOOP_METRICS_ENABLED", "false")
    os.environ.setdefault("TRACELOOP_LOGGING_ENABLED", "false")
    _require("openai", "traceloop.sdk")
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import agent, tool, workflow
    from traceloop.sdk.instruments import Instruments

    name = service_name("traceloop_sdk")
    Traceloop.init(app_name=name, exporter=exp, disable_batch=True, telemetry_enabled=False,
                   instruments={Instruments.OPENAI}, resource_attributes={"service.name": name})
    client = _openai_client(base_url)

    @tool(name="get_weather")
    def get_weather(city: str) -> str:
        return weather(city)

    @agent(name="weather_agent")
    def run_agent(question: str) -> str:
        return _manual_loop(client, get_weather)

    @workflow(name="weather_workflow")
    def handle(question: str) -> str:
        return run_agent(question)

    return lambda: handle(QUESTION)


def otel_openai_v2_with_agent(base_url: str, exp: Any) -> Callable[[], object]:
    _require("openai", "opentelemetry.instrumentation.openai_v2")
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.trace import SpanKind

    provider = _provider("otel_openai_v2_with_agent", exp)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("conformance.agent")
    client = _openai_client(base_url)

    def get_weather(city: str) -> str:
        with tracer.start_as_current_span("execute_tool get_weather", kind=SpanKind.INTERNAL,
                                          attributes={"gen_ai.operation.name": "execute_tool",
                                                      "gen_ai.tool.name": "get_weather",
                                                      "gen_ai.tool.type": "function"}):
            return weather(city)

    def run_agent() -> str:
        with tracer.start_as_current_span("invoke_agent weather_agent", kind=SpanKind.INTERNAL,
                                          attributes={"gen_ai.operation.name": "invoke_agent",
                                                      "gen_ai.agent.name": "weather_agent",
                                                      "gen_ai.provider.name": "openai",
                                                      "gen_ai.request.model": MODEL}):
            return _manual_loop(client, get_weather)

    return run_agent


def otel_openai_v2_bare(base_url: str, exp: Any) -> Callable[[], object]:
    _require("openai", "opentelemetry.instrumentation.openai_v2")
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    provider = _provider("otel_openai_v2_bare", exp)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = _openai_client(base_url)
    return lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}])


def langfuse_sdk(base_url: str, exp: Any) -> Callable[[], object]:
    _require("openai", "langfuse", "langfuse.openai")
    from langfuse import Langfuse

    root = base_url.rsplit("/v1", 1)[0]
    # Langfuse's own span processor exports to `exp` (span_exporter=): the capture is what
    # Langfuse would post to {host}/api/public/otel/v1/traces, after its filters.
    provider = _provider("langfuse_sdk", None)
    lf = Langfuse(public_key="pk-lf-fake", secret_key="sk-lf-fake", base_url=root,
                  tracer_provider=provider, span_exporter=exp, flush_at=1)
    from langfuse.openai import OpenAI  # the drop-in wrapper: generations with usage

    client = OpenAI(base_url=base_url, api_key="sk-fake", max_retries=0)

    def get_weather(city: str) -> str:
        with lf.start_as_current_observation(as_type="tool", name="get_weather",
                                             input={"city": city}) as obs:
            out = weather(city)
            obs.update(output=out)
            return out

    def run_agent() -> str:
        with lf.start_as_current_observation(as_type="agent", name="weather_agent",
                                             input=QUESTION) as obs:
            out = _manual_loop(client, get_weather)
            obs.update(output=out)
        lf.flush()
        return out

    return run_agent


def openai_agents_sdk(base_url: str, exp: Any) -> Callable[[], object]:
    _require("agents", "opentelemetry.instrumentation.genai.openai_agents",
             "opentelemetry.instrumentation.genai.openai")
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI
    from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
    from opentelemetry.instrumentation.genai.openai_agents import OpenAIAgentsInstrumentor

    provider = _provider("openai_agents_sdk", exp)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider,
                                          disable_openai_trace_export=True)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return weather(city)

    client = AsyncOpenAI(base_url=base_url, api_key="sk-fake", max_retries=0)
    agent = Agent(name="weather_agent", instructions="Answer weather questions.",
                  tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
    config = RunConfig(workflow_name="weather_workflow")

    loop = asyncio.new_event_loop()  # one loop for all invocations: the client's pool lives on it

    def run() -> object:
        return loop.run_until_complete(Runner.run(agent, QUESTION, run_config=config)).final_output

    return run


SCENARIOS: dict[str, Callable[[str, Any], Callable[[], object]]] = {
    f.__name__: f for f in (
        openinference_openai_agent, openinference_openai_bare,
        openinference_langgraph_default, openinference_langgraph_named, traceloop_sdk,
        otel_openai_v2_with_agent, otel_openai_v2_bare, langfuse_sdk, openai_agents_sdk)
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one conformance agent (see record.py).")
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--out", help="OTLP/JSON Lines file to append to")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--otlp-endpoint", metavar="URL",
                    help="also export over OTLP/HTTP protobuf to URL (http://host:port, "
                         "/v1/traces appended unless given)")
    args = ap.parse_args(argv)
    if not args.out and not args.otlp_endpoint:
        ap.error("give --out FILE, --otlp-endpoint URL or both")
    os.environ.setdefault("OPENAI_API_KEY", "sk-fake")
    try:
        _require("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.common")
        if args.otlp_endpoint:
            _require("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        live = _live_processor(args.otlp_endpoint) if args.otlp_endpoint else None
        exp = _exporter_class()(args.out, live)
        invoke = SCENARIOS[args.scenario](args.base_url, exp)
    except Skip as exc:
        print(f"SKIP: {args.scenario}: {exc}", file=sys.stderr)
        return EXIT_SKIP
    from opentelemetry import trace

    for _ in range(args.runs):
        invoke()
        provider = trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush:
            flush()
        exp.write_line()
    delivered = True
    if live is not None:
        delivered = bool(live.force_flush(timeout_millis=30_000))
        live.shutdown()
    print(json.dumps({"scenario": args.scenario, "lines": exp.lines, "spans": exp.spans,
                      "otlp_endpoint": args.otlp_endpoint, "otlp_flushed": delivered}))
    if not delivered:
        print(f"ERROR: {args.scenario}: spans not delivered to {args.otlp_endpoint}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
