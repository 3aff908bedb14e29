"""The assembler: runs from spans in every dialect, arrival order, closing rules, limits."""

from __future__ import annotations

import gc
import json
import random
import sys

import pytest

from assaywatch.analyzers.model import Action, Outcome, Run
from assaywatch.monitor.pipeline.assemble import Assembler, assemble_all
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import AttrValue, IngestCounters, SpanRecord
from tests.monitor.decoders import NATIVE_INSTALLED
from tests.monitor.spanfactory import (
    DIALECTS,
    MS,
    Agent,
    EvalSpec,
    Handoff,
    Llm,
    Retrieve,
    SpanFactory,
    Tool,
    nine_span_agent,
    tool_agent,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def rich_script() -> Agent:
    """Retrieval, LLM calls, tools, a nested agent, a handoff; the final LLM output is the
    agent's output (so dialects without agent content agree on the run's output length)."""
    return Agent(name="concierge", version="2.1", scenario="travel", steps=[
        Retrieve("policies"),
        Llm(model="gpt-4o", input_tokens=200, output_tokens=40),
        Tool("search_flights"),
        Agent(name="hotel-agent", steps=[Llm(model="claude-3", input_tokens=80,
                                             output_tokens=9), Tool("book_hotel")]),
        Tool("send_email"),
        Llm(model="gpt-4o", input_tokens=300, output_tokens=55, output="All done, enjoy."),
        Handoff("billing-agent"),
    ], output="All done, enjoy.")


def signature(run: Run) -> tuple[object, ...]:
    return (run.key, run.tools_used, run.decision_path, run.total_tokens, run.models,
            [s.depth for s in run.steps], run.output_length, run.outcome, len(run.steps))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_same_logical_run_in_every_dialect_assembles_the_same(dialect: str) -> None:
    reference = assemble_all(SpanFactory(seed=5).agent_run(rich_script(), "genai"))
    runs = assemble_all(SpanFactory(seed=5).agent_run(rich_script(), dialect))
    assert len(runs) == len(reference) == 1
    run = runs[0]
    assert signature(run) == signature(reference[0])
    # And the reference itself is what the script says (not merely self-consistent).
    assert run.tools_used == ["search_flights", "book_hotel", "send_email"]
    assert [s.action for s in run.steps] == [
        Action.RETRIEVE, Action.LLM, Action.TOOL, Action.AGENT, Action.LLM, Action.TOOL,
        Action.TOOL, Action.LLM, Action.HANDOFF]
    assert run.steps[-1].tool == "billing-agent"
    assert run.total_tokens == 200 + 40 + 80 + 9 + 300 + 55
    assert (run.key.agent, run.key.version, run.key.scenario) == ("concierge", "2.1", "travel")
    assert run.models == ("claude-3", "gpt-4o")
    assert run.output_length == len("All done, enjoy.")
    assert [s.depth for s in run.steps] == [1, 1, 1, 1, 2, 2, 1, 1, 1]


@pytest.mark.parametrize("dialect", ["genai", "openinference"])
def test_two_agent_invocations_in_one_http_trace_are_two_runs(dialect: str) -> None:
    f = SpanFactory(seed=2)
    spans = f.http_request([tool_agent(("a",), name="router"),
                            tool_agent(("b", "c"), name="writer")], dialect)
    runs = assemble_all(spans)
    assert [r.key.agent for r in runs] == ["router", "writer"]
    assert [r.tools_used for r in runs] == [["a"], ["b", "c"]]
    assert len({r.trace_id for r in runs}) == 1 and runs[0].run_id != runs[1].run_id
    http_root = next(s for s in spans if not s.parent_span_id)
    for r in runs:  # neither the HTTP root nor the database span is a step
        assert all(s.span_id != http_root.span_id for s in r.steps)
        assert all(s.action is not Action.OTHER for s in r.steps)


def test_nested_agent_is_a_step_of_the_outer_run() -> None:
    inner = Agent(name="inner", steps=[Llm(), Tool("t_inner")])
    runs = assemble_all(SpanFactory(seed=1).agent_run(
        Agent(name="outer", steps=[Llm(), inner, Tool("t_outer")]), "traceloop"))
    assert len(runs) == 1 and runs[0].key.agent == "outer"
    agent_steps = [s for s in runs[0].steps if s.action is Action.AGENT]
    assert len(agent_steps) == 1 and agent_steps[0].depth == 1
    assert runs[0].tools_used == ["t_inner", "t_outer"]
    assert [s.depth for s in runs[0].steps if s.tool == "t_inner"] == [2]


def test_trace_without_agent_spans_is_one_run_rooted_at_its_root() -> None:
    spans = SpanFactory(seed=4, service_name="summarizer").bare_trace(
        [Llm(input_tokens=10, output_tokens=5), Tool("fetch"), Llm(output_tokens=7)],
        "genai")
    runs = assemble_all(spans)
    assert len(runs) == 1
    run = runs[0]
    root = next(s for s in spans if not s.parent_span_id)
    assert run.root_span_id == root.span_id
    assert run.key.agent == "summarizer"  # no agent name: the resource's service.name
    assert [s.action for s in run.steps] == [Action.LLM, Action.TOOL, Action.LLM]


def test_plain_http_trace_gives_no_run_and_is_counted() -> None:
    c = IngestCounters()
    spans = SpanFactory(seed=4).http_request([], "genai")
    assert assemble_all(spans, counters=c) == []
    assert c.dropped["no_genai_spans"] == len(spans)


def test_order_duplicates_and_batches_do_not_change_the_run() -> None:
    f = SpanFactory(seed=8)
    traces = [f.agent_run(rich_script(), d) for d in DIALECTS]
    traces.append(f.http_request([nine_span_agent(), tool_agent()], "langfuse"))
    spans = [s for t in traces for s in t]
    expected = assemble_all(spans)
    assert len(expected) == len(DIALECTS) + 2
    rng = random.Random(42)
    for _ in range(5):
        shuffled = spans + rng.sample(spans, len(spans) // 2)  # duplicates
        rng.shuffle(shuffled)  # children before parents, traces interleaved
        c = IngestCounters()
        asm = Assembler(clock=FakeClock(), counters=c)
        i = 0
        while i < len(shuffled):  # uneven batches, as from several receivers
            n = rng.randint(1, 7)
            asm.add(shuffled[i:i + n])
            i += n
        got = sorted(asm.flush(), key=lambda r: (r.start_ns, r.run_id))
        assert got == expected
        assert c.dropped["duplicate_span"] == len(spans) // 2


def test_trace_closes_after_grace_and_late_spans_are_counted() -> None:
    clock, c = FakeClock(), IngestCounters()
    asm = Assembler(clock=clock, grace_s=5.0, counters=c)
    spans = SpanFactory(seed=1).agent_run(tool_agent(), "genai")
    asm.add(spans[:-1])
    clock.t += 100  # children only: the agent span is missing, the trace must wait
    assert asm.poll() == []
    asm.add(spans[-1:])
    clock.t += 4.9
    assert asm.poll() == [] and asm.pending_traces == 1
    clock.t += 0.2
    runs = asm.poll()
    assert len(runs) == 1 and asm.pending_traces == 0 and asm.closed_by["grace"] == 1
    late = SpanRecord(trace_id=spans[0].trace_id, span_id="f" * 16,
                      parent_span_id=spans[-1].span_id, name="late", start_ns=0, end_ns=1)
    asm.add([late, late])
    assert c.dropped["late_span"] == 2 and asm.pending_traces == 0


def test_trace_that_never_completes_closes_at_max_age() -> None:
    clock, c = FakeClock(), IngestCounters()
    asm = Assembler(clock=clock, grace_s=1.0, max_age_s=60.0, counters=c)
    spans = SpanFactory(seed=1).agent_run(tool_agent(), "genai")
    tool = next(s for s in spans if s.name.startswith("execute_tool"))
    asm.add([tool])  # its agent never arrives
    clock.t += 59.0
    assert asm.poll() == []
    clock.t += 1.0
    assert asm.poll() == [] and asm.pending_traces == 0  # closed: nothing to root a run
    assert asm.closed_by["max_age"] == 1 and c.dropped["no_root_span"] == 1


def test_pending_traces_are_bounded_and_eviction_is_counted() -> None:
    clock, c = FakeClock(), IngestCounters()
    asm = Assembler(clock=clock, max_pending_traces=3, counters=c)
    f = SpanFactory(seed=9)
    traces = [f.agent_run(tool_agent(name=f"agent{i}"), "genai") for i in range(5)]
    for t in traces:
        asm.add(t)
    assert asm.pending_traces == 3 and c.dropped["evicted_trace"] == 2
    evicted = asm.poll()  # evicted traces with a root still become runs
    assert [r.key.agent for r in evicted] == ["agent0", "agent1"]
    assert sorted(r.key.agent for r in asm.flush()) == ["agent2", "agent3", "agent4"]


def test_spans_per_trace_are_bounded() -> None:
    c = IngestCounters()
    asm = Assembler(clock=FakeClock(), max_spans_per_trace=4, counters=c)
    spans = SpanFactory(seed=1).agent_run(nine_span_agent(), "genai")
    asm.add(spans[::-1])  # root first, so the kept spans still make a run
    assert c.dropped["trace_too_large"] == 5
    (run,) = asm.flush()
    assert len(run.steps) == 3


def _chain_of(kind_attrs: dict[str, str], n: int = 1000) -> list[SpanRecord]:
    """An agent span with ``n - 1`` spans nested one in the other below it."""
    tid, spans = "ab" * 16, []
    parent = ""
    for i in range(n):
        sid = f"{i + 1:016x}"
        attrs = ({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "deep"}
                 if i == 0 else dict(kind_attrs))
        spans.append(SpanRecord(tid, sid, parent, f"s{i}", i, 10_000 - i, attributes=attrs))
        parent = sid
    return spans


def _without_recursion(spans: list[SpanRecord]) -> list[Run]:
    depth_now = len(_frames())
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth_now + 120)  # a recursive walk of 1,000 levels would fail
    try:
        return assemble_all(reversed(spans))
    finally:
        sys.setrecursionlimit(old)


def test_a_thousand_nested_spans_assemble_without_recursion() -> None:
    # GUARDRAIL spans are 'other' steps: each one is a step and a nesting level.
    runs = _without_recursion(_chain_of({"openinference.span.kind": "GUARDRAIL"}))
    assert len(runs) == 1 and len(runs[0].steps) == 999
    assert max(s.depth for s in runs[0].steps) == 999


def test_a_thousand_nested_chains_are_plumbing_without_recursion() -> None:
    # CHAIN spans (LangChain runnables) are neither steps nor nesting levels: the LLM call
    # at the bottom of 998 chains is the run's only step, at depth 1.
    spans = _chain_of({"openinference.span.kind": "CHAIN"})
    spans[-1].attributes.update({"openinference.span.kind": "LLM", "llm.model_name": "m",
                                 "llm.token_count.prompt": 3})
    (run,) = _without_recursion(spans)
    assert [(s.action, s.depth, s.input_tokens) for s in run.steps] == [(Action.LLM, 1, 3)]


def _frames() -> list[object]:
    f, out = sys._getframe(), []
    while f is not None:
        out.append(f)
        f = f.f_back  # type: ignore[assignment]
    return out


def test_clock_skew_is_tolerated_and_steps_order_by_start_then_span_id() -> None:
    tid = "cd" * 16
    root = SpanRecord(tid, "0" * 15 + "1", "", "invoke_agent a", 1_000 * MS, 2_000 * MS,
                      attributes={"gen_ai.operation.name": "invoke_agent",
                                  "gen_ai.agent.name": "a"})
    # Another host's clock: starts before the parent, ends after it, one ends before start.
    early = SpanRecord(tid, "0" * 15 + "9", root.span_id, "execute_tool x", 500 * MS,
                       3_000 * MS, attributes={"gen_ai.tool.name": "x"})
    negative = SpanRecord(tid, "0" * 15 + "5", root.span_id, "chat m", 1_500 * MS,
                          1_400 * MS, attributes={"gen_ai.operation.name": "chat"})
    tie_b = SpanRecord(tid, "0" * 15 + "b", root.span_id, "execute_tool b", 1_200 * MS,
                       1_300 * MS, attributes={"gen_ai.tool.name": "b"})
    tie_a = SpanRecord(tid, "0" * 15 + "a", root.span_id, "execute_tool a", 1_200 * MS,
                       1_300 * MS, attributes={"gen_ai.tool.name": "a"})
    for order in ([root, early, negative, tie_b, tie_a], [tie_a, negative, tie_b, early, root]):
        (run,) = assemble_all(order)
        assert run.tools_used == ["x", "a", "b"]
        assert [s.span_id[-1] for s in run.steps] == ["9", "a", "b", "5"]
        assert run.steps[-1].latency_s == 0.0
        assert run.steps[0].latency_s == pytest.approx(2.5)


def test_orphan_span_attaches_to_the_run_that_contains_it() -> None:
    spans = SpanFactory(seed=3).agent_run(tool_agent(("a",)), "genai")
    root = spans[-1]
    orphan = SpanRecord(root.trace_id, "e" * 16, "9" * 16, "execute_tool lost",
                        root.start_ns + MS, root.start_ns + 2 * MS,
                        attributes={"gen_ai.tool.name": "lost"})
    (run,) = assemble_all([*spans, orphan])
    assert "lost" in run.tools_used
    assert next(s for s in run.steps if s.tool == "lost").depth == 1


def test_parent_cycle_does_not_hang_and_is_counted() -> None:
    c = IngestCounters()
    tid = "ee" * 16
    spans = [SpanRecord(tid, "1" * 16, "2" * 16, "a", 0, 1, attributes={"gen_ai.tool.name": "a"}),
             SpanRecord(tid, "2" * 16, "1" * 16, "b", 0, 1, attributes={"gen_ai.tool.name": "b"})]
    assert assemble_all(spans, counters=c) == []
    assert c.dropped["span_cycle"] == 2


def test_scenario_comes_from_an_enclosing_workflow_span() -> None:
    tid = "aa" * 16
    server = SpanRecord(tid, "1" * 16, "", "POST /run", 0, 100, kind=2,
                        attributes={"gen_ai.workflow.name": "checkout"})
    agent = SpanRecord(tid, "2" * 16, server.span_id, "invoke_agent a", 1, 90,
                       attributes={"gen_ai.operation.name": "invoke_agent",
                                   "gen_ai.agent.name": "a"})
    llm = SpanRecord(tid, "3" * 16, agent.span_id, "chat m", 2, 50,
                     attributes={"gen_ai.operation.name": "chat"})
    (run,) = assemble_all([server, agent, llm])
    assert run.key.scenario == "checkout" and run.root_span_id == agent.span_id


def test_on_run_callback_and_outcome_wiring() -> None:
    seen: list[Run] = []
    asm = Assembler(clock=FakeClock(), on_run=seen.append,
                    rules=ContractRules(max_steps=2))
    f = SpanFactory(seed=6)
    asm.add(f.agent_run(tool_agent(("a",)), "genai"))  # 3 steps > 2
    ok = tool_agent(("a",))
    ok.evaluation = EvalSpec(score=0.75, as_event=True)
    asm.add(f.agent_run(ok, "openinference"))
    runs = asm.flush()
    assert seen == runs and len(runs) == 2
    by_contract, by_eval = sorted(runs, key=lambda r: r.start_ns)
    assert by_contract.outcome is Outcome.FAIL
    assert "max_steps" in by_contract.attributes["assaywatch.outcome.reason"]
    assert by_eval.outcome is Outcome.PASS and by_eval.evaluation_score == 0.75


def test_tool_inventory_and_marks_reach_run_attributes() -> None:
    a = tool_agent(("a",))
    a.tool_definitions = ("b_tool", "a_tool")
    spans = SpanFactory(seed=2).agent_run(a, "genai")
    spans[-1].attributes["assaywatch.relation"] = "paraphrase:42"
    (run,) = assemble_all(spans)
    assert run.attributes["assaywatch.tool_inventory"] == "a_tool,b_tool"
    assert run.attributes["assaywatch.relation"] == "paraphrase:42"


def test_container_usage_is_not_counted_twice() -> None:
    spans = SpanFactory(seed=2).agent_run(
        Agent(name="o", steps=[Agent(name="inner", steps=[Llm(input_tokens=10,
                                                              output_tokens=5)])]), "genai")
    inner = next(s for s in spans if s.name == "invoke_agent inner")
    inner.attributes.update({"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5})
    (run,) = assemble_all(spans)
    assert run.total_tokens == 15


SECRET = "SECRET-7f3a-do-not-keep"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_no_content_is_retained_in_runs(dialect: str) -> None:
    a = Agent(name="secretive", input=SECRET, output=SECRET + " answer", steps=[
        Llm(output=SECRET), Tool("lookup", arguments=SECRET, result=SECRET),
        Llm(output=SECRET + "!")])
    spans = SpanFactory(seed=1).agent_run(a, dialect)
    root = spans[-1]
    root.attributes.update({"gen_ai.input.messages": SECRET, "input.value": SECRET,
                            "gen_ai.system_instructions": SECRET})
    assert any(SECRET in repr(s) for s in spans)  # the test would catch a leak
    runs = assemble_all(spans)
    assert len(runs) == 1 and runs[0].output_length > 0
    assert SECRET not in repr(runs)


def test_generic_spans_are_not_steps_unless_asked() -> None:
    spans = SpanFactory(seed=2).agent_run(tool_agent(("fetch",)), "genai")
    tool = next(s for s in spans if s.name == "execute_tool fetch")
    http = SpanRecord(tool.trace_id, "c" * 16, tool.span_id, "GET", tool.start_ns + 1,
                      tool.end_ns - 1, kind=3, attributes={"http.request.method": "GET"},
                      resource=tool.resource)
    (run,) = assemble_all([*spans, http])
    assert len(run.steps) == 3 and all(s.span_id != http.span_id for s in run.steps)
    asm = Assembler(clock=FakeClock(), include_generic_steps=True)
    asm.add([*spans, http])
    (with_generic,) = asm.flush()
    assert [s.depth for s in with_generic.steps if s.span_id == http.span_id] == [2]


def test_genai_spans_outside_every_agent_are_counted() -> None:
    c = IngestCounters()
    f = SpanFactory(seed=3)
    spans = f.http_request([tool_agent(("a",))], "genai", extra_generic=False)
    root = next(s for s in spans if not s.parent_span_id)
    router = SpanRecord(root.trace_id, "d" * 16, root.span_id, "chat router",
                        root.start_ns, root.start_ns + 1,
                        attributes={"gen_ai.operation.name": "chat"})
    runs = assemble_all([*spans, router], counters=c)
    assert len(runs) == 1 and all(s.span_id != router.span_id for s in runs[0].steps)
    assert c.dropped["outside_run"] == 1


def test_server_span_with_a_remote_parent_roots_a_run_and_closes_on_grace() -> None:
    clock = FakeClock()
    asm = Assembler(clock=clock, grace_s=1.0)
    spans = SpanFactory(seed=4).bare_trace([Llm(), Tool("x")], "genai")
    root = next(s for s in spans if not s.parent_span_id)
    root.parent_span_id = "7" * 16  # the caller lives in another service
    asm.add(spans)
    clock.t += 1.0
    (run,) = asm.poll()
    assert run.root_span_id == root.span_id and run.tools_used == ["x"]


# --- run assembly per instrumentation (issue 13) ---------------------------------------

OI_LLM = {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini",
          "llm.token_count.prompt": 100, "llm.token_count.completion": 20}
OI_CHAIN = {"openinference.span.kind": "CHAIN"}
OI_AGENT = {"openinference.span.kind": "AGENT"}


def tree(*specs: tuple[str, str, str, dict[str, AttrValue]], error: tuple[str, ...] = (),
         service: str = "svc", tid: str = "5a" * 16) -> list[SpanRecord]:
    """Spans from (id, parent id, name, attributes), in pre-order: each span starts after
    the previous one and ends after its descendants (ids are padded to 16 hex digits)."""
    n = len(specs)
    ids = {sid: f"{i + 1:016x}" for i, (sid, _, _, _) in enumerate(specs)}
    return [SpanRecord(tid, ids[sid], ids.get(parent, ""), name, (i + 1) * MS,
                       (2 * n - i) * MS, attributes=dict(attrs),
                       status_code=2 if sid in error else 0,
                       resource={"service.name": service})
            for i, (sid, parent, name, attrs) in enumerate(specs)]


def summary(run: Run) -> tuple[str, list[tuple[str, str | None, int]], int]:
    return (run.key.agent, [(s.action.value, s.tool, s.depth) for s in run.steps],
            run.total_tokens)


@pytest.mark.parametrize("attrs", [
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
     "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20},
    OI_LLM], ids=["genai", "openinference"])
def test_a_trace_rooted_at_the_model_call_is_a_run_with_that_step(
        attrs: dict[str, AttrValue]) -> None:
    (run,) = assemble_all(tree(("llm", "", "chat", attrs), service="bare"))
    assert summary(run) == ("bare", [("llm", None, 1)], 120)
    assert run.models == ("gpt-4o-mini",) and run.outcome is Outcome.PASS
    (failed,) = assemble_all(tree(("llm", "", "chat", attrs), error=("llm",)))
    assert failed.steps[0].error and failed.error and failed.outcome is Outcome.FAIL


def test_a_trace_rooted_at_a_tool_call_is_a_run_and_its_children_nest_below_it() -> None:
    spans = tree(("t", "", "execute_tool fetch", {"gen_ai.operation.name": "execute_tool",
                                                  "gen_ai.tool.name": "fetch"}),
                 ("l", "t", "chat", {"gen_ai.operation.name": "chat"}))
    (run,) = assemble_all(spans)
    assert summary(run)[1] == [("tool", "fetch", 1), ("llm", None, 2)]


def langgraph(root_name: str, root_attrs: dict[str, AttrValue]) -> list[SpanRecord]:
    """A LangGraph ReAct graph as openinference-instrumentation-langchain records it."""
    return tree(
        ("g", "", root_name, root_attrs),
        ("a1", "g", "agent", OI_AGENT),
        ("m1", "a1", "ChatOpenAI", OI_LLM),
        ("c1", "a1", "should_continue", OI_CHAIN),
        ("tn", "g", "tools", OI_CHAIN),
        ("t", "tn", "get_weather", {"openinference.span.kind": "TOOL",
                                    "tool.name": "get_weather"}),
        ("a2", "g", "agent", OI_AGENT),
        ("m2", "a2", "ChatOpenAI", OI_LLM),
        ("c2", "a2", "should_continue", OI_CHAIN),
        service="graph-svc")


def test_langgraph_default_graph_is_one_run_without_plumbing_steps() -> None:
    c = IngestCounters()
    (run,) = assemble_all(langgraph("LangGraph", OI_CHAIN), counters=c)
    assert summary(run) == ("graph-svc", [("llm", None, 1), ("tool", "get_weather", 1),
                                          ("llm", None, 1)], 240)
    assert c.dropped == {}


def test_langgraph_named_graph_is_the_agent_and_its_agent_nodes_are_not_agents() -> None:
    (run,) = assemble_all(langgraph("support_agent", OI_AGENT))
    assert summary(run) == ("support_agent", [("llm", None, 1), ("tool", "get_weather", 1),
                                              ("llm", None, 1)], 240)


def test_langgraph_supervisor_keeps_its_named_sub_agents_as_agent_steps() -> None:
    spans = tree(
        ("g", "", "supervisor", OI_CHAIN),
        ("s", "g", "agent", OI_AGENT), ("sm", "s", "ChatOpenAI", OI_LLM),
        ("r", "g", "research_agent", OI_AGENT),
        ("ra", "r", "agent", OI_AGENT), ("rm", "ra", "ChatOpenAI", OI_LLM),
        ("w", "g", "writer_agent", OI_AGENT),
        ("wa", "w", "agent", OI_AGENT), ("wm", "wa", "ChatOpenAI", OI_LLM),
        ("wt", "wa", "tools", OI_CHAIN),
        ("t", "wt", "save", {"openinference.span.kind": "TOOL", "tool.name": "save"}),
        service="team")
    (run,) = assemble_all(spans)
    assert summary(run) == ("team", [("llm", None, 1), ("agent", None, 1), ("llm", None, 2),
                                     ("agent", None, 1), ("llm", None, 2),
                                     ("tool", "save", 2)], 360)


def test_an_openinference_agent_named_agent_outside_a_graph_is_an_agent() -> None:
    (run,) = assemble_all(tree(("a", "", "agent", OI_AGENT), ("m", "a", "llm", OI_LLM)))
    assert summary(run) == ("agent", [("llm", None, 1)], 120)
    http = tree(("h", "", "POST /chat", {"http.request.method": "POST"}),
                ("a", "h", "agent", OI_AGENT), ("m", "a", "llm", OI_LLM),
                ("b", "h", "agent", OI_AGENT), ("n", "b", "llm", OI_LLM))
    assert [summary(r)[0] for r in assemble_all(http)] == ["agent", "agent"]


def test_outermost_chains_are_runs_and_chains_below_an_agent_are_plumbing() -> None:
    http = tree(("h", "", "POST /chat", {"http.request.method": "POST"}),
                ("c1", "h", "RunnableSequence", OI_CHAIN), ("m1", "c1", "llm", OI_LLM),
                ("c2", "h", "RunnableSequence", OI_CHAIN),
                ("p", "c2", "Prompt", OI_CHAIN), ("m2", "p", "llm", OI_LLM))
    assert [summary(r) for r in assemble_all(http)] == [
        ("svc", [("llm", None, 1)], 120), ("svc", [("llm", None, 1)], 120)]
    traceloop = tree(("a", "", "planner.agent", {"traceloop.span.kind": "agent",
                                                 "traceloop.entity.name": "planner"}),
                     ("k", "a", "plan.task", {"traceloop.span.kind": "task"}),
                     ("m", "k", "openai.chat", {"llm.request.type": "chat"}))
    assert summary(assemble_all(traceloop)[0]) == ("planner", [("llm", None, 1)], 0)


def test_plumbing_errors_reach_the_enclosing_step_or_the_run() -> None:
    (run,) = assemble_all(langgraph("LangGraph", OI_CHAIN))
    assert not run.any_error and run.outcome is Outcome.PASS
    spans = langgraph("LangGraph", OI_CHAIN)
    failing = next(s for s in spans if s.name == "tools")
    failing.status_code = 2
    (run,) = assemble_all(spans)
    assert run.error and run.outcome is Outcome.FAIL and len(run.steps) == 3


GENAI_WORKFLOW = {"gen_ai.operation.name": "invoke_workflow",
                  "gen_ai.workflow.name": "weather_workflow"}


def genai_agent(name: str) -> dict[str, AttrValue]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}


GENAI_CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
              "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1}


def test_workflow_root_takes_its_entry_agents_name_and_that_agent_is_no_step() -> None:
    spans = tree(("w", "", "invoke_workflow weather_workflow", GENAI_WORKFLOW),
                 ("a", "w", "invoke_agent weather_agent", genai_agent("weather_agent")),
                 ("m", "a", "chat m", GENAI_CHAT),
                 ("t", "a", "execute_tool get_weather", {"gen_ai.tool.name": "get_weather"}))
    (run,) = assemble_all(spans)
    assert summary(run) == ("weather_agent", [("llm", None, 1), ("tool", "get_weather", 1)],
                            11)
    assert run.key.scenario == "weather_workflow" and run.root_span_id == spans[0].span_id
    traceloop = tree(("w", "", "wf.workflow", {"traceloop.span.kind": "workflow",
                                               "traceloop.entity.name": "wf",
                                               "traceloop.workflow.name": "wf"}),
                     ("a", "w", "weather_agent.agent", {
                         "traceloop.span.kind": "agent",
                         "traceloop.entity.name": "weather_agent",
                         "traceloop.entity.version": "3"}),
                     ("m", "a", "openai.chat", {"llm.request.type": "chat"}))
    (run,) = assemble_all(traceloop)
    assert (run.key.agent, run.key.version, run.key.scenario) == ("weather_agent", "3", "wf")
    assert [s.action for s in run.steps] == [Action.LLM]


def test_workflow_with_a_handoff_keeps_the_entry_agent_and_counts_the_other() -> None:
    """openai-agents: triage hands off to billing; both agent spans sit below the workflow.
    The stream stays the entry agent's whether or not the handoff happens."""
    spans = tree(("w", "", "invoke_workflow Agent workflow", GENAI_WORKFLOW),
                 ("a", "w", "invoke_agent triage", genai_agent("triage")),
                 ("m", "a", "chat m", GENAI_CHAT),
                 ("h", "a", "handoff", {"gen_ai.operation.name": "handoff",
                                        "gen_ai.transfer.target.name": "billing"}),
                 ("b", "w", "invoke_agent billing", genai_agent("billing")),
                 ("n", "b", "chat m", GENAI_CHAT))
    (run,) = assemble_all(spans)
    assert summary(run) == ("triage", [("llm", None, 1), ("handoff", "billing", 1),
                                       ("agent", None, 1), ("llm", None, 2)], 22)
    (alone,) = assemble_all(spans[:3])
    assert alone.key == run.key


def test_workflow_root_with_its_own_agent_name_keeps_nested_agents_as_steps() -> None:
    spans = tree(("w", "", "invoke_workflow", {**GENAI_WORKFLOW, "gen_ai.agent.name": "o"}),
                 ("a", "w", "invoke_agent inner", genai_agent("inner")),
                 ("m", "a", "chat m", GENAI_CHAT))
    (run,) = assemble_all(spans)
    assert summary(run) == ("o", [("agent", None, 1), ("llm", None, 2)], 11)


def test_openinference_tool_inventory_reaches_the_run() -> None:
    schema = json.dumps({"type": "function", "function": {"name": "get_weather"}})
    spans = tree(("a", "", "weather_agent", OI_AGENT),
                 ("m", "a", "ChatCompletion", {**OI_LLM,
                                               "llm.tools.0.tool.json_schema": schema}))
    (run,) = assemble_all(spans)
    assert run.attributes["assaywatch.tool_inventory"] == "get_weather"
    assert run.key.agent == "weather_agent"


def test_a_langgraph_node_waits_for_its_graph_before_the_trace_closes() -> None:
    clock = FakeClock()
    asm = Assembler(clock=clock, grace_s=1.0)
    spans = langgraph("LangGraph", OI_CHAIN)
    root, nodes = spans[0], spans[1:4]  # one model node and its children
    asm.add(nodes)
    clock.t += 10
    assert asm.poll() == [] and asm.pending_traces == 1
    asm.add([root])
    clock.t += 10
    (run,) = asm.poll()
    assert run.root_span_id == root.span_id and len(run.steps) == 1


# -- per-sender quotas and the byte budget -------------------------------------------------


def _orphans(service: str, n: int, seed: int, spans_per_trace: int = 1) -> list[SpanRecord]:
    """``n`` traces of orphan LLM spans (their parent never arrives: never ready)."""
    rng = random.Random(f"orphans-{seed}")  # never the SpanFactory's ids
    out = []
    for _ in range(n):
        tid = f"{rng.getrandbits(128):032x}"
        for _ in range(spans_per_trace):
            out.append(SpanRecord(
                trace_id=tid, span_id=f"{rng.getrandbits(64):016x}",
                parent_span_id=f"{rng.getrandbits(64):016x}", name="chat gpt-4o",
                start_ns=1, end_ns=2,
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                            "gen_ai.output.messages": "x" * 8000},
                resource={"service.name": service}))
    return out


def _runs_of(service: str, agent: str, n: int, seed: int) -> list[list[SpanRecord]]:
    f = SpanFactory(seed=seed, service_name=service)
    return [f.agent_run(tool_agent(name=agent), "genai") for _ in range(n)]


def test_an_orphan_flood_evicts_only_its_own_sender_traces() -> None:
    clock, c = FakeClock(), IngestCounters()
    asm = Assembler(clock=clock, grace_s=1.0, max_pending_traces=100, counters=c)
    good = _runs_of("good-svc", "good-agent", 30, seed=3)
    for i, run in enumerate(good):  # interleaved with a flood 20 times the trace limit
        asm.add(run)
        asm.add(_orphans("flood-svc", 70, seed=i))
    usage = asm.sender_usage()
    assert usage["good-svc"][0] == 30 and asm.pending_traces == 100
    assert c.dropped["sender_quota"] == 30 * 70 + 30 - 100 and c.dropped["evicted_trace"] == 0
    clock.t += 2
    runs = asm.poll()
    assert sorted(r.key.agent for r in runs) == ["good-agent"] * 30


def test_a_sender_within_its_share_takes_the_place_of_one_above_it() -> None:
    c = IngestCounters()
    asm = Assembler(clock=FakeClock(), max_pending_traces=10, counters=c)
    asm.add(_orphans("flood-svc", 10, seed=1))  # alone: entitled to everything
    assert c.dropped == {}
    for i, run in enumerate(_runs_of("good-svc", "good-agent", 5, seed=2)):
        asm.add(run)  # each takes the place of the flood's oldest
        assert asm.sender_usage()["good-svc"][0] == i + 1
    assert asm.sender_usage() == {"flood-svc": (5, asm.sender_usage()["flood-svc"][1]),
                                  "good-svc": (5, asm.sender_usage()["good-svc"][1])}
    assert c.dropped["sender_quota"] == 5
    asm.add(_runs_of("good-svc", "good-agent", 1, seed=4)[0])  # now above its share: its own
    assert asm.sender_usage()["good-svc"][0] == 5 and c.dropped["sender_quota"] == 6


def test_one_sender_alone_evicts_its_oldest_as_before() -> None:
    c = IngestCounters()
    asm = Assembler(clock=FakeClock(), max_pending_traces=3, counters=c)
    for run in _runs_of("svc", "a", 5, seed=1):
        asm.add(run)
    assert c.dropped == {"evicted_trace": 2}


def test_pending_bytes_are_bounded_fairly_per_sender() -> None:
    c = IngestCounters()
    budget = 2 << 20
    asm = Assembler(clock=FakeClock(), max_pending_traces=100_000, counters=c,
                    max_pending_bytes=budget)
    good = _runs_of("good-svc", "good-agent", 50, seed=7)
    for i, run in enumerate(good):
        asm.add(run)
        asm.add(_orphans("flood-svc", 20, seed=100 + i, spans_per_trace=10))
        assert asm.pending_bytes <= budget
    assert asm.sender_usage()["good-svc"][0] == 50
    assert c.dropped["sender_quota"] > 0 and asm.pending_bytes > budget * 0.9
    assert sorted(r.key.agent for r in asm.flush()) == ["good-agent"] * 50


def test_pending_bytes_alone_are_counted_as_pending_bytes() -> None:
    c = IngestCounters()
    asm = Assembler(clock=FakeClock(), counters=c, max_pending_bytes=1 << 20)
    asm.add(_orphans("flood-svc", 400, seed=1, spans_per_trace=5))
    assert asm.pending_bytes <= 1 << 20 and c.dropped["pending_bytes"] > 0
    assert asm.pending_traces < 400 and "sender_quota" not in c.dropped
    asm.flush()
    assert asm.pending_bytes == 0 and asm.sender_usage() == {}


def test_pending_bytes_estimate_follows_the_measured_memory() -> None:
    """The estimate (node_bytes + TRACE_BYTES) is an upper bound of what tracemalloc sees,
    and not a loose one: realistic runs of every dialect and a flood of orphan spans."""
    import gc
    import tracemalloc

    cases = {d: [SpanFactory(seed=i, service_name=f"svc{i % 3}").agent_run(
        rich_script(), d) for i in range(300)] for d in DIALECTS}
    cases["orphans"] = [_orphans("flood-svc", 3000, seed=5)]
    for name, batches in cases.items():
        asm = Assembler(clock=FakeClock(), max_pending_traces=10**6, max_pending_bytes=None)
        gc.collect()
        tracemalloc.start()
        try:
            for b in batches:
                asm.add(b)
            gc.collect()
            real, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert real * 0.95 <= asm.pending_bytes <= real * 1.6, (name, real, asm.pending_bytes)


def test_max_pending_bytes_is_validated() -> None:
    with pytest.raises(ValueError, match="max_pending_bytes"):
        Assembler(max_pending_bytes=10)


@pytest.mark.skipif(not NATIVE_INSTALLED, reason="gc_untrack needs the compiled module "
                    "(pip install ./native, needs Rust); without it nodes stay tracked")
def test_pending_nodes_are_left_to_reference_counting() -> None:
    """A pending trace's nodes are not tracked by the cycle collector (young collections
    would walk every pending span for nothing): nothing a node refers to, followed all the
    way down, leads back to a node or its trace, so no cycle can hold one; a collection
    while the trace is pending changes nothing in its run."""
    spans = SpanFactory(seed=11).agent_run(rich_script(), "genai")
    reference = assemble_all(spans)
    clock = FakeClock()
    asm = Assembler(clock=clock, grace_s=1.0)
    asm.add(spans)
    (trace,) = asm._pending.values()
    nodes = list(trace.nodes.values())
    assert len(nodes) == len(spans)
    assert not any(gc.is_tracked(n) for n in nodes)
    containers = {id(trace), id(trace.nodes), *map(id, nodes)}
    for node in nodes:  # everything reachable from a node: none of the containers
        seen: set[int] = set()
        todo = gc.get_referents(node)
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, type):
                continue
            seen.add(id(obj))
            assert id(obj) not in containers, (node.name, type(obj))
            todo.extend(gc.get_referents(obj))
    gc.collect()
    clock.t += 2.0
    runs = asm.poll()
    assert [signature(r) for r in runs] == [signature(r) for r in reference]
