"""classify(): every dialect, the precedence of the cheat-sheet, content-free lengths."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assaywatch.analyzers.model import Action
from assaywatch.monitor.pipeline.normalize import Kind, classify, text_length
from assaywatch.monitor.receivers.spans import STATUS_ERROR, AttrValue, SpanEvent, SpanRecord
from tests.monitor.spanfactory import (
    DIALECTS,
    Agent,
    Handoff,
    Llm,
    Retrieve,
    SpanFactory,
    Tool,
)


def span(attrs: dict[str, AttrValue] | None = None, name: str = "s", kind: int = 1,
         parent: str = "p1", events: list[SpanEvent] | None = None,
         status: int = 0) -> SpanRecord:
    return SpanRecord(trace_id="t" * 32, span_id="a" * 16, parent_span_id=parent, name=name,
                      start_ns=0, end_ns=1, kind=kind, status_code=status,
                      attributes=attrs or {}, events=events or [])


def by_name(spans: list[SpanRecord]) -> dict[str, SpanRecord]:
    return {s.name: s for s in spans}


SCRIPT = Agent(name="planner", steps=[
    Retrieve("kb"),
    Llm(model="gpt-4o", input_tokens=111, output_tokens=22, output="seven chars x"),
    Tool("search_web", result="found"),
    Handoff("billing"),
], output="final answer")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_classifies_every_step_kind(dialect: str) -> None:
    spans = SpanFactory(seed=3).agent_run(SCRIPT, dialect)
    assert len(spans) == 5
    retrieve, llm, tool, handoff, agent = (classify(s) for s in spans)  # end order
    assert (agent.kind, agent.action, agent.is_agent_span) == (Kind.AGENT, Action.AGENT, True)
    assert agent.agent_name == "planner"
    assert retrieve.action is Action.RETRIEVE and not retrieve.is_agent_span
    assert (llm.kind, llm.model, llm.input_tokens, llm.output_tokens) == (
        Kind.LLM, "gpt-4o", 111, 22)
    # The output length is the text's length, whichever way the dialect wrapped it.
    assert llm.output_length == len("seven chars x")
    assert (tool.kind, tool.tool) == (Kind.TOOL, "search_web")
    assert tool.output_length == len("found")
    assert (handoff.kind, handoff.action, handoff.tool) == (Kind.HANDOFF, Action.HANDOFF,
                                                           "billing")
    if dialect != "genai_deprecated":  # the pre-1.37 agent span carried no content
        assert agent.output_length == len("final answer")


def test_output_length_falls_back_to_output_tokens_without_content() -> None:
    spans = SpanFactory(seed=3, capture_content=False).agent_run(SCRIPT, "genai")
    llm = classify(spans[1])
    assert llm.output_length == 22


def test_operation_name_outranks_other_dialect_keys_and_unknown_values_fall_through() -> None:
    both = classify(span({"gen_ai.operation.name": "execute_tool",
                          "openinference.span.kind": "LLM", "gen_ai.tool.name": "x"}))
    assert both.kind is Kind.TOOL
    custom = classify(span({"gen_ai.operation.name": "my_custom_op",
                            "openinference.span.kind": "RETRIEVER"}))
    assert custom.kind is Kind.RETRIEVE
    marked_only = classify(span({"gen_ai.operation.name": "my_custom_op"}))
    assert marked_only.kind is Kind.OTHER
    assert classify(span({"http.request.method": "GET"})).kind is Kind.GENERIC


@pytest.mark.parametrize(("attrs", "name", "kind"), [
    ({"gen_ai.operation.name": "text_completion"}, "s", Kind.LLM),
    ({"gen_ai.operation.name": "generate_content"}, "s", Kind.LLM),
    ({"gen_ai.operation.name": "embeddings"}, "s", Kind.EMBEDDING),
    ({"openinference.span.kind": "EMBEDDING"}, "s", Kind.EMBEDDING),
    ({"openinference.span.kind": "CHAIN"}, "s", Kind.CHAIN),
    ({"openinference.span.kind": "GUARDRAIL"}, "s", Kind.OTHER),
    ({"traceloop.span.kind": "workflow"}, "s", Kind.WORKFLOW),
    ({"traceloop.span.kind": "task"}, "s", Kind.CHAIN),
    ({"langfuse.observation.type": "chain"}, "s", Kind.CHAIN),
    ({"langfuse.observation.type": "embedding"}, "s", Kind.EMBEDDING),
    ({"llm.request.type": "embedding"}, "s", Kind.EMBEDDING),
    ({"mcp.method.name": "tools/call"}, "tools/call get_weather", Kind.TOOL),
    ({"gen_ai.tool.call.id": "c1"}, "s", Kind.TOOL),
    ({}, "anthropic.completion", Kind.LLM),
    ({}, "openai.embeddings", Kind.EMBEDDING),
    ({}, "config.chat", Kind.GENERIC),  # not a provider prefix
    ({"llm.model_name": "m"}, "s", Kind.LLM),
    ({"gen_ai.operation.name": "invoke_workflow"}, "s", Kind.WORKFLOW),
])
def test_kind_rules(attrs: dict[str, AttrValue], name: str, kind: Kind) -> None:
    assert classify(span(attrs, name=name)).kind is kind


def test_embeddings_are_retrieve_steps() -> None:
    n = classify(span({"gen_ai.operation.name": "embeddings",
                       "gen_ai.request.model": "text-embedding-3-small"}))
    assert n.action is Action.RETRIEVE and n.model == "text-embedding-3-small"


def test_mcp_tool_name_from_span_name() -> None:
    assert classify(span({"mcp.method.name": "tools/call"},
                         name="tools/call get_weather")).tool == "get_weather"


def test_which_spans_can_root_a_run() -> None:
    def root(attrs: dict[str, AttrValue]) -> bool:
        return classify(span(attrs)).is_agent_span

    assert root({"gen_ai.operation.name": "invoke_agent"})
    assert root({"gen_ai.operation.name": "invoke_workflow"})
    assert root({"openinference.span.kind": "AGENT"})
    assert root({"traceloop.span.kind": "workflow"})
    assert root({"langfuse.observation.type": "agent"})
    assert not root({"gen_ai.operation.name": "create_agent"})
    assert classify(span({"gen_ai.operation.name": "create_agent"})).action is Action.AGENT
    assert not root({"openinference.span.kind": "CHAIN"})
    assert not root({"traceloop.span.kind": "task"})


def test_model_provider_and_token_precedence() -> None:
    n = classify(span({
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "req",
        "gen_ai.response.model": "resp-2024", "llm.model_name": "oi",
        "gen_ai.system": "az.ai.openai",
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.prompt_tokens": 99,
        "gen_ai.usage.completion_tokens": 7, "llm.token_count.completion": 98}))
    assert n.model == "resp-2024"
    assert n.provider == "azure.ai.openai"  # the deprecated value is renamed
    assert (n.input_tokens, n.output_tokens) == (10, 7)
    p = classify(span({"gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
                       "gen_ai.system": "openai"}))
    assert p.provider == "anthropic"
    oi = classify(span({"openinference.span.kind": "LLM", "llm.model_name": "m",
                        "llm.provider": "google", "llm.token_count.prompt": "12"}))
    assert (oi.provider, oi.input_tokens) == ("google", 12)


def test_cost_keys() -> None:
    llm: dict[str, AttrValue] = {"gen_ai.operation.name": "chat"}
    assert classify(span({**llm, "llm.cost.total": 0.25})).cost_usd == 0.25
    assert classify(span({**llm, "gen_ai.usage.cost": "0.5"})).cost_usd == 0.5
    lf = classify(span({"langfuse.observation.type": "generation",
                        "langfuse.observation.cost_details": json.dumps(
                            {"input": 0.1, "output": 0.2})}))
    assert lf.cost_usd == pytest.approx(0.3)
    assert classify(span(llm)).cost_usd is None
    # A span without any GenAI marker is not read for usage at all.
    assert classify(span({"llm.cost.total": 0.25})).cost_usd is None


def test_error_sources() -> None:
    assert classify(span(status=STATUS_ERROR)).error
    assert classify(span({"error.type": "TimeoutError"})).error
    assert classify(span(events=[SpanEvent("exception", 1, {"exception.type": "E"})])).error
    assert classify(span({"langfuse.observation.level": "ERROR"})).error
    assert not classify(span(events=[SpanEvent("gen_ai.choice", 1)])).error


def test_evaluations_from_attributes_and_events() -> None:
    n = classify(span({"gen_ai.evaluation.score.label": "correct",
                       "gen_ai.evaluation.score.value": 0.9,
                       "assaywatch.evaluation.passed": "false"},
                      events=[SpanEvent("gen_ai.evaluation.result", 1, {
                          "gen_ai.evaluation.name": "relevance",
                          "gen_ai.evaluation.score.value": 0.2})]))
    assert len(n.evaluations) == 2
    first, second = n.evaluations
    assert (first.label, first.score, first.passed) == ("correct", 0.9, False)
    assert (second.name, second.score, second.label) == ("relevance", 0.2, None)
    assert classify(span({})).evaluations == ()


def test_scenario_version_and_agent_name_precedence() -> None:
    n = classify(span({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a",
                       "agent.name": "b", "gen_ai.workflow.name": "wf",
                       "assaywatch.scenario": "sc", "gen_ai.agent.version": "2"}))
    assert (n.agent_name, n.scenario, n.agent_version) == ("a", "sc", "2")
    w = classify(span({"traceloop.span.kind": "agent", "traceloop.entity.name": "tl",
                       "traceloop.workflow.name": "flow", "traceloop.entity.version": "7"}))
    assert (w.agent_name, w.scenario, w.agent_version) == ("tl", "flow", "7")
    g = classify(span({"gen_ai.workflow.name": "wf", "traceloop.workflow.name": "flow"}))
    assert g.scenario == "wf"


def test_tool_definitions_keep_names_only() -> None:
    defs = json.dumps([{"type": "function", "name": "search", "description": "SECRET-1"},
                       {"type": "function", "function": {"name": "book", "parameters": {}}}])
    n = classify(span({"gen_ai.tool.definitions": defs}))
    assert n.tool_definitions == ("search", "book")
    assert "SECRET" not in repr(n)


def test_tool_inventory_of_each_dialect_names_the_tools_offered() -> None:
    """gen_ai.tool.definitions (GenAI, Traceloop's openai instrumentation) and
    OpenInference's flattened llm.tools.<i>.tool.json_schema: names only, in order."""
    schema = {"type": "function", "function": {"name": "get_weather",
                                               "description": "SECRET-2", "parameters": {}}}
    genai = classify(span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                           "gen_ai.tool.definitions": json.dumps([
                               {"type": "function", "name": "get_weather"},
                               {"type": "function", "name": "get_time"}])}))
    assert genai.tool_definitions == ("get_weather", "get_time")
    traceloop = classify(span({"llm.request.type": "chat", "gen_ai.request.model": "m",
                               "gen_ai.tool.definitions": json.dumps([schema])}))
    assert traceloop.tool_definitions == ("get_weather",)
    structured = classify(span({"gen_ai.operation.name": "chat",
                                "gen_ai.tool.definitions": ({"name": "a"}, {"name": "b"})}))
    assert structured.tool_definitions == ("a", "b")
    oi = classify(span({"openinference.span.kind": "LLM", "llm.model_name": "m",
                        "llm.tools.0.tool.json_schema": json.dumps(schema),
                        "llm.tools.1.tool.json_schema": json.dumps(
                            {"type": "function", "function": {"name": "get_time"}}),
                        "llm.tools.3.tool.json_schema": json.dumps(  # not contiguous
                            {"type": "function", "function": {"name": "skipped"}})}))
    assert oi.tool_definitions == ("get_weather", "get_time")
    assert "SECRET" not in repr((genai, traceloop, oi))
    # Only an LLM span's flattened tools are its inventory; malformed JSON names nothing.
    assert classify(span({"openinference.span.kind": "CHAIN",
                          "llm.tools.0.tool.json_schema": json.dumps(schema)})
                    ).tool_definitions == ()
    assert classify(span({"openinference.span.kind": "LLM",
                          "llm.tools.0.tool.json_schema": "{not json"})).tool_definitions == ()


