from __future__ import annotations

import math

import numpy as np
import pytest

from assaywatch.analyzers.coverage import (
    BOUNDARY_ATTRIBUTE,
    MAX_PATH_CHARS,
    CoverageTracker,
    abstract_states,
    chao1,
    coverage,
    geometric_mean,
    path_key,
)
from assaywatch.analyzers.model import Action, Run, Step, StreamKey
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("a")


def _run(i: int, tools: list[str], models: tuple[str, ...] = ("m1",), boundaries: str = "") -> Run:
    steps = [Step(Action.LLM)]
    for t in tools:
        steps += [Step(Action.TOOL, tool=t), Step(Action.LLM)]
    attrs = {BOUNDARY_ATTRIBUTE: boundaries} if boundaries else {}
    return Run(f"{i:032x}", f"{i:016x}", KEY, steps=steps, models=models, attributes=attrs)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([1, 1, 2, 3], 4 + 2**2 / (2 * 1)),  # d=4, f1=2, f2=1
        ([1, 1, 1, 2, 2, 5], 6 + 3**2 / (2 * 2)),  # d=6, f1=3, f2=2
        ([1, 1, 1, 3], 4 + 3 * 2 / 2),  # f2 = 0: bias-corrected
        ([1, 1], 2 + 1),  # all singletons, f2 = 0
        ([1], 1 + 0),  # one singleton: f1 (f1 - 1) / 2 = 0
        ([2, 3, 5], 3),  # no singletons: d
        ([0, 0, 4], 1),  # zero counts ignored
        ([], 0),
    ],
)
def test_chao1_hand_cases(counts: list[int], expected: float) -> None:
    assert chao1(counts) == pytest.approx(expected)


def test_chao1_accepts_a_mapping_and_rejects_negative_counts() -> None:
    assert chao1({"a": 1, "b": 1, "c": 2}) == pytest.approx(3 + 2**2 / 2)
    with pytest.raises(ValueError):
        chao1([1, -1])


def test_geometric_mean_with_a_zero_dimension_is_zero() -> None:
    assert geometric_mean([0.9, 0.8, 0.0, 1.0]) == 0.0
    assert geometric_mean([0.25, 1.0]) == pytest.approx(0.5)


def test_zero_tool_coverage_makes_overall_zero() -> None:
    runs = [_run(i, ["other"]) for i in range(5)]
    rep = coverage(runs, tools=["search", "calc"])
    assert rep.tool == 0.0 and rep.overall == 0.0
    assert rep.path > 0  # the other dimensions are still reported
    assert rep.unlisted_tools == ("other",) and rep.untested_tools == ("calc", "search")


def test_all_five_dimensions_by_hand() -> None:
    runs = [
        _run(1, ["search"], boundaries="search.q:empty"),
        _run(2, ["search"], models=("m2",)),
        _run(3, ["calc"], boundaries="calc.x:huge,unknown:b"),
        _run(4, []),
    ]
    rep = coverage(
        runs,
        tools=["search", "calc", "lookup"],
        target_models=["m1", "m2", "m3"],
        state_lambda=4.0,
        boundaries=["search.q:empty", "search.q:long", "calc.x:huge", "calc.x:neg"],
    )
    assert rep.tool == pytest.approx(2 / 3)
    # paths: search-path x2, calc-path x1, llm-only x1 -> d=3, f1=2, f2=1 -> chao1 = 5
    assert rep.distinct_paths == 3 and rep.chao1_paths == pytest.approx(5.0)
    assert rep.path == pytest.approx(3 / 5)
    # states: ^>llm, llm>tool:search, tool:search>llm, llm>tool:calc, tool:calc>llm
    assert rep.distinct_states == 5
    assert rep.state == pytest.approx(1 - math.exp(-5 / 4.0))
    assert rep.boundary == pytest.approx(2 / 4)  # "unknown:b" is not a configured boundary
    assert rep.model == pytest.approx(2 / 3)
    dims = [rep.tool, rep.path, rep.state, rep.boundary, rep.model]
    assert rep.overall == pytest.approx(float(np.prod(dims)) ** (1 / 5))
    assert rep.not_measured == ()
    assert set(rep.as_dict()) == {"tool", "path", "state", "boundary", "model", "overall"}


