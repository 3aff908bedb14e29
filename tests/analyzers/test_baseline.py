from __future__ import annotations

import json

import numpy as np
import pytest

from assaywatch.analyzers.baseline import (
    SCHEMA_VERSION,
    Baseline,
    BaselineBuilder,
    build_baseline,
)
from assaywatch.analyzers.baseline_file import baselines_from_json, baselines_to_json
from assaywatch.analyzers.fingerprint import feature_names, fingerprint_matrix
from assaywatch.analyzers.model import Action, Outcome, Run, Step, StreamKey
from tests.analyzers.simagent import DEFAULT_KEY, simulate_runs

TOOLS = ["calc", "lookup", "search"]


def test_welford_mean_and_cov_equal_numpy() -> None:
    runs = simulate_runs(500, np.random.default_rng(5))
    b = build_baseline(runs, tools=TOOLS, tool_source="config")
    x = fingerprint_matrix(runs, TOOLS)
    np.testing.assert_allclose(b.mean, x.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.cov, np.cov(x, rowvar=False, ddof=1), rtol=1e-10, atol=1e-12)
    assert b.n_runs == 500 and b.feature_names == tuple(feature_names(TOOLS))


def test_observed_inventory_growing_columns_is_exact() -> None:
    rng = np.random.default_rng(6)
    early = simulate_runs(60, rng, tool_weights={"search": 0.6, "lookup": 0.4})
    late = simulate_runs(
        90, rng, tool_weights={"search": 0.3, "lookup": 0.3, "calc": 0.2, "zeta": 0.2}
    )
    runs = early + late
    builder = BaselineBuilder(DEFAULT_KEY)
    builder.add_many(runs)
    b = builder.freeze()
    assert b.tool_inventory_source == "observed"
    assert b.tools == ("calc", "lookup", "search", "zeta")  # sorted at freeze
    assert "tool" in b.coverage().not_measured  # an observed inventory covers itself
    x = fingerprint_matrix(runs, list(b.tools))
    np.testing.assert_allclose(b.mean, x.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.cov, np.cov(x, rowvar=False), rtol=1e-10, atol=1e-12)


def test_fixed_inventory_ignores_unlisted_tools_in_columns_but_counts_them() -> None:
    runs = simulate_runs(50, np.random.default_rng(7), tool_weights={"search": 0.5, "web": 0.5})
    b = build_baseline(runs, tools=["search"], tool_source="definitions")
    assert b.tools == ("search",) and len(b.mean) == 15
    assert b.tool_counts["web"] > 0
    cov = b.coverage()
    assert cov.tool == 1.0 and cov.unlisted_tools == ("web",)
    assert cov.tool_inventory_source == "definitions"


def _edge_runs() -> list[Run]:
    def run(i: int, steps: list[Step], outcome: Outcome) -> Run:
        return Run(
            f"{i:032x}",
            f"{i:016x}",
            DEFAULT_KEY,
            steps=steps,
            outcome=outcome,
            models=("m1",) if i % 2 else ("m2",),
            start_ns=1000 + i,
        )

    a = [Step(Action.LLM), Step(Action.TOOL, tool="search"), Step(Action.LLM)]
    b = [Step(Action.LLM), Step(Action.TOOL, tool="calc", error=True)]
    return [
        run(1, a, Outcome.PASS),
        run(2, a, Outcome.FAIL),
        run(3, b, Outcome.UNKNOWN),
        run(0, [], Outcome.PASS),
    ]


def test_counts_paths_states_models_and_times() -> None:
    b = build_baseline(_edge_runs(), tools=TOOLS)
    assert (b.n_runs, b.passes, b.fails, b.unknown) == (4, 2, 1, 1)
    assert b.pass_rate == pytest.approx(2 / 3)
    assert b.path_counts == {"llm>tool:search>llm": 2, "llm>tool:calc": 1, "": 1}
    assert b.states == tuple(
        sorted({"^>llm", "llm>tool:search", "tool:search>llm", "llm>tool:calc!"})
    )
    assert b.models == {"m1": 2, "m2": 2}
    assert (b.first_start_ns, b.last_start_ns) == (1000, 1003)


