"""The outcome oracle: evaluation > contract rules > error-free, and the rules config."""

from __future__ import annotations

import pytest

from assaywatch.analyzers.model import Action, Outcome, Run, Step, StreamKey
from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.pipeline.outcome import (
    ContractRules,
    Evaluation,
    contract_violations,
    decide_outcome,
    judge_evaluation,
)
from tests.monitor.spanfactory import EvalSpec, Llm, SpanFactory, Tool, tool_agent


def make_run(tools: tuple[str, ...] = ("search",), step_error: bool = False,
             root_error: bool = False, tokens: int = 100, cost: float | None = 0.01,
             duration_s: float = 2.0, output_length: int = 50) -> Run:
    steps = [Step(Action.LLM, input_tokens=tokens // 2, output_tokens=tokens - tokens // 2,
                  cost_usd=cost)]
    steps += [Step(Action.TOOL, tool=t, error=step_error) for t in tools]
    return Run(trace_id="t", root_span_id="r", key=StreamKey("a"), steps=steps,
               output_length=output_length, start_ns=0, end_ns=int(duration_s * 1e9),
               error=root_error)


@pytest.mark.parametrize(("ev", "expected"), [
    (Evaluation(passed=True, label="incorrect", score=0.0), Outcome.PASS),
    (Evaluation(passed=False, label="correct"), Outcome.FAIL),
    (Evaluation(label="Correct", score=0.0), Outcome.PASS),
    (Evaluation(label=" FAILED ", score=1.0), Outcome.FAIL),
    (Evaluation(label="hallucinated"), Outcome.FAIL),
    (Evaluation(label="4 stars", score=0.5), Outcome.PASS),  # unknown label: the score
    (Evaluation(score=0.49), Outcome.FAIL),
    (Evaluation(label="4 stars"), Outcome.UNKNOWN),
    (Evaluation(name="relevance"), Outcome.UNKNOWN),
])
def test_judge_evaluation(ev: Evaluation, expected: Outcome) -> None:
    assert judge_evaluation(ev) is expected


def test_score_threshold_is_configurable() -> None:
    ev = Evaluation(score=3.0)  # a 1-5 scale
    assert judge_evaluation(ev, threshold=0.5) is Outcome.PASS
    assert judge_evaluation(ev, threshold=4.0) is Outcome.FAIL
    out, _ = decide_outcome(make_run(), ev, score_threshold=4.0)
    assert out is Outcome.FAIL


def test_evaluation_beats_contracts_beats_error_free() -> None:
    bad = make_run(tools=("rm_rf",), step_error=True, root_error=True)
    rules = ContractRules(forbidden_tools=frozenset({"rm_rf"}))
    assert decide_outcome(bad, Evaluation(label="pass"), rules)[0] is Outcome.PASS
    out, reason = decide_outcome(bad, None, rules)
    assert out is Outcome.FAIL and "forbidden tool 'rm_rf'" in reason
    # Contracts met: a step error does not fail the run (no_error_spans is off) ...
    flaky = make_run(step_error=True)
    assert decide_outcome(flaky, None, ContractRules(max_steps=5))[0] is Outcome.PASS
    # ... but with no rules the error-free oracle fails it.
    out, reason = decide_outcome(flaky, None, None)
    assert out is Outcome.FAIL and reason.startswith("error-free")
    assert decide_outcome(make_run(), None, None) == (Outcome.PASS, "error-free run")
    # An undecidable evaluation is skipped, not taken as a pass.
    assert decide_outcome(flaky, Evaluation(label="meh"), None)[0] is Outcome.FAIL
    # A root error fails under contract rules too.
    assert decide_outcome(make_run(root_error=True), None,
                          ContractRules(max_steps=5))[0] is Outcome.FAIL


def test_all_evaluations_must_pass() -> None:
    evs = [Evaluation(name="relevance", label="relevant"),
           Evaluation(name="faithfulness", score=0.1)]
    out, reason = decide_outcome(make_run(), evs)
    assert out is Outcome.FAIL and "faithfulness" in reason
    assert decide_outcome(make_run(), evs[:1])[0] is Outcome.PASS