def test_openinference_agent_is_named_after_its_span_and_langgraph_nodes_are_flagged() -> None:
    named = classify(span({"openinference.span.kind": "AGENT"}, name="weather_agent"))
    assert (named.agent_name, named.graph_node) == ("weather_agent", False)
    explicit = classify(span({"openinference.span.kind": "AGENT", "agent.name": "a"},
                             name="weather_agent"))
    assert explicit.agent_name == "a"
    node = classify(span({"openinference.span.kind": "AGENT"}, name="agent"))
    assert node.is_agent_span and node.graph_node  # runs.py decides from its parent
    # Only OpenInference marks runnables AGENT by their name.
    langfuse = classify(span({"langfuse.observation.type": "agent"}, name="agent"))
    assert (langfuse.agent_name, langfuse.graph_node) == ("agent", False)
    # A chain can root a run (the outermost one), so its agent name and marks are read.
    chain = classify(span({"openinference.span.kind": "CHAIN", "agent.name": "c",
                           "assaywatch.relation": "r"}, name="LangGraph"))
    assert chain.agent_name == "c" and chain.marks == {"assaywatch.relation": "r"}


def test_marks_are_kept_on_possible_roots_only_and_bounded() -> None:
    attrs: dict[str, AttrValue] = {"gen_ai.operation.name": "invoke_agent",
                                   "assaywatch.relation": "paraphrase:p1",
                                   "assaywatch.scenario": "sc"}
    attrs.update({f"assaywatch.k{i}": "v" * 1000 for i in range(40)})
    n = classify(span(attrs))
    assert n.marks is not None and n.marks["assaywatch.relation"] == "paraphrase:p1"
    assert "assaywatch.scenario" not in n.marks
    assert len(n.marks) == 16 and all(len(v) <= 256 for v in n.marks.values())
    tool = classify(span({"gen_ai.tool.name": "x", "assaywatch.relation": "r"}))
    assert tool.marks is None


