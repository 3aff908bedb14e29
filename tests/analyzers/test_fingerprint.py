from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from assaywatch.analyzers.fingerprint import (
    FIXED_FEATURES,
    feature_names,
    fingerprint,
    fingerprint_matrix,
)
from assaywatch.analyzers.model import Action, Run, Step, StreamKey
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("a", "1", "s")
TOOLS = ["calc", "lookup", "search"]


def _run(steps: list[Step], **kw: object) -> Run:
    return Run("t" * 32, "r" * 16, KEY, steps=steps, **kw)  # type: ignore[arg-type]


def test_fixed_dimensions_names_and_order() -> None:
    assert FIXED_FEATURES == (
        "steps",
        "max_depth",
        "branches",
        "output_length",
        "output_complexity",
        "frac_llm",
        "frac_tool",
        "frac_retrieve",
        "frac_delegate",
        "any_error",
        "recovery_rate",
        "total_tokens",
        "mean_step_tokens",
        "duration",
    )
    names = feature_names(TOOLS)
    assert names[:14] == list(FIXED_FEATURES)
    assert names[14:] == ["tool:calc", "tool:lookup", "tool:search"]
    f = fingerprint(_run([Step(Action.LLM)]), TOOLS)
    assert f.dtype == np.float64 and f.shape == (17,)


def test_each_feature_on_a_hand_built_run() -> None:
    steps = [
        Step(Action.LLM, input_tokens=100, output_tokens=20, depth=1),
        Step(Action.TOOL, tool="search", error=True, depth=2),
        Step(Action.TOOL, tool="search", depth=2),  # recovers the error above
        Step(Action.RETRIEVE, depth=3),
        Step(Action.HANDOFF, tool="billing", depth=1),
        Step(Action.TOOL, tool="weather", depth=2),  # not in the inventory
        Step(Action.OTHER),
        Step(Action.LLM, input_tokens=200, output_tokens=60, depth=1),
    ]
    run = _run(steps, output_length=999, start_ns=0, end_ns=3_000_000_000)
    f = dict(zip(feature_names(TOOLS), fingerprint(run, TOOLS), strict=True))
    L = 8
    assert f["steps"] == pytest.approx(math.log1p(L))
    assert f["max_depth"] == 3
    # distinct (action, tool): llm, tool:search, retrieve, handoff:billing, tool:weather, other
    assert f["branches"] == 6
    assert f["output_length"] == pytest.approx(math.log1p(999))
    assert f["output_complexity"] == pytest.approx(60 / 80)
    assert f["frac_llm"] == pytest.approx(2 / L)
    assert f["frac_tool"] == pytest.approx(3 / L)  # the unlisted tool counts here
    assert f["frac_retrieve"] == pytest.approx(1 / L)
    assert f["frac_delegate"] == pytest.approx(1 / L)
    assert f["any_error"] == 1.0
    assert f["recovery_rate"] == 1.0
    assert f["total_tokens"] == pytest.approx(math.log1p(380))
    assert f["mean_step_tokens"] == pytest.approx(math.log1p(380 / L))
    assert f["duration"] == pytest.approx(math.log1p(3.0))
    assert f["tool:search"] == pytest.approx(2 / L)
    assert f["tool:calc"] == 0.0 and f["tool:lookup"] == 0.0


def test_recovery_rate_counts_only_later_successes_of_the_same_tool() -> None:
    steps = [
        Step(Action.TOOL, tool="calc"),  # success BEFORE the error: no recovery
        Step(Action.TOOL, tool="calc", error=True),
        Step(Action.TOOL, tool="search", error=True),
        Step(Action.TOOL, tool="lookup"),  # other tool: no recovery
        Step(Action.TOOL, tool="search"),  # recovers search
    ]
    f = fingerprint(_run(steps), TOOLS)
    assert f[10] == pytest.approx(0.5)
    assert fingerprint(_run([Step(Action.LLM)]), TOOLS)[10] == 0.0


def test_root_error_sets_any_error_without_steps_erroring() -> None:
    assert fingerprint(_run([Step(Action.LLM)], error=True), TOOLS)[9] == 1.0
    assert fingerprint(_run([Step(Action.LLM)]), TOOLS)[9] == 0.0


def test_tool_swap_with_identical_counts_changes_only_tool_columns() -> None:
    def mk(tool: str) -> Run:
        return _run(
            [
                Step(Action.LLM, output_tokens=5),
                Step(Action.TOOL, tool=tool),
                Step(Action.TOOL, tool=tool),
                Step(Action.LLM, output_tokens=5),
            ]
        )

    fa, fb = fingerprint(mk("search"), TOOLS), fingerprint(mk("lookup"), TOOLS)
    np.testing.assert_array_equal(fa[:14], fb[:14])  # the paper's fixed vector is blind
    assert fa[14 + TOOLS.index("search")] == 0.5 and fa[14 + TOOLS.index("lookup")] == 0.0
    assert fb[14 + TOOLS.index("lookup")] == 0.5 and fb[14 + TOOLS.index("search")] == 0.0


def test_empty_run_is_finite_and_zero_where_undefined() -> None:
    run = _run([], output_length=0, start_ns=5, end_ns=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            f = fingerprint(run, TOOLS)
            m = fingerprint_matrix([run, run], TOOLS)
    assert np.all(np.isfinite(f)) and np.all(f == 0.0)
    assert m.shape == (2, 17) and np.all(m == 0.0)
    assert fingerprint(_run([], error=True), [])[9] == 1.0


def test_negative_clock_skew_gives_zero_duration() -> None:
    f = fingerprint(_run([Step(Action.LLM)], start_ns=10, end_ns=5), [])
    assert f[13] == 0.0


def test_deterministic_and_matrix_matches_rows() -> None:
    runs_a = simulate_runs(40, np.random.default_rng(11))
    runs_b = simulate_runs(40, np.random.default_rng(11))
    ma, mb = fingerprint_matrix(runs_a, TOOLS), fingerprint_matrix(runs_b, TOOLS)
    np.testing.assert_array_equal(ma, mb)
    np.testing.assert_array_equal(ma, np.vstack([fingerprint(r, TOOLS) for r in runs_a]))
    np.testing.assert_array_equal(fingerprint(runs_a[3], TOOLS), fingerprint(runs_a[3], TOOLS))
    # A different seed gives different runs (the simulator is not degenerate).
    assert not np.array_equal(
        ma, fingerprint_matrix(simulate_runs(40, np.random.default_rng(12)), TOOLS)
    )


def test_fraction_invariants_on_simulated_runs() -> None:
    m = fingerprint_matrix(simulate_runs(300, np.random.default_rng(3)), TOOLS)
    shares = m[:, 5:9].sum(axis=1)
    assert np.all(shares <= 1.0 + 1e-12)
    # tool columns sum to frac_tool when every called tool is in the inventory
    np.testing.assert_allclose(m[:, 14:].sum(axis=1), m[:, 6], atol=1e-12)
    assert np.all((m[:, 4] >= 0) & (m[:, 4] <= 1))


def test_bad_inventories_are_rejected_with_a_hint() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        feature_names(["a", "a"])
    with pytest.raises(ValueError, match="wrap a single tool"):
        fingerprint(_run([]), "search")