def test_unmeasured_dimensions_are_flagged_and_excluded_from_overall() -> None:
    runs = [_run(i, ["search"] * (i % 3)) for i in range(9)]
    rep = coverage(runs, tools=["search", "calc"])
    assert rep.boundary == 1.0 and rep.model == 1.0  # vacuous, flagged below
    assert rep.not_measured == ("boundary", "model")
    assert rep.tool == 0.5
    # the overall root is over the three measured dimensions, not five
    assert rep.overall == pytest.approx((rep.tool * rep.path * rep.state) ** (1 / 3))
    assert rep.overall < (rep.tool * rep.path * rep.state) ** (1 / 5)
    assert set(rep.as_dict()) == {"tool", "path", "state", "overall"}
    observed = coverage(runs, tools=None)
    assert observed.not_measured == ("tool", "boundary", "model")
    assert observed.tool_inventory_source == "observed"


def test_no_runs_means_zero_coverage() -> None:
    rep = CoverageTracker(tools=["a"]).report()
    assert (rep.tool, rep.path, rep.state, rep.overall) == (0.0, 0.0, 0.0, 0.0)


def test_abstract_states_mark_errors_and_start() -> None:
    run = Run(
        "t",
        "r",
        KEY,
        steps=[
            Step(Action.LLM),
            Step(Action.TOOL, tool="x", error=True),
            Step(Action.TOOL, tool="x"),
        ],
    )
    assert abstract_states(run) == {"^>llm", "llm>tool:x!", "tool:x>tool:x"}
    assert path_key(run) == "llm>tool:x>tool:x"


def test_long_paths_are_hashed_but_stay_distinct() -> None:
    a = _run(1, ["search"] * 200)
    b = _run(2, ["search"] * 201)
    ka, kb = path_key(a), path_key(b)
    assert ka.startswith("#") and len(ka) == 33 and ka != kb
    assert len(path_key(_run(3, ["s"]))) < MAX_PATH_CHARS


def test_tracker_matches_batch_and_bounds_memory() -> None:
    runs = simulate_runs(200, np.random.default_rng(2), tool_calls_mean=3)
    tools = ["calc", "lookup", "search"]
    tracker = CoverageTracker(tools=tools, tool_source="config")
    for r in runs:
        tracker.add(r)
    assert tracker.report() == coverage(runs, tools=tools, tool_source="config")
    small = CoverageTracker(tools=tools, max_distinct=3)
    for r in runs:
        small.add(r)
    rep = small.report()
    assert len(small.path_counts) == 3 and rep.paths_dropped > 0
    assert len(small.states) == 3 and rep.states_dropped > 0


def test_path_coverage_approaches_one_on_a_finite_path_space() -> None:
    # 8 feasible paths with skewed probabilities: a few runs leave rare paths unseen (Chao1
    # predicts more), thousands see every path many times (f1 = 0, so C_path = 1).
    rng = np.random.default_rng(3)
    space = [
        ["search"],
        ["calc"],
        ["lookup"],
        ["search", "calc"],
        ["calc", "search"],
        ["search", "search"],
        ["lookup", "calc"],
        [],
    ]
    p = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.06, 0.05, 0.04])
    idx = rng.choice(len(space), size=3000, p=p)
    runs = [_run(i, space[j]) for i, j in enumerate(idx)]
    tools = ["calc", "lookup", "search"]
    few, many = coverage(runs[:15], tools=tools), coverage(runs, tools=tools)
    assert few.path < 1.0
    assert many.path == 1.0 and many.distinct_paths == 8
    assert many.state >= few.state


def test_invalid_tracker_arguments() -> None:
    with pytest.raises(ValueError, match="tool_source"):
        CoverageTracker(tool_source="somewhere")
    with pytest.raises(ValueError, match="state_lambda"):
        CoverageTracker(state_lambda=0)
