"""The gate keeps its stated error rates on realistic data (issue 12, the gate's part).

Three figures, each on the realistic world (four heterogeneous scenarios, counts, rare
events, outcome tied to the fingerprint) and on the near-Gaussian contrast world, with the
gate's own decision code (tests/realworld/gate_measure.py) and the default policy
(alpha 0.05, beta 0.1, delta 0.1), at the planned n for 20 streams (a Holm family of 40
tests): 481 per arm.

1. One of 20 scenarios regressed by exactly delta (0.9 -> 0.8): P(deploy) <= beta.
2. 20 unchanged scenarios: P(deploy) >= 1 - alpha - 0.02.
3. One unchanged scenario, baseline 2,000 vs candidate 50 (frozen baseline: the
   fingerprint test is calibrated by the candidate bootstrap): P(false block or false
   manual review, i.e. some test rejected) <= alpha.

Repetitions and tolerances. A rate estimated from R seeded repetitions has binomial
standard error sqrt(p (1 - p) / R): with R = 150, 0.024 at p = 0.1 and 0.021 at p = 0.93;
with R = 200, 0.015 at p = 0.05. Each claim is asserted at its bound plus 2 SE (a true rate
exactly at the bound passes with probability 0.98; measured rates sit well inside, see
analyzers/README.md), and, where an exact computation exists, the simulated rate is
checked against it within 3 SE: the regressed stream's non-inferiority pass probability
(the deploy rate's exact upper bound, a sum of binomials) and the unchanged streams'.
Runtime: about 40 s in all on 2 cores (pools ~8 s, built once per world).
"""

from __future__ import annotations

import math

import pytest

from assaywatch.analyzers.verdicts import noninferiority_power, planned_sample_size
from assaywatch.monitor.offline.gate import GatePolicy
from tests.realworld.gate_measure import Pools, gate_rates, make_pools
from tests.realworld.world import gaussian_world, realistic_world

pytestmark = pytest.mark.slow  # seeded Monte Carlo, tens of seconds

POLICY = GatePolicy()
ALPHA, BETA, DELTA = POLICY.alpha, POLICY.beta, POLICY.delta
STREAMS = 20
N = planned_sample_size(0.9, DELTA, ALPHA, BETA, "fisher", tests=2 * STREAMS)
REPS, REPS_SMALL = 150, 200
WORLDS = {"realistic": realistic_world, "gaussian": gaussian_world}
_POOLS: dict[str, Pools] = {}


def se(p: float, reps: int) -> float:
    return math.sqrt(p * (1 - p) / reps)


@pytest.fixture(params=sorted(WORLDS))
def pools(request: pytest.FixtureRequest) -> Pools:
    name = request.param
    if name not in _POOLS:  # 5,000 runs per scenario and change, exact pass rates
        _POOLS[name] = make_pools(WORLDS[name](), 5_000, seed=1212)
    return _POOLS[name]


def test_planned_n_is_the_holm_family_design() -> None:
    assert N == 481


def test_one_regressed_scenario_deploys_at_most_beta(pools: Pools) -> None:
    g = gate_rates(pools, STREAMS, N, N, regressed=1, reps=REPS, seed=31)
    exact = noninferiority_power(0.9, N, 0.8, N, DELTA, BETA)  # P(regressed stream passes)
    assert exact <= BETA + 0.002  # the score test's exact size at this n: 0.1006
    regressed_pass = g.regressed_pass / REPS
    assert abs(regressed_pass - exact) <= 3 * se(exact, REPS)
    # Deploying needs the regressed stream to pass: P(deploy) <= that, and <= beta.
    assert g.decisions["deploy"] <= g.regressed_pass
    assert g.p("deploy") <= BETA + 2 * se(BETA, REPS)
    # ... and a drop of exactly delta is blocked with about the planned power (the old
    # rule: about half the time).
    assert g.p("block") >= 1 - BETA - 3 * se(1 - BETA, REPS)


def test_unchanged_suite_deploys_at_least_one_minus_alpha(pools: Pools) -> None:
    g = gate_rates(pools, STREAMS, N, N, regressed=0, reps=REPS, seed=32)
    target = 1 - ALPHA - 0.02
    assert g.p("deploy") >= target - 2 * se(target, REPS)
    # What holds an unchanged suite back is a Holm rejection (<= alpha), not a lack of
    # runs: exactly, 20 streams fail to show non-inferiority with probability <= 0.002.
    miss = STREAMS * (1 - noninferiority_power(0.9, N, 0.9, N, DELTA, BETA))
    assert miss <= 0.002
    assert g.rejected / REPS <= ALPHA + 2 * se(ALPHA, REPS)
    assert g.manual_for_runs / REPS <= miss + 3 * se(max(miss, 1 / REPS), REPS)


def test_big_baseline_small_candidate_keeps_false_positives_at_alpha(pools: Pools) -> None:
    g = gate_rates(pools, 1, 2_000, 50, regressed=0, reps=REPS_SMALL, seed=33, rotate=True)
    assert set(g.calibrations) == {"bootstrap"}  # unbalanced, frozen baseline
    assert g.rejected / REPS_SMALL <= ALPHA + 2 * se(ALPHA, REPS_SMALL)
    # The other manual reviews say "too few runs": 50 runs cannot show non-inferiority
    # reliably. Exactly: an unchanged candidate passes with probability ~0.755, and any
    # rule deploying it with probability 0.95 at n_c = 50 would deploy a regression of
    # delta far more often than beta (the Neyman-Pearson bound below).
    exact = noninferiority_power(0.9, 2_000, 0.9, 50, DELTA, BETA)
    assert abs(exact - 0.755) < 0.01
    assert abs(g.manual_for_runs / REPS_SMALL - (1 - exact)) <= 3 * se(1 - exact, REPS_SMALL)


def test_no_rule_can_have_both_rates_with_fifty_candidate_runs() -> None:
    # Even knowing p_b = 0.9 exactly, the most powerful test of p_c = 0.9 against 0.8 with
    # 50 runs that passes an unchanged candidate with probability >= 0.95 passes a
    # regressed one with probability >= 0.3: the gate's Inconclusive is the honest answer.
    from scipy import stats

    c = int(stats.binom.ppf(0.05, 50, 0.9))  # pass when k_c >= c
    while stats.binom.sf(c - 1, 50, 0.9) < 0.95:
        c -= 1
    assert stats.binom.sf(c - 1, 50, 0.8) > 0.3
