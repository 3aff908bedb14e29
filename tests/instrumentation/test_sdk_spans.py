"""Real SDK clients against the loopback fake server: the spans actually exported.

Each test drives a real client library (openai, anthropic, langgraph, openai-agents)
through ``instrument(tracer_provider=...)`` into an InMemorySpanExporter and asserts span
names, parentage, GenAI attributes, token counts equal to what the server sent, tool
names, errors, output lengths, and the absence of content without the opt-in.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from assaywatch.instrumentation import agent_run, instrument, set_scenario

# Mirrors of the fake server's script (conftest.py; asserted equal in the first test).
FINAL_TEXT = "The weather in Paris is sunny today"
TOOL_ARGS = {"city": "Paris"}
ERROR_MODEL = "error-model"
FakeLLMServer = Any
Capture = Any

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

SECRET = "SECRET-7f3a"  # marker placed in every prompt; must never reach a span unasked
OPENAI_TOOLS = [{"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object",
                                      "properties": {"city": {"type": "string"}}}}}]
TOOL_CALL_LEN = len(json.dumps(TOOL_ARGS))  # a tool-call turn's output is its arguments


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def _all_values(spans: list[ReadableSpan]) -> list[str]:
    out = []
    for s in spans:
        out += [str(v) for v in (s.attributes or {}).values()]
        for e in s.events:
            out += [str(v) for v in (e.attributes or {}).values()]
    return out


def _assert_chat(span: ReadableSpan, reply: Any, provider: str, length: int) -> None:
    a = span.attributes or {}
    assert span.name == f"chat {reply.model}"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == provider
    assert a["gen_ai.request.model"] == reply.model
    assert a["gen_ai.response.model"] == reply.model
    assert a["gen_ai.usage.input_tokens"] == reply.input_tokens
    assert a["gen_ai.usage.output_tokens"] == reply.output_tokens
    assert a["assaywatch.output.length"] == length


def test_openai_chat_tool_call_stream_and_responses(llm: FakeLLMServer, capture: Capture) -> None:
    assert (llm.FINAL_TEXT, llm.TOOL_ARGS, llm.ERROR_MODEL) == (FINAL_TEXT, TOOL_ARGS,
                                                                 ERROR_MODEL)
    instrument(tracer_provider=capture.provider)
    client = openai.OpenAI(base_url=llm.base_url + "/v1", max_retries=0)
    msgs = [{"role": "user", "content": f"{SECRET} weather in Paris?"}]
    with agent_run("weather-bot", version="1.0", scenario="forecast") as run:
        first = client.chat.completions.create(model="gpt-x", messages=msgs, tools=OPENAI_TOOLS)
        assert first.choices[0].message.tool_calls[0].function.name == "weather"
        stream = client.chat.completions.create(
            model="gpt-x", messages=msgs, stream=True, stream_options={"include_usage": True})
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == FINAL_TEXT
        resp = client.responses.create(model="gpt-r", input=f"{SECRET} hi")
        assert resp.output_text == FINAL_TEXT
        run.set_output(text)
    root = capture.named("invoke_agent")
    chats = capture.named("chat")
    assert len(root) == 1 and len(chats) == 3
    agent = root[0]
    assert agent.name == "invoke_agent weather-bot"
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather-bot",
        "gen_ai.agent.version": "1.0", "assaywatch.scenario": "forecast",
        "assaywatch.output.length": len(FINAL_TEXT)}
    assert all(_parent(c) == agent.context.span_id for c in chats)
    assert all(c.context.trace_id == agent.context.trace_id for c in chats)
    lengths = [TOOL_CALL_LEN, len(FINAL_TEXT), len(FINAL_TEXT)]
    for span, reply, length in zip(chats, llm.replies, lengths, strict=True):
        _assert_chat(span, reply, "openai", length)
    assert (chats[1].attributes or {})["gen_ai.request.stream"] is True
    assert (chats[2].attributes or {})["openai.api.type"] == "responses"
    assert not any(SECRET in v for v in _all_values(capture.spans()))


def test_openai_async_streaming_responses(llm: FakeLLMServer, capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    client = openai.AsyncOpenAI(base_url=llm.base_url + "/v1", max_retries=0)

    @agent_run("async-bot")
    async def agent() -> str:
        done = await client.chat.completions.create(
            model="gpt-a", messages=[{"role": "user", "content": SECRET}], tools=OPENAI_TOOLS)
        assert done.choices[0].finish_reason == "tool_calls"
        stream = await client.responses.create(model="gpt-s", input=SECRET, stream=True)
        parts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        return "".join(parts)

    answer = asyncio.run(agent())
    agent_span = capture.named("invoke_agent")[0]
    chats = capture.named("chat")
    assert [c.name for c in chats] == ["chat gpt-a", "chat gpt-s"]
    assert all(_parent(c) == agent_span.context.span_id for c in chats)
    _assert_chat(chats[0], llm.replies[0], "openai", TOOL_CALL_LEN)
    _assert_chat(chats[1], llm.replies[1], "openai", len(answer))
    assert (agent_span.attributes or {})["assaywatch.output.length"] == len(answer)


def test_anthropic_messages_tool_use_and_stream(llm: FakeLLMServer, capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    client = anthropic.Anthropic(base_url=llm.base_url, max_retries=0)
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    msgs = [{"role": "user", "content": f"{SECRET} look it up"}]
    with agent_run("claude-bot"):
        first = client.messages.create(model="claude-x", max_tokens=50, messages=msgs,
                                       tools=tools)
        assert first.content[0].type == "tool_use" and first.content[0].name == "lookup"
        result = {"type": "tool_result", "tool_use_id": first.content[0].id, "content": "42"}
        followup = [*msgs,
                    {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                    {"role": "user", "content": [result]}]
        with client.messages.stream(model="claude-x", max_tokens=50, messages=followup,
                                    tools=tools) as stream:
            text = stream.get_final_text()
    chats = capture.named("chat")
    assert len(chats) == 2
    _assert_chat(chats[0], llm.replies[0], "anthropic", TOOL_CALL_LEN)
    _assert_chat(chats[1], llm.replies[1], "anthropic", len(text))
    assert llm.replies[1].stream and llm.replies[1].tool_call is None
    agent_span = capture.named("invoke_agent")[0]
    assert all(_parent(c) == agent_span.context.span_id for c in chats)
    assert not any(SECRET in v for v in _all_values(capture.spans()))


def test_provider_error_passes_through_and_marks_spans(llm: FakeLLMServer,
                                                       capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    client = openai.OpenAI(base_url=llm.base_url + "/v1", max_retries=0)
    caught: list[BaseException] = []
    with pytest.raises(openai.BadRequestError) as info:
        with agent_run("failing-bot"):
            try:
                client.chat.completions.create(model=ERROR_MODEL,
                                               messages=[{"role": "user", "content": "x"}])
            except openai.BadRequestError as exc:
                caught.append(exc)
                raise
    assert info.value is caught[0]  # the very exception object, unchanged
    assert info.value.status_code == 400
    chat = capture.named("chat")[0]
    agent_span = capture.named("invoke_agent")[0]
    assert chat.status.status_code is StatusCode.ERROR
    assert (chat.attributes or {})["error.type"]  # set by the upstream instrumentation
    assert agent_span.status.status_code is StatusCode.ERROR
    assert (agent_span.attributes or {})["error.type"] == "BadRequestError"
    assert any(e.name == "exception" for e in agent_span.events)


def test_content_appears_only_with_opt_in(llm: FakeLLMServer, capture: Capture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The negative tests above scan for SECRET; this shows the scan would catch content.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    instrument(tracer_provider=capture.provider)
    client = openai.OpenAI(base_url=llm.base_url + "/v1", max_retries=0)
    with agent_run("open-bot") as run:
        client.chat.completions.create(model="gpt-x",
                                       messages=[{"role": "user", "content": SECRET}])
        run.set_output(SECRET)
    chat = capture.named("chat")[0]
    assert SECRET in str((chat.attributes or {})["gen_ai.input.messages"])
    assert SECRET in str((capture.named("invoke_agent")[0].attributes or {})[
        "gen_ai.output.messages"])


class _Scripted:
    """Build a langchain_core fake chat model that accepts ``bind_tools``."""

    @staticmethod
    def model(responses: list[Any]) -> Any:
        from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

        class ToolFake(FakeMessagesListChatModel):
            model_name: str = "fake-model"

            @property
            def _identifying_params(self) -> dict[str, Any]:
                # The instrumentation names chat spans after the model's model_name.
                return {"model_name": self.model_name}

            def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
                return self

        return ToolFake(responses=responses)


def test_langgraph_react_agent(capture: Capture) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import create_react_agent

    @lc_tool
    def weather(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    model = _Scripted.model([
        AIMessage(content="", tool_calls=[{"name": "weather", "args": TOOL_ARGS, "id": "c1"}],
                  usage_metadata={"input_tokens": 12, "output_tokens": 4, "total_tokens": 16}),
        AIMessage(content="It is sunny",
                  usage_metadata={"input_tokens": 20, "output_tokens": 3, "total_tokens": 23}),
    ])
    instrument(tracer_provider=capture.provider)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated for langchain's
        graph = create_react_agent(model, [weather], name="weather_agent")
    set_scenario("lg-scenario")
    out = graph.invoke({"messages": [("user", f"{SECRET} weather?")]})
    assert out["messages"][-1].content == "It is sunny"
    agent_span = capture.named("invoke_agent")[0]
    a = agent_span.attributes or {}
    assert agent_span.name == "invoke_agent weather_agent"
    assert a["gen_ai.agent.name"] == "weather_agent"
    assert a["assaywatch.scenario"] == "lg-scenario"  # stamped by our span processor
    assert a["assaywatch.output.length"] == len("It is sunny")
    chats, tools = capture.named("chat"), capture.named("execute_tool")
    assert [c.name for c in chats] == ["chat fake-model"] * 2
    assert [(c.attributes or {})["gen_ai.usage.input_tokens"] for c in chats] == [12, 20]
    assert [(c.attributes or {})["gen_ai.usage.output_tokens"] for c in chats] == [4, 3]
    assert [t.name for t in tools] == ["execute_tool weather"]
    ta = tools[0].attributes or {}
    assert ta["gen_ai.tool.name"] == "weather"
    assert ta["assaywatch.output.length"] == len("sunny in Paris")
    assert all(_parent(s) == agent_span.context.span_id for s in chats + tools)
    assert not any(SECRET in v for v in _all_values(capture.spans()))


def test_openai_agents_tool_and_handoff(llm: FakeLLMServer, capture: Capture) -> None:
    agents = pytest.importorskip("agents")
    agents.set_default_openai_client(
        openai.AsyncOpenAI(base_url=llm.base_url + "/v1", api_key="sk-test", max_retries=0),
        use_for_tracing=False)
    agents.set_default_openai_api("responses")
    # Keep the SDK's tracing on (our processors need it) but drop its exporter to OpenAI.
    instrument(tracer_provider=capture.provider, disable_openai_trace_export=True)

    @agents.function_tool
    def weather(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    helper = agents.Agent(name="helper", instructions=SECRET, model="gpt-h", tools=[weather])
    triage = agents.Agent(name="triage", instructions=SECRET, model="gpt-t", handoffs=[helper])
    result = agents.Runner.run_sync(triage, f"{SECRET} weather?")
    assert result.final_output == FINAL_TEXT
    by_name = {s.name: s for s in capture.spans()}
    triage_span, helper_span = by_name["invoke_agent triage"], by_name["invoke_agent helper"]
    handoff = by_name["execute_tool transfer_to_helper"]
    tool_span = by_name["execute_tool weather"]
    assert _parent(handoff) == triage_span.context.span_id
    assert (handoff.attributes or {})["gen_ai.transfer.target.name"] == "helper"
    assert _parent(tool_span) == helper_span.context.span_id
    assert (tool_span.attributes or {})["gen_ai.tool.name"] == "weather"
    assert (tool_span.attributes or {})["assaywatch.output.length"] == len("sunny in Paris")
    chats = capture.named("chat")
    assert [c.name for c in chats] == ["chat gpt-t", "chat gpt-h", "chat gpt-h"]
    assert [_parent(c) for c in chats] == [triage_span.context.span_id,
                                           helper_span.context.span_id,
                                           helper_span.context.span_id]
    for span, reply in zip(chats, llm.replies, strict=True):
        assert (span.attributes or {})["gen_ai.usage.input_tokens"] == reply.input_tokens
        assert (span.attributes or {})["gen_ai.usage.output_tokens"] == reply.output_tokens
    assert not any(SECRET in v for v in _all_values(capture.spans()))
