"""Trace-level mutation testing: statistically decided kills, the no-op control, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.model import Outcome, Run
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.offline.gate import GatePolicy
from assaywatch.monitor.offline.mutate import (
    Mutant,
    _drop_tool,
    default_mutants,
    mutate_runs,
    mutation_test,
)
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.pipeline.runs import REASON_KEY
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.analyzers.simagent import simulate_runs
from tests.e2e.otel_agent import AgentBehaviour, sdk_runs

NOOP = [m for m in default_mutants([]) if m.control]


@pytest.fixture(scope="module")
def pool() -> list[Run]:
    """3,000 simulated runs; each repetition below draws 300 of them without replacement
    in random order, so its two halves are exchangeable samples of one distribution (the
    finite-population correction, 300 of 3,000, only makes the tests more conservative)."""
    return simulate_runs(3_000, np.random.default_rng(77))


def draw(pool: list[Run], rng: np.random.Generator, n: int = 300) -> list[Run]:
    return [pool[int(i)] for i in rng.choice(len(pool), size=n, replace=False)]


def test_noop_is_killed_by_the_gate_at_most_at_alpha(pool: list[Run]) -> None:
    """The released code "killed" a no-op 31% of the time (one run per side). Here the kill
    is a Holm-adjusted test at alpha = 0.05: over 120 seeded repetitions the kill count
    must not exceed the binomial(120, 0.05) 99.9% quantile (14)."""
    rng = np.random.default_rng(31)
    reps = 120
    kills = sum(mutation_test(draw(pool, rng), NOOP, methods=("gate",), seed=i)
                .control_killed("gate") for i in range(reps))
    assert kills <= stats.binom.ppf(0.999, reps, GatePolicy().alpha), kills


def test_noop_is_rarely_killed_by_the_monitor(pool: list[Run]) -> None:
    """Monitor kills are alarms at ARL0 = 2,000 runs per stream (union of the detectors):
    over 150 monitored runs the CUSUM/Hotelling share is about 150 / 2,000 = 7.5%, and the
    SPRT adds at most its alpha = 0.01 per decision cycle (a few cycles). 40 repetitions;
    the assertion allows 10 kills (25%) -- still far from what an unstatistical kill rule
    gives -- because the SPRT's share is only bounded, not known exactly."""
    rng = np.random.default_rng(32)
    cfg = DetectorConfig(arl0=2_000.0)
    reps = 40
    kills = sum(mutation_test(draw(pool, rng), NOOP, methods=("monitor",), detectors=cfg,
                              seed=i).control_killed("monitor") for i in range(reps))
    assert kills <= 10, kills


def test_drop_a_tool_and_inject_errors_are_killed_by_both_methods(pool: list[Run]) -> None:
    rng = np.random.default_rng(33)
    for rep in range(3):
        runs = draw(pool, rng, 400)
        report = mutation_test(runs, seed=rep)
        by = {r.name: r for r in report.results}
        assert {"drop_tool:search", "drop_tool:lookup", "drop_tool:calc", "inject_errors",
                "swap_model", "truncate_outputs", "reorder_steps", "noop"} <= set(by)
        for name in ("drop_tool:search", "drop_tool:lookup", "drop_tool:calc",
                     "inject_errors"):
            assert by[name].killed == {"gate": True, "monitor": True}, by[name].evidence
        assert not report.control_killed("gate")
        k, n = report.score("gate")
        assert n == len(by) - 1 and k >= 4


def test_equivalent_mutants_are_excluded_from_the_score(pool: list[Run]) -> None:
    runs = pool[:200]
    never = Mutant("drop_tool:never_called", "", _drop_tool("never_called"))
    search = Mutant("drop_tool:search", "", _drop_tool("search"))
    report = mutation_test(runs, [*NOOP, never, search], methods=("gate",))
    by = {r.name: r for r in report.results}
    never_res = by["drop_tool:never_called"]
    assert never_res.equivalent and never_res.changed_runs == 0 and never_res.killed == {}
    assert not by["noop"].equivalent  # the control is judged, though unchanged
    assert report.score("gate") == (1, 1)


def test_trace_decided_outcomes_are_re_decided(pool: list[Run]) -> None:
    rules = ContractRules.from_dict({"required_tools": ["search"]})
    runs = [r for r in pool[:300] if "search" in r.tools_used][:50]
    marked = []  # the pool is shared: mark copies only
    for r in runs:
        m = mutate_runs([r], NOOP[0], np.random.default_rng(0))[0][0]
        m.attributes[REASON_KEY] = "contract rules met"
        m.outcome = Outcome.PASS
        marked.append(m)
    dropped, changed = mutate_runs(marked, Mutant("d", "", _drop_tool("search")),
                                   np.random.default_rng(0), rules)
    assert changed == 50 and all(r.outcome is Outcome.FAIL for r in dropped)
    # an outcome from a recorded evaluation is kept
    for m in marked:
        m.attributes[REASON_KEY] = "evaluation passed=True"
    kept, _ = mutate_runs(marked, Mutant("d", "", _drop_tool("search")),
                          np.random.default_rng(0), rules)
    assert all(r.outcome is Outcome.PASS for r in kept)


def _write_spans(path: Path, n: int, seed: int) -> Path:
    write_otlp_json_lines(str(path), sdk_runs(n, AgentBehaviour(), seed,
                                              t0_ns=1_780_000_000_000_000_000))
    return path


def test_mutate_command_on_span_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans = _write_spans(tmp_path / "base.jsonl", 300, 5)
    code = main(["mutate", "--baseline", str(spans), "--method", "gate", "--json",
                 "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    by = {m["name"]: m for m in doc["mutants"]}
    assert set(by) >= {"drop_tool:lookup_order", "drop_tool:search_kb", "drop_tool:refund"}
    assert by["drop_tool:lookup_order"]["killed"]["gate"] is True
    assert by["inject_errors"]["killed"]["gate"] is True
    assert doc["scores"]["gate"]["control_killed"] is False
    assert doc["baseline_runs"] == doc["mutant_runs"] == 150
    code = main(["mutate", "--baseline", str(spans), "--method", "gate", "--min-score", "1"])
    text = capsys.readouterr().out
    assert code == 1 and "mutation score" in text  # swap_model survives: score < 1
    bad = main(["mutate", "--baseline", str(spans), "--split", "1.5"])
    assert bad == 3 and "split" in capsys.readouterr().err
