"""The realistic validation world itself: seeded, over-dispersed, correlated, calibrated.

Each expected value is written down from the generative model of tests/realworld/world.py;
Monte Carlo tolerances are about 4 standard errors unless said otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.baseline import build_baseline
from assaywatch.analyzers.fingerprint import FIXED_FEATURES, fingerprint_matrix
from assaywatch.analyzers.model import Action
from tests.realworld._compat import DetectorConfig, Engine, FastEngine
from tests.realworld.measure import top_decile_share
from tests.realworld.world import (
    CHANGES,
    Change,
    gaussian_world,
    realistic_world,
    swap_mahalanobis,
)

WORLD = realistic_world()
N = 20_000
IDX = {name: i for i, name in enumerate(FIXED_FEATURES)}


@pytest.fixture(scope="module")
def refund_runs() -> list:
    return WORLD.runs(N, np.random.default_rng(101), scenario=0)


def test_same_seed_same_runs() -> None:
    a = WORLD.runs(50, np.random.default_rng(5), scenario=1)
    b = WORLD.runs(50, np.random.default_rng(5), scenario=1)
    tools = sorted(WORLD.scenario(1).tool_names)
    assert np.array_equal(fingerprint_matrix(a, tools), fingerprint_matrix(b, tools))
    assert [r.outcome for r in a] == [r.outcome for r in b]
    assert len({r.run_id for r in a}) == 50


def test_tool_calls_are_over_dispersed(refund_runs: list) -> None:
    # NB(size 2) with a mean of 2.5 rounds, mixed over the difficulty: variance
    # 2.5 + 2.5^2 / 2 + more = about 6.7 against a Poisson's 2.5; retries add a little
    calls = np.array([sum(s.action is Action.TOOL for s in r.steps) for r in refund_runs])
    assert 2.4 < calls.mean() < 2.8
    assert calls.var() > 2.0 * calls.mean()


def test_difficulty_correlates_steps_tokens_duration_and_outcome(refund_runs: list) -> None:
    steps = np.array([len(r.steps) for r in refund_runs], dtype=float)
    tokens = np.array([r.total_tokens for r in refund_runs], dtype=float)
    duration = np.array([r.duration_s for r in refund_runs])
    passed = np.array([r.outcome.value == "pass" for r in refund_runs], dtype=float)
    assert np.corrcoef(steps, tokens)[0, 1] > 0.3
    assert np.corrcoef(steps, duration)[0, 1] > 0.3
    # hard runs take more steps and fail more often: the outcome is not independent
    assert np.corrcoef(steps, passed)[0, 1] < -0.05


def test_pass_rate_is_calibrated(refund_runs: list) -> None:
    se = math.sqrt(0.9 * 0.1 / N)
    p = np.mean([r.outcome.value == "pass" for r in refund_runs])
    assert abs(p - 0.9) < 4 * se
    changed = WORLD.sample(N, np.random.default_rng(102), Change.pass_drop(0.1), scenario=0)
    assert abs(changed.passed.mean() - 0.8) < 4 * math.sqrt(0.8 * 0.2 / N)


def test_timeouts_errors_and_handoffs_are_rare_but_present(refund_runs: list) -> None:
    x = fingerprint_matrix(refund_runs, sorted(WORLD.scenario(0).tool_names))
    any_error = x[:, IDX["any_error"]].mean()
    assert 0.02 < any_error < 0.15
    assert 0.01 < (x[:, IDX["max_depth"]] == 2).mean() < 0.08  # handoffs to a sub-agent
    b = WORLD.sample(N, np.random.default_rng(103), scenario=0)
    capped = b.r_lat1 >= b.r_med * WORLD.scenario(0).timeout_mult * (1 - 1e-12)
    # P(log-normal sigma 0.8 above 8x its median) = 1 - Phi(ln 8 / 0.8) = 0.0047
    expected = stats.norm.sf(math.log(8) / 0.8)
    assert abs(capped.mean() - expected) < 4 * math.sqrt(expected / b.r_lat1.size)
    assert b.r_err1[capped].all()


def test_tool_swap_is_sized_to_mahalanobis_046() -> None:
    for i in (0, 3):
        d = swap_mahalanobis(WORLD.scenario(i), n=15_000, seed=7)
        assert abs(d - 0.46) < 0.046, (WORLD.scenario(i).name, d)


def test_latency_change_moves_log_duration_by_about_log_13() -> None:
    t = [fingerprint_matrix(WORLD.runs(5_000, np.random.default_rng(104), ch, scenario=0),
                            sorted(WORLD.scenario(0).tool_names))[:, IDX["duration"]]
         for ch in (None, Change.latency(1.3))]
    # same seed: the same runs, every latency x1.3 (log1p and the gaps make it a bit less)
    shift = float(np.mean(t[1] - t[0]))
    assert 0.2 < shift < math.log(1.3) + 0.01


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_oracle_llr_signs_and_bernoulli_value(name: str) -> None:
    ch = CHANGES[name]
    rng = np.random.default_rng(105)
    l0 = WORLD.sample(N, rng, None, scenario=1).llr(ch)
    l1 = WORLD.sample(N, rng, ch, scenario=1).llr(ch)
    # -KL(p0 || p1) < 0 in control, KL(p1 || p0) > 0 after the change
    assert l0.mean() < 0 < l1.mean()
    if name == "pass_rate":
        exact = 0.9 * math.log(0.8 / 0.9) + 0.1 * math.log(0.2 / 0.1)
        assert abs(l0.mean() - exact) < 4 * l0.std() / math.sqrt(N)


def test_gaussian_world_has_fixed_structure_and_symmetric_features() -> None:
    g = gaussian_world()
    runs = g.runs(5_000, np.random.default_rng(106))
    x = fingerprint_matrix(runs, ["search"])
    assert np.all(x[:, IDX["steps"]] == math.log1p(3))
    assert np.all(x[:, IDX["any_error"]] == 0)
    for f in ("total_tokens", "duration", "output_length"):
        assert abs(stats.skew(x[:, IDX[f]])) < 0.3, f
    assert abs(np.mean([r.outcome.value == "pass" for r in runs]) - 0.9) < 0.02


def test_fast_engine_raises_the_same_alarms_as_the_engine() -> None:
    rng = np.random.default_rng(107)
    base = build_baseline(WORLD.runs(200, rng, scenario=0))
    runs = WORLD.runs(150, rng, scenario=0) + WORLD.runs(250, rng, Change.tool_swap(1.0),
                                                          scenario=0)
    got = []
    for cls in (Engine, FastEngine):
        eng = cls(DetectorConfig(arl0=500.0), [base])
        got.append([(e.detector, e.run_index) for r in runs for e in eng.process(r)])
    assert got[0] == got[1] and got[0]


def test_top_decile_share() -> None:
    assert top_decile_share([1] * 10) == pytest.approx(0.1)
    assert top_decile_share([10] + [0] * 19) == 1.0
    assert top_decile_share([5, 5] + [0] * 18) == pytest.approx(1.0)
