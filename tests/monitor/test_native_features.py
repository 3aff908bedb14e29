"""The engine's one pass over a run's steps (``monitor/engine/features.py``, compiled in
native/) gives exactly what the statistics' own functions give: the fingerprint
(``analyzers.fingerprint.fingerprint``), the latency sums of the charted kinds
(``latency.stats_vector(latency.run_stats(run), kinds)``) and what the coverage tracker
counts (``coverage.path_key``, ``coverage.abstract_states``, the step models,
``Run.tools_used``), every float equal bit for bit (the sign of a zero included).

Generated runs cover what the realistic ones miss: every action, tools inside and outside
the inventory, ``None`` and empty tool names, repeated (action, tool) pairs with errors
before and after successes (the recovery rate), zero, negative, tiny, NaN and integer
latencies, models repeated or empty, runs without steps, and layouts with and without
latency kinds (an unnamed ``tool:`` kind among them). Runs outside the compiled pass's
domain (counts past 2^53, a float where a count belongs, an action that is not an
``Action`` member) fall back to the Python functions.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assaywatch.analyzers import coverage
from assaywatch.analyzers.coverage import MAX_PATH_CHARS, CoverageTracker
from assaywatch.analyzers.detectors import latency
from assaywatch.analyzers.fingerprint import fingerprint
from assaywatch.analyzers.model import Action, Run, Step, StreamKey
from assaywatch.monitor.engine.features import RunFeatures
from tests.monitor.decoders import NATIVE_INSTALLED

pytestmark = pytest.mark.skipif(
    not NATIVE_INSTALLED,
    reason="the compiled module is not installed (pip install ./native, needs Rust)")

TOOLS = ("lookup", "refund", "search")
LATENCIES = [0.0, -1.0, 1e-6, 1e-4, 2, math.nan, 0.37, 12.5, 1e-4 * 1.5]


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64).tolist()


def expected(run: Run, tools: tuple[str, ...], kinds: tuple[str, ...]
             ) -> tuple[np.ndarray, np.ndarray]:
    """The Python functions' fingerprint and chart input (the specification)."""
    fp = fingerprint(run, tools)
    if not kinds:
        return fp, fp
    return fp, np.concatenate([fp, latency.stats_vector(latency.run_stats(run), kinds)])


def random_run(rng: random.Random, n_steps: int) -> Run:
    steps = []
    for _ in range(n_steps):
        action = rng.choice(list(Action))
        tool = rng.choice([None, "", "lookup", "refund", "search", "other", "λ-tool"])
        steps.append(Step(
            action=action, tool=tool, error=rng.random() < 0.25,
            input_tokens=rng.choice([0, 0, 1, 17, 250, 3000, 2**40]),
            output_tokens=rng.choice([0, 5, 120, 999]),
            latency_s=rng.choice(LATENCIES + [rng.lognormvariate(-1, 1.5)]),
            depth=rng.choice([0, 1, 1, 2, 3, 7]),
            model=rng.choice([None, "", "gpt-a", "gpt-b", "claude"])))
    start = 1_700_000_000_000_000_000
    return Run("t" * 32, "s" * 16, StreamKey("agent"), steps=steps,
               output_length=rng.choice([0, -3, 40, 10**6]), start_ns=start,
               end_ns=start + rng.choice([0, 1, 250_000_000, 9_000_000_000]),
               error=rng.random() < 0.1, models=tuple(rng.sample(["gpt-a", "m"], 1)))


LAYOUTS = [
    ((), ()),
    (TOOLS, ()),
    (TOOLS, ("llm", "tool:lookup", "tool:search", "retrieve")),
    (("search",), ("tool:search", "tool:", "llm")),
    ((), ("retrieve", "tool:other")),
]


def check(run: Run, tools: tuple[str, ...], kinds: tuple[str, ...]) -> None:
    features = RunFeatures(tools, kinds)
    fp, x, parts = features(run)
    want_fp, want_x = expected(run, tools, kinds)
    assert parts is not None, "the compiled pass declined a run in its domain"
    assert _bits(fp) == _bits(want_fp)
    assert _bits(x) == _bits(want_x)
    assert x.shape == (features.size,)
    assert parts.path == coverage.path_key(run)
    assert len(set(parts.states)) == len(parts.states)
    assert set(parts.states) == coverage.abstract_states(run)
    assert sorted(parts.step_models) == sorted({s.model for s in run.steps if s.model})
    assert list(parts.tools_used) == run.tools_used


@pytest.mark.parametrize("tools,kinds", LAYOUTS)
def test_generated_runs_equal_the_python_functions_bit_for_bit(
        tools: tuple[str, ...], kinds: tuple[str, ...]) -> None:
    rng = random.Random(7)
    for i in range(400):
        check(random_run(rng, rng.choice([0, 1, 2, 5, 9, 20, 45])), tools, kinds)
        assert i >= 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(list(Action)),
                          st.sampled_from([None, "", "lookup", "search", "x"]),
                          st.booleans(), st.integers(0, 10**6), st.integers(-2, 10**6),
                          st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(-1, 9)), max_size=40),
       st.integers(-5, 10**9), st.integers(0, 10**12), st.booleans())
