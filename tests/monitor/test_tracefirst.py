"""Trace-first checks: contract rules and metamorphic relations judged from stored runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scipy import stats

from assaywatch.analyzers.model import Action, Outcome, Run, Step, StreamKey
from assaywatch.monitor.offline.gate import GatePolicy
from assaywatch.monitor.offline.load import load_runs
from assaywatch.monitor.offline.tracefirst import (
    PAIR_KEY,
    RELATION_KEY,
    ROLE_KEY,
    Relation,
    one_sample_test,
    relation_tally,
    relations_from_config,
    trace_first_by_stream,
    trace_first_tests,
)
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.analyzers.simagent import simulate_runs

POLICY = GatePolicy()
RULES = ContractRules.from_dict({"required_tools": ["search"], "max_steps": 12})
FORMAT = Relation.from_mapping({"name": "format_compliance", "output_min_length": 50,
                                "output_max_length": 3000})


def drop_search(runs: list[Run], rng: np.random.Generator, share: float) -> list[Run]:
    """A regression: in ``share`` of the runs the agent never calls ``search``."""
    out = []
    for r in runs:
        if rng.random() < share:
            r = dataclasses.replace(r, steps=[s for s in r.steps if s.tool != "search"])
        out.append(r)
    return out


def test_contract_violation_rise_fails_and_unchanged_passes() -> None:
    rng = np.random.default_rng(5)
    # tool_calls_mean 4: "search" (weight 0.5) is missed in few runs, so eps is small
    base = simulate_runs(600, rng, tool_calls_mean=4.0)
    same = simulate_runs(600, rng, tool_calls_mean=4.0)
    worse = drop_search(simulate_runs(600, rng, tool_calls_mean=4.0), rng, 0.3)
    (ok,) = trace_first_tests(base, same, RULES, [], POLICY)
    (bad,) = trace_first_tests(base, worse, RULES, [], POLICY)
    assert ok.name == bad.name == "contracts"
    assert ok.verdict == "pass", ok.message
    assert bad.verdict == "fail", bad.message
    assert bad.statistics["violation_rate_candidate"] - bad.statistics["eps"] >= POLICY.delta
    assert "required tool 'search' not called" in str(bad.statistics["example_1"])


def quick_runs(n: int, rng: np.random.Generator) -> list[Run]:
    """Light runs (only what these checks read: tools, steps, output length, outcome), all
    random draws vectorised, for the repetitions below."""
    m = rng.poisson(3.0, size=n)
    tools = rng.choice(np.array(["search", "lookup", "calc"]), p=[0.5, 0.3, 0.2],
                       size=(n, int(m.max(initial=0)) + 1))
    out_len = rng.lognormal(np.log(400.0), 0.5, size=n).astype(int)
    key = StreamKey("support-agent", "1.0", "refund")
    return [Run(f"t{i}", "r", key, output_length=int(out_len[i]), outcome=Outcome.PASS,
                steps=[Step(Action.LLM), *(Step(Action.TOOL, tool=str(t))
                                           for t in tools[i, :m[i]])])
            for i in range(n)]


def test_false_fail_rate_of_unchanged_candidates_is_at_most_alpha() -> None:
    """Three tests per repetition (contracts, format, constraints), Holm-adjusted: the
    family-wise false-fail rate must stay <= alpha = 0.05. 150 seeded repetitions:
    the binomial(150, 0.05) 99.9% quantile is 16, so > 16 false fails is a real excess."""
    rng = np.random.default_rng(2026)
    cons = Relation.from_mapping({"name": "constraint_preservation",
                                  "forbidden_tools": ["calc"]})
    fails = 0
    reps = 150
    for _ in range(reps):
        base, cand = quick_runs(200, rng), quick_runs(200, rng)
        res = trace_first_tests(base, cand, RULES, [FORMAT, cons], POLICY)
        fails += any(t.verdict == "fail" for t in res)
    assert fails <= stats.binom.ppf(0.999, reps, POLICY.alpha), fails


def test_one_sample_test_matches_scipy_and_monte_carlo_power() -> None:
    n, eps, delta, alpha = 300, 0.05, 0.05, 0.05
    for x in (5, 15, 25, 40):
        p, _ = one_sample_test(x, n, eps, delta, alpha)
        assert p == pytest.approx(stats.binomtest(x, n, eps, alternative="greater").pvalue,
                                  rel=1e-9)
    _, power = one_sample_test(0, n, eps, delta, alpha)
    # Monte Carlo at v = eps + delta with scipy's p-values: 20,000 draws give a standard
    # error of sqrt(0.25/20000) = 0.0035 at most; 0.015 is > 4 standard errors.
    rng = np.random.default_rng(1)
    draws = rng.binomial(n, eps + delta, size=20_000)
    pvals = stats.binom.sf(draws - 1, n, eps)
    assert np.mean(pvals < alpha) == pytest.approx(power, abs=0.015)
    # and the size at v = eps is <= alpha (exact test)
    null = stats.binom.sf(rng.binomial(n, eps, size=20_000) - 1, n, eps)
    assert np.mean(null < alpha) <= alpha + 0.01


def test_without_baseline_runs_eps_is_the_reference() -> None:
    rng = np.random.default_rng(9)
    cand = simulate_runs(400, rng, output_length_mean=400.0)
    tight = Relation.from_mapping({"name": "short_answers", "output_max_length": 400})
    (res,) = trace_first_tests(None, cand, None, [tight], POLICY, eps=0.05)
    # half the log-normal outputs exceed the median 400: far beyond eps + delta
    assert res.verdict == "fail" and res.statistics["test"] == "binomial"
    loose = Relation.from_mapping({"name": "bounded", "output_max_length": 100_000})
    (res,) = trace_first_tests(None, cand, None, [loose], POLICY, eps=0.05)
    assert res.verdict == "pass", res.message


def _pairs(n: int, rng: np.random.Generator, relation: str, changed: float) -> list[Run]:
    """n marked pairs; in a share ``changed`` of them the follow-up calls other tools."""
    runs: list[Run] = []
    for i in range(n):
        src = simulate_runs(1, rng, tool_calls_mean=3.0)[0]
        fol = dataclasses.replace(src, trace_id=src.trace_id[::-1], start_ns=src.start_ns + 1,
                                  steps=list(src.steps))
        if relation == "permutation":  # a reordered input: same tools, other order
            fol.steps = list(reversed(fol.steps))
        if rng.random() < changed:
            fol.steps = [s for s in fol.steps if s.action is not Action.TOOL]
        for r, role in ((src, "source"), (fol, "follow-up")):
            r.attributes = {RELATION_KEY: relation, PAIR_KEY: f"p{i}", ROLE_KEY: role}
        runs += [src, fol]
    return runs


def test_pair_relations_permutation_and_idempotence() -> None:
    rng = np.random.default_rng(3)
    perm, idem = relations_from_config([{"name": "permutation"}, {"name": "idempotence"}])
    assert perm.checks == ("tool_multiset", "outcome") and idem.checks == ("decision_path",)
    base = _pairs(200, rng, "permutation", 0.0)
    t = relation_tally(base, perm)
    # a reordered follow-up keeps the tool multiset; runs without tools stay equal too
    assert t.units == 200 and t.violations == 0
    # reversing the steps changes the decision path: idempotence would flag it
    rev = [dataclasses.replace(r, attributes={**r.attributes, RELATION_KEY: "idempotence"})
           for r in base]
    assert relation_tally(rev, idem).violations > 100
    cand = _pairs(200, rng, "permutation", 0.3)
    (res,) = trace_first_tests(base, cand, None, [perm], POLICY)
    assert res.verdict == "fail", res.message
    assert "pair p" in str(res.statistics["example_1"])
    # pairs of another relation are not judged by this one
    (res,) = trace_first_tests(base, _pairs(50, rng, "idempotence", 0.0), None, [perm], POLICY)
    assert res.verdict == "inconclusive" and res.statistics["n_candidate"] == 0


def test_outcome_check_skips_undecided_pairs() -> None:
    rng = np.random.default_rng(4)
    runs = _pairs(10, rng, "permutation", 0.0)
    for r in runs[1::2]:
        r.outcome = Outcome.UNKNOWN
    only_outcome = Relation("o", "pair", checks=("outcome",))
    for r in runs:
        r.attributes[RELATION_KEY] = "o"
    assert relation_tally(runs, only_outcome).units == 0


def test_relation_config_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="needs checks"):
        Relation.from_mapping({"name": "my_relation"})
    with pytest.raises(ValueError, match="cannot mix"):
        Relation.from_mapping({"name": "x", "output_max_length": 3, "required_tools": ["a"]})
    with pytest.raises(ValueError, match="given twice"):
        relations_from_config([{"name": "permutation"}, {"name": "permutation"}])
    with pytest.raises(ValueError, match="output_min_length"):
        Relation.from_mapping({"name": "x", "output_min_length": -1})


def test_by_stream_groups_by_agent_and_scenario_with_one_holm_family() -> None:
    rng = np.random.default_rng(8)
    k1, k2 = StreamKey("a", "1", "x"), StreamKey("a", "1", "y")
    base = (simulate_runs(300, rng, key=k1, tool_calls_mean=4.0)
            + simulate_runs(300, rng, key=k2, tool_calls_mean=4.0))
    c1 = StreamKey("a", "2", "x")
    cand = (drop_search(simulate_runs(300, rng, key=c1, tool_calls_mean=4.0), rng, 0.4)
            + simulate_runs(300, rng, key=StreamKey("a", "2", "y"), tool_calls_mean=4.0))
    out = trace_first_by_stream(base, cand, RULES, [FORMAT], POLICY)
    assert set(out) == {("a", "x"), ("a", "y")}
    assert out[("a", "x")][0].verdict == "fail"
    assert all(t.verdict != "fail" for t in out[("a", "y")])
    ps = [t.statistics for ts in out.values() for t in ts]
    assert all(s["p_value_holm"] >= s["p_value"] for s in ps)
    # Holm over 4 tests: the smallest p-value is multiplied by 4
    smallest = min(ps, key=lambda s: s["p_value"])
    assert smallest["p_value_holm"] == pytest.approx(min(1.0, 4 * smallest["p_value"]))


def test_relation_marks_survive_real_spans(tmp_path: Path) -> None:
    """Marks set by an instrumented agent on its invoke_agent span reach Run.attributes
    through the span file and the monitor's assembler, and the pair is judged."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tf-test")
    t = 1_760_000_000_000_000_000
    for pair, (role, tools) in enumerate([("source", ["a", "b"]), ("follow-up", ["b", "a"]),
                                          ("source", ["a"]), ("follow-up", ["c"])]):
        root = tracer.start_span("invoke_agent bot", start_time=t, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bot",
            RELATION_KEY: "permutation", PAIR_KEY: f"q{pair // 2}", ROLE_KEY: role})
        ctx = trace.set_span_in_context(root)
        for name in tools:
            sp = tracer.start_span(f"execute_tool {name}", context=ctx, start_time=t + 1000,
                                   attributes={"gen_ai.operation.name": "execute_tool",
                                               "gen_ai.tool.name": name})
            sp.end(end_time=t + 2000)
            t += 2000
        root.end(end_time=t + 1000)
        t += 10_000_000_000
    path = tmp_path / "pairs.jsonl"
    write_otlp_json_lines(str(path), exporter.get_finished_spans())
    provider.shutdown()
    runs, _ = load_runs([str(path)])
    assert len(runs) == 4
    assert {r.attributes[ROLE_KEY] for r in runs} == {"source", "follow-up"}
    tally = relation_tally(runs, Relation.from_mapping({"name": "permutation",
                                                        "checks": ["tool_multiset"]}))
    assert (tally.units, tally.violations) == (2, 1)
    assert tally.samples[0].startswith("pair q1")