def test_text_length_counts_text_parts_not_structure() -> None:
    msgs = [{"role": "assistant", "parts": [
        {"type": "text", "content": "abc"},
        {"type": "tool_call", "id": "c", "name": "search", "arguments": {"q": "zzzz"}},
        {"type": "text", "content": "de"}]}]
    assert text_length(msgs) == 5
    assert text_length({"role": "user", "content": "hello"}) == 5
    assert text_length({"answer": "xy", "n": 123}) == 5
    deep: object = "x"
    for _ in range(5_000):  # deeper than the recursion limit: must stay iterative
        deep = [deep]
    assert text_length(deep, budget=100_000) == 1


_KEYS = st.sampled_from([
    "gen_ai.operation.name", "openinference.span.kind", "gen_ai.usage.input_tokens",
    "gen_ai.output.messages", "output.value", "output.mime_type", "llm.cost.total",
    "langfuse.observation.usage_details", "langfuse.observation.cost_details",
    "gen_ai.tool.definitions", "gen_ai.evaluation.score.value", "gen_ai.tool.name",
    "assaywatch.evaluation.passed", "llm.output_messages.0.message.content",
    "traceloop.span.kind", "gen_ai.transfer.target.name", "langfuse.observation.type",
    "llm.tools.0.tool.json_schema", "llm.tools.1.tool.json_schema"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.sampled_from(["chat", "TOOL", "LLM", "agent", "[1,", '{"total": "x"}', '["a", {}]']),
    lambda inner: st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_classify_never_raises_on_odd_values(attrs: dict[str, AttrValue]) -> None:
    n = classify(span(attrs))
    assert n.input_tokens >= 0 and n.output_length >= 0


def test_recorded_output_length_outranks_content_and_tokens() -> None:
    n = classify(span({"gen_ai.operation.name": "chat", "assaywatch.output.length": 42,
                       "gen_ai.output.messages": json.dumps([{"role": "assistant",
                                                              "content": "abc"}]),
                       "gen_ai.usage.output_tokens": 7}))
    assert n.output_length == 42
    agent = classify(span({"gen_ai.operation.name": "invoke_agent",
                           "assaywatch.output.length": 9}, parent=""))
    assert agent.output_length == 9 and not agent.marks


def test_same_evaluation_as_attributes_and_event_counts_once() -> None:
    e: dict[str, AttrValue] = {"gen_ai.evaluation.name": "assaywatch",
                               "assaywatch.evaluation.passed": True}
    n = classify(span(dict(e), events=[SpanEvent("gen_ai.evaluation.result", 1, dict(e))]))
    assert len(n.evaluations) == 1 and n.evaluations[0].passed is True