def test_any_run_in_the_domain_equals_the_python_functions(steps, output_length, dur_ns,
                                                           root_error) -> None:
    run = Run("t", "s", StreamKey("a"), output_length=output_length, start_ns=0,
              end_ns=dur_ns, error=root_error, steps=[
                  Step(action=a, tool=t, error=e, input_tokens=i, output_tokens=o,
                       latency_s=lat, depth=d) for a, t, e, i, o, lat, d in steps])
    check(run, TOOLS, ("llm", "tool:lookup", "retrieve", "tool:"))


def test_a_run_without_steps_has_the_roots_output_duration_and_error() -> None:
    run = Run("t", "s", StreamKey("a"), output_length=99, start_ns=0, end_ns=2 * 10**9,
              error=True)
    fp, x, parts = RunFeatures(TOOLS, ("llm",))(run)
    assert parts is not None and parts.path == "" and list(parts.states) == []
    # log1p(99) in the output length, log1p(2 s) in the duration, the root's error
    assert fp[3] == np.log1p(99.0) and fp[13] == np.log1p(2.0) and fp[9] == 1.0
    assert list(x[len(fp):]) == [0.0] * latency.N_STATS
    check(run, TOOLS, ("llm",))


def test_recovery_counts_a_failed_call_that_succeeds_later() -> None:
    steps = [Step(Action.TOOL, tool="search", error=True),
             Step(Action.TOOL, tool="lookup", error=True),
             Step(Action.TOOL, tool="search"),
             Step(Action.LLM, error=True)]
    run = Run("t", "s", StreamKey("a"), steps=steps)
    fp, _, _ = RunFeatures(TOOLS, ())(run)
    # three errors, one (search) retried with success afterwards: recovery 1/3;
    # pairs: (tool, search), (tool, lookup), (llm, None)
    assert fp[10] == 1 / 3 and fp[2] == 3.0 and fp[9] == 1.0
    check(run, TOOLS, ())


def test_a_long_path_is_kept_as_its_digest() -> None:
    steps = [Step(Action.TOOL, tool=f"tool{i:03d}") for i in range(60)]
    run = Run("t", "s", StreamKey("a"), steps=steps)
    _, _, parts = RunFeatures(TOOLS, ())(run)
    assert parts is not None and len(coverage.path_key(run)) < MAX_PATH_CHARS
    assert parts.path.startswith("#") and parts.path == coverage.path_key(run)
    check(run, TOOLS, ())


@pytest.mark.parametrize("step", [
    Step(Action.LLM, input_tokens=2**60),                 # past 2^53
    Step(Action.LLM, input_tokens=2**52, output_tokens=2**52 + 1),  # sum past 2^53
    Step(Action.LLM, output_tokens=3.0),                  # type: ignore[arg-type]
    Step("llm"),                                          # type: ignore[arg-type]
    Step(Action.TOOL, tool=5),                            # type: ignore[arg-type]
    Step(Action.LLM, model=7),                            # type: ignore[arg-type]
])
def test_runs_outside_the_compiled_domain_are_left_to_python(step: Step) -> None:
    run = Run("t", "s", StreamKey("a"), steps=[Step(Action.LLM), step])
    features = RunFeatures(TOOLS, ())
    try:
        want_fp, _ = expected(run, TOOLS, ())
    except Exception as exc:  # the Python functions' own error, unchanged
        with pytest.raises(type(exc)):
            features(run)
        return
    fp, _, parts = features(run)
    assert parts is None
    assert _bits(fp) == _bits(want_fp)


def test_a_tracker_fed_the_parts_counts_as_one_fed_the_runs() -> None:
    rng = random.Random(3)
    runs = [random_run(rng, rng.choice([0, 3, 8, 30])) for _ in range(300)]
    features = RunFeatures(TOOLS, ())
    by_parts = CoverageTracker(tools=list(TOOLS), max_distinct=40)
    by_runs = CoverageTracker(tools=list(TOOLS), max_distinct=40)
    for run in runs:
        by_parts.add(run, features(run)[2])
        by_runs.add(run)
    assert by_parts.report() == by_runs.report()
    assert by_parts.tools_used == by_runs.tools_used
    assert by_parts.path_counts == by_runs.path_counts
    assert by_parts.models == by_runs.models
    assert by_parts.paths_dropped == by_runs.paths_dropped
    assert by_parts.states_dropped == by_runs.states_dropped


@pytest.mark.parametrize("tools,kinds", LAYOUTS)
def test_many_runs_at_once_equal_one_at_a_time(tools: tuple[str, ...],
                                               kinds: tuple[str, ...]) -> None:
    """``RunFeatures.many`` (one numpy pass over a batch's logarithms, as the engine's
    prepare uses it) gives each run the values of a call on it alone, bit for bit; a run
    the compiled pass declines (a count past 2^53) is computed by the Python functions in
    its place."""
    rng = random.Random(11)
    runs = [random_run(rng, rng.choice([0, 1, 4, 9, 30])) for _ in range(120)]
    runs[7].steps.append(Step(Action.LLM, input_tokens=2**60))
    features = RunFeatures(tools, kinds)
    batch = features.many(runs)
    assert len(batch) == len(runs)
    for run, (fp, x, parts) in zip(runs, batch, strict=True):
        fp1, x1, parts1 = features(run)
        assert _bits(fp) == _bits(fp1) and _bits(x) == _bits(x1)
        assert parts == parts1
    assert batch[7][2] is None and all(b[2] is not None for i, b in enumerate(batch) if i != 7)