def test_json_round_trip_is_exact_and_id_stable() -> None:
    runs = simulate_runs(120, np.random.default_rng(8))
    b = build_baseline(runs, tools=TOOLS, source="unit test")
    text = json.dumps(b.to_dict())
    b2 = Baseline.from_dict(json.loads(text))
    assert b2.baseline_id == b.baseline_id and len(b.baseline_id) == 16
    assert b2.to_dict() == b.to_dict()
    np.testing.assert_array_equal(b2.mean, b.mean)  # bit-exact, not approximately
    np.testing.assert_array_equal(b2.cov, b.cov)
    other = build_baseline(runs[:-1], tools=TOOLS, source="unit test")
    assert other.baseline_id != b.baseline_id


def test_multi_stream_file_round_trip() -> None:
    rng = np.random.default_rng(9)
    k2 = StreamKey("other-agent", "2.0", "")
    b1 = build_baseline(simulate_runs(30, rng), tools=TOOLS)
    b2 = build_baseline(simulate_runs(30, rng, key=k2))
    loaded = baselines_from_json(baselines_to_json([b1, b2]))
    assert [x.key for x in loaded] == [DEFAULT_KEY, k2]
    assert [x.baseline_id for x in loaded] == [b1.baseline_id, b2.baseline_id]
    assert json.loads(baselines_to_json([b1]))["schema_version"] == SCHEMA_VERSION
    # a single baseline object is accepted too
    assert baselines_from_json(json.dumps(b1.to_dict()))[0].baseline_id == b1.baseline_id
    with pytest.raises(ValueError, match="both for stream"):
        baselines_from_json(baselines_to_json([b1, b1]))


def test_unknown_schema_version_is_rejected_with_what_to_do() -> None:
    d = build_baseline(simulate_runs(10, np.random.default_rng(1))).to_dict()
    d["schema_version"] = 2
    with pytest.raises(ValueError, match=r"schema_version 2 .*reads version 1.*rebuild"):
        Baseline.from_dict(d, "b.json")
    with pytest.raises(ValueError, match="file schema_version 7"):
        baselines_from_json(json.dumps({"schema_version": 7, "baselines": []}))
    with pytest.raises(ValueError, match="not valid JSON"):
        baselines_from_json("{nope")


def test_edited_content_is_detected_and_missing_fields_named() -> None:
    d = build_baseline(simulate_runs(10, np.random.default_rng(1))).to_dict()
    d["passes"] += 1
    with pytest.raises(ValueError, match="does not match its content"):
        Baseline.from_dict(d)
    del d["baseline_id"]
    assert Baseline.from_dict(d).passes == d["passes"]
    del d["cov"]
    with pytest.raises(ValueError, match="missing the field 'cov'"):
        Baseline.from_dict(d)


def test_arrays_are_read_only() -> None:
    b = build_baseline(simulate_runs(10, np.random.default_rng(1)))
    with pytest.raises(ValueError):
        b.mean[0] = 1.0


def test_builder_rejects_other_streams_and_bad_sources() -> None:
    builder = BaselineBuilder(StreamKey("x"))
    with pytest.raises(ValueError, match="one BaselineBuilder per stream"):
        builder.add(simulate_runs(1, np.random.default_rng(1))[0])
    with pytest.raises(ValueError, match="tool_source"):
        BaselineBuilder(StreamKey("x"), tools=["a"], tool_source="guess")
    with pytest.raises(ValueError, match="needs a tools list"):
        BaselineBuilder(StreamKey("x"), tool_source="config")


def test_small_and_empty_builders_freeze() -> None:
    b0 = BaselineBuilder(DEFAULT_KEY, tools=TOOLS).freeze()
    assert b0.n_runs == 0 and b0.pass_rate is None and not b0.cov.any()
    b1 = build_baseline(simulate_runs(1, np.random.default_rng(2)), tools=TOOLS)
    assert b1.n_runs == 1 and not b1.cov.any()


def test_memory_is_bounded_by_the_distinct_cap() -> None:
    builder = BaselineBuilder(DEFAULT_KEY, tools=TOOLS, max_distinct=5)
    builder.add_many(simulate_runs(300, np.random.default_rng(4), tool_calls_mean=4))
    b = builder.freeze()
    assert len(b.path_counts) == 5 and b.paths_dropped > 0
    assert sum(b.path_counts.values()) + b.paths_dropped == 300
    assert len(b.states) == 5 and b.states_dropped > 0
