"""The assembler: runs from spans in every dialect, arrival order, closing rules, limits."""

from __future__ import annotations

import random
import sys

import pytest

from assaywatch.analyzers.model import Action, Outcome, Run
from assaywatch.monitor.pipeline.assemble import Assembler, assemble_all
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord
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


def test_a_thousand_nested_spans_assemble_without_recursion() -> None:
    tid, spans = "ab" * 16, []
    parent = ""
    for i in range(1000):
        sid = f"{i + 1:016x}"
        attrs = ({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "deep"}
                 if i == 0 else {"openinference.span.kind": "CHAIN"})
        spans.append(SpanRecord(tid, sid, parent, f"s{i}", i, 10_000 - i, attributes=attrs))
        parent = sid
    depth_now = len(_frames())
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth_now + 120)  # a recursive walk of 1,000 levels would fail
    try:
        runs = assemble_all(reversed(spans))
    finally:
        sys.setrecursionlimit(old)
    assert len(runs) == 1 and len(runs[0].steps) == 999
    assert max(s.depth for s in runs[0].steps) == 999


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