@pytest.mark.parametrize(("rules", "run", "needle"), [
    (ContractRules(max_steps=1), make_run(tools=("a", "b")), "max_steps"),
    (ContractRules(max_tokens=99), make_run(tokens=100), "max_tokens"),
    (ContractRules(max_cost_usd=0.005), make_run(cost=0.01), "max_cost_usd"),
    (ContractRules(max_duration_s=1.5), make_run(duration_s=2.0), "max_duration_s"),
    (ContractRules(required_tools=frozenset({"pay"})), make_run(), "required tool 'pay'"),
    (ContractRules(forbidden_tools=frozenset({"search"})), make_run(),
     "forbidden tool 'search'"),
    (ContractRules(no_error_spans=True), make_run(step_error=True), "no_error_spans"),
    (ContractRules(output_min_length=51), make_run(output_length=50), "output_min_length"),
    (ContractRules(output_max_length=49), make_run(output_length=50), "output_max_length"),
])
def test_each_contract_rule(rules: ContractRules, run: Run, needle: str) -> None:
    violations = contract_violations(run, rules)
    assert len(violations) == 1 and needle in violations[0]
    assert decide_outcome(run, None, rules)[0] is Outcome.FAIL
    assert contract_violations(make_run(tools=("a",), tokens=10, cost=0.001,
                                        duration_s=1.0, output_length=50),
                               ContractRules(max_steps=2, max_tokens=10, max_cost_usd=0.005,
                                             max_duration_s=1.5,
                                             required_tools=frozenset({"a"}),
                                             forbidden_tools=frozenset({"z"}),
                                             no_error_spans=True, output_min_length=50,
                                             output_max_length=50)) == []


def test_cost_rule_is_skipped_when_no_step_reports_cost() -> None:
    assert contract_violations(make_run(cost=None), ContractRules(max_cost_usd=0.0)) == []


def test_rules_from_dict() -> None:
    rules = ContractRules.from_dict({"max_steps": 12, "required_tools": ["search"],
                                     "max_cost_usd": 1, "no_error_spans": True,
                                     "output_max_length": None})
    assert rules == ContractRules(max_steps=12, required_tools=frozenset({"search"}),
                                  max_cost_usd=1.0, no_error_spans=True)
    assert ContractRules.from_dict({}).is_empty and not rules.is_empty


@pytest.mark.parametrize(("data", "message"), [
    ({"max_step": 3, "forbiden_tools": []},
     r"unknown contract rule\(s\) forbiden_tools, max_step; valid rules are max_steps, "),
    ({"max_steps": -1}, r"contracts\.max_steps: expected an integer >= 0, got -1"),
    ({"max_steps": 2.5}, r"contracts\.max_steps: expected an integer"),
    ({"max_tokens": True}, r"contracts\.max_tokens: expected an integer"),
    ({"max_cost_usd": "cheap"}, r"contracts\.max_cost_usd: expected a number >= 0"),
    ({"required_tools": "search"}, r"contracts\.required_tools: expected a list of tool"),
    ({"no_error_spans": "yes"}, r"contracts\.no_error_spans: expected true or false"),
    ({"required_tools": ["a"], "forbidden_tools": ["a"]}, r"both required and forbidden"),
    ({"output_min_length": 9, "output_max_length": 3}, r"output_min_length 9 exceeds"),
])
def test_bad_rules_config_gives_a_clear_error(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContractRules.from_dict(data)


def test_error_names_where_the_rules_came_from() -> None:
    with pytest.raises(ValueError, match=r"^monitor\.yaml: contracts: unknown"):
        ContractRules.from_dict({"x": 1}, where="monitor.yaml: contracts")
    with pytest.raises(ValueError, match="expected a mapping"):
        ContractRules.from_dict(["max_steps"])  # type: ignore[arg-type]


@pytest.mark.parametrize(("spec", "expected", "score"), [
    (EvalSpec(label="incorrect", score=0.9), Outcome.FAIL, 0.9),
    (EvalSpec(score=0.8, as_event=True), Outcome.PASS, 0.8),
    (EvalSpec(passed=False), Outcome.FAIL, None),
    (None, Outcome.FAIL, None),  # error-free oracle: the tool step errors
])
def test_outcome_through_the_pipeline(spec: EvalSpec | None, expected: Outcome,
                                      score: float | None) -> None:
    agent = tool_agent(("search",))
    agent.steps[1] = Tool("search", error=True)
    agent.evaluation = spec
    (run,) = assemble_all(SpanFactory(seed=2).agent_run(agent, "genai"))
    assert run.outcome is expected and run.evaluation_score == score


def test_pipeline_applies_contract_rules() -> None:
    agent = tool_agent(("search",))
    agent.steps.append(Llm(input_tokens=5000))
    (run,) = assemble_all(SpanFactory(seed=2).agent_run(agent, "openinference"),
                          rules=ContractRules(max_tokens=1000))
    assert run.outcome is Outcome.FAIL
    assert "max_tokens" in run.attributes["assaywatch.outcome.reason"]
