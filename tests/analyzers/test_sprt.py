"""SPRT and the safe warm start (SPEC 3.5, 7.5): class behaviour, exact and Monte Carlo
operating characteristics, SPEC's figures, and the warm start's error bounds."""

from __future__ import annotations

import doctest
import math
import pickle
import time

import numpy as np
import pytest
from scipy import stats

import assaywatch.analyzers.sprt as sprt_module
from assaywatch.analyzers.model import Verdict
from assaywatch.analyzers.sprt import (
    SPRT,
    WarmStartSPRT,
    boundaries,
    llr_steps,
    warm_start_llr,
)
from assaywatch.analyzers.sprt_operating import simulate_sprt, sprt_exact, wald_expected_n

THETA, DELTA, ALPHA, BETA = 0.9, 0.1, 0.05, 0.1
REPS = 20_000
GAMMA = (THETA, DELTA, ALPHA, BETA)


def test_increments_and_boundaries_follow_eq7_and_eq8() -> None:
    assert llr_steps(0.9, 0.1) == pytest.approx((math.log(0.8 / 0.9), math.log(0.2 / 0.1)))
    assert boundaries(0.05, 0.1) == pytest.approx((math.log(0.1 / 0.95), math.log(0.9 / 0.05)))
    test = SPRT(*GAMMA)
    assert (test.lower, test.upper) == boundaries(ALPHA, BETA)
    assert (test.theta, test.delta, test.alpha, test.beta, test.n_max) == (*GAMMA, None)


def test_constant_streams_decide_after_the_predicted_number_of_trials() -> None:
    sp, sf = llr_steps(THETA, DELTA)
    a, b = boundaries(ALPHA, BETA)
    passing, failing = SPRT(*GAMMA), SPRT(*GAMMA)
    while passing.decision is None:
        passing.update(True)
    while failing.decision is None:
        failing.update(False)
    assert passing.decision is Verdict.PASS and passing.n == math.ceil(a / sp)  # 20
    assert failing.decision is Verdict.FAIL and failing.n == math.ceil(b / sf)  # 5
    assert passing.llr == pytest.approx(passing.n * sp)


def test_truncation_ignoring_after_decision_and_reset() -> None:
    test = SPRT(*GAMMA, n_max=10)
    for i in range(12):
        test.update(i % 5 != 0)  # 80% pass: stays between the boundaries for 10 trials
    assert test.decision is Verdict.INCONCLUSIVE and test.n == 10 and test.n_ignored == 2
    llr = test.llr
    test.update(False)
    assert test.llr == llr and test.n == 10  # frozen once decided
    test.reset()
    assert (test.decision, test.n, test.llr, test.n_ignored) == (None, 0, 0.0, 0)


def test_validation_names_the_valid_values() -> None:
    with pytest.raises(ValueError, match="theta must lie strictly between 0 and 1"):
        SPRT(1.2, 0.1)
    with pytest.raises(ValueError, match="0 < delta < theta"):
        SPRT(0.3, 0.4)
    with pytest.raises(ValueError, match="alpha \\+ beta must be < 1"):
        SPRT(0.9, 0.1, 0.6, 0.5)
    with pytest.raises(ValueError, match="n_max must be None or an integer >= 1"):
        SPRT(0.9, 0.1, n_max=0)
    with pytest.raises(ValueError, match="inflation must be >= 1"):
        WarmStartSPRT(*GAMMA, None, 9, 10, True, inflation=0.5)
    with pytest.raises(ValueError, match="prior_passes <= prior_runs"):
        warm_start_llr(*GAMMA, 11, 10, True)


def test_repr_and_pickle_round_trip_keep_state() -> None:
    test = WarmStartSPRT(*GAMMA, 300, 45, 50, False)
    for passed in (True, False, True):
        test.update(passed)
    clone = pickle.loads(pickle.dumps(test))
    assert repr(clone) == repr(test) and "same_version=False" in repr(test)
    assert (clone.llr, clone.n, clone.llr0) == (test.llr, test.n, test.llr0)
    assert eval(repr(SPRT(*GAMMA, n_max=7)), {"SPRT": SPRT}).n_max == 7


def _replay(test: SPRT, uniforms: np.ndarray, p: float) -> tuple[int, int]:
    for u in uniforms:
        test.update(bool(u < p))
        if test.decision is not None:
            break
    code = {Verdict.FAIL: 1, Verdict.PASS: -1, Verdict.INCONCLUSIVE: 0, None: 0}[test.decision]
    return code, test.n


@pytest.mark.parametrize("llr0_case", ["cold", "warm"])
def test_vectorised_simulation_reproduces_the_class_exactly(llr0_case: str) -> None:
    # One chunk of width n_max: the simulation draws exactly rng.random((reps, n_max)).
    p, n_max, reps = 0.85, 128, 300
    make = (
        (lambda: SPRT(*GAMMA, n_max=n_max))
        if llr0_case == "cold"
        else (lambda: WarmStartSPRT(*GAMMA, n_max, 19, 20, True))
    )
    llr0 = make().llr
    sim = simulate_sprt(*GAMMA, p, reps, np.random.default_rng(5), n_max, llr0, chunk=n_max)
    uniforms = np.random.default_rng(5).random((reps, n_max))
    replayed = np.array([_replay(make(), row, p) for row in uniforms])
    assert np.array_equal(sim.decision, replayed[:, 0]) and np.array_equal(sim.n, replayed[:, 1])
    assert set(np.unique(sim.decision)) == {-1, 0, 1}  # all three outcomes exercised


def test_chunked_simulation_agrees_with_exact_operating_characteristics() -> None:
    # 20,000 replicates: 4 SE tolerances (rates SE <= 0.0036, mean-N SE from the sample sd).
    for p in (0.9, 0.85, 0.8):
        exact = sprt_exact(*GAMMA, p)
        sim = simulate_sprt(*GAMMA, p, REPS, np.random.default_rng(int(p * 100)), chunk=64)
        assert sim.undecided_rate == 0.0 and exact.fail + exact.pass_ == pytest.approx(1.0)
        assert abs(sim.fail_rate - exact.fail) <= 4 * math.sqrt(exact.fail * exact.pass_ / REPS)
        assert abs(sim.n.mean() - exact.mean_n) <= 4 * sim.n.std() / math.sqrt(REPS)
    truncated = sprt_exact(*GAMMA, 0.85, n_max=100)
    sim = simulate_sprt(*GAMMA, 0.85, REPS, np.random.default_rng(3), n_max=100)
    undecided = 1 - truncated.fail - truncated.pass_
    assert abs(sim.undecided_rate - undecided) <= 4 * math.sqrt(undecided * (1 - undecided) / REPS)
    assert sim.n.max() == 100


def test_spec_figures_type_one_power_and_mean_n() -> None:
    rng = np.random.default_rng(2026)
    simulate_sprt(*GAMMA, 0.9, 10, np.random.default_rng(0))  # warm-up, not timed
    start = time.process_time()  # CPU time: wall time is at the mercy of a loaded CI box
    h0 = simulate_sprt(*GAMMA, 0.9, REPS, rng)
    elapsed = time.process_time() - start
    h1 = simulate_sprt(*GAMMA, 0.8, REPS, rng)
    # SPEC's figures (Type I 0.033, power 0.893, mean N 56.5 / 59.3) are themselves Monte
    # Carlo estimates; the exact values (sprt_exact) are 0.0390, 0.9034, 56.88 / 59.26, as
    # if SPEC used ~2,000 replicates (SE 0.004, 0.007 and ~1.0 for mean N). Tolerance:
    # 3 x the combined SE of SPEC's and this 20,000-replicate estimate.
    assert h0.fail_rate == pytest.approx(0.033, abs=0.013)
    assert h1.fail_rate == pytest.approx(0.893, abs=0.021)
    assert h0.n.mean() == pytest.approx(56.5, abs=3.2)
    assert h1.n.mean() == pytest.approx(59.3, abs=3.2)
    # Against the exact values, this run's own 4 SE.
    assert h0.fail_rate == pytest.approx(0.0390, abs=0.0056)
    assert h1.fail_rate == pytest.approx(0.9034, abs=0.0084)
    assert h0.n.mean() == pytest.approx(56.88, abs=4 * h0.n.std() / math.sqrt(REPS))
    # The error rates respect Wald's bounds alpha/(1-beta) and beta/(1-alpha).
    assert h0.fail_rate <= ALPHA / (1 - BETA) and 1 - h1.fail_rate <= BETA / (1 - ALPHA) + 0.006
    assert elapsed < 1.0  # vectorised: 20,000 replicates well under a second


def test_wald_expected_sample_sizes_match_spec_erratum() -> None:
    n0, n1 = wald_expected_n(*GAMMA)
    assert (round(n0, 1), round(n1, 1)) == (54.4, 53.5)
    # Overshoot makes Wald's values underestimates of the exact ones.
    assert n0 < sprt_exact(*GAMMA, 0.9).mean_n and n1 < sprt_exact(*GAMMA, 0.8).mean_n


def test_warm_start_llr_is_the_discounted_prior_llr_within_the_caps() -> None:
    sp, sf = llr_steps(THETA, DELTA)
    assert warm_start_llr(*GAMMA, 1, 1, True) == pytest.approx(sp)  # uncapped: one pass
    assert warm_start_llr(*GAMMA, 3, 3, False, discount=0.5) == pytest.approx(1.5 * sp)
    assert warm_start_llr(*GAMMA, 30, 30, False, discount=0.0) == 0.0
    # Paper's Eq. 49 on 90/100: past the Pass boundary before any new trial (unsafe).
    raw = stats.beta.logpdf(0.8, 91, 11) - stats.beta.logpdf(0.9, 91, 11)
    assert raw == pytest.approx(90 * sp + 10 * sf) and raw < boundaries(ALPHA, BETA)[0]
    assert warm_start_llr(*GAMMA, 90, 100, True) == pytest.approx(-math.log(1.5 * 0.95))
    assert warm_start_llr(*GAMMA, 60, 100, True) == pytest.approx(math.log(1.5 * 0.9))
    assert warm_start_llr(*GAMMA, 90, 100, True, inflation=1.0) == 0.0
    # The cap bounds Wald's rigorous constants: alpha e^L/(1-beta), beta e^-L/(1-alpha).
    for k0 in (0, 50, 80, 95, 100):
        llr0 = warm_start_llr(*GAMMA, k0, 100, k0 % 2 == 0)
        assert ALPHA * math.exp(llr0) / (1 - BETA) <= 1.5 * ALPHA + 1e-12
        assert BETA * math.exp(-llr0) / (1 - ALPHA) <= 1.5 * BETA + 1e-12
        assert abs(llr0) <= math.log(1.5)  # SPEC's |Lambda_0| <= ln(inflation)


@pytest.mark.parametrize("k0,n0", [(0, 0), (1000, 1000), (0, 1000), (95, 100)])
def test_warm_start_never_decides_before_a_new_trial(k0: int, n0: int) -> None:
    for same in (True, False):
        test = WarmStartSPRT(*GAMMA, 500, k0, n0, same, inflation=1e6)  # no weight cap
        assert test.decision is None and test.n == 0
        assert test.lower < test.llr < test.upper
        test.update(k0 < n0 / 2)
        assert test.n == 1
        test.reset()
        assert test.llr == test.llr0 and test.decision is None


def _warm_fail_rate(p_true: float, llr0: np.ndarray | float, seed: int) -> float:
    return simulate_sprt(*GAMMA, p_true, REPS, np.random.default_rng(seed), 500, llr0).fail_rate


def test_warm_start_error_rates_with_same_version_priors() -> None:
    # Each replicate draws its own prior k0 of 100 runs from the true rate. 20,000
    # replicates: SE <= 0.0025 on these rates, tolerance 4 SE = 0.01.
    rng = np.random.default_rng(99)
    for p_true in (0.9, 0.8):
        k0 = rng.binomial(100, p_true, REPS)
        starts = {k: warm_start_llr(*GAMMA, int(k), 100, True) for k in np.unique(k0)}
        llr0 = np.array([starts[k] for k in k0])
        fail = _warm_fail_rate(p_true, llr0, seed=int(p_true * 10))
        if p_true == 0.9:
            assert fail <= 1.5 * ALPHA + 0.01
        else:
            assert fail >= 1 - 1.5 * BETA - 0.01


def test_warm_start_with_an_older_version_prior_keeps_error_rates() -> None:
    # Older, better version (95/100) when the truth fell to 0.8: power must hold.
    better = WarmStartSPRT(*GAMMA, 500, 95, 100, False)
    power = _warm_fail_rate(0.8, better.llr0, seed=1)
    assert power >= 1 - 1.5 * BETA - 0.01
    assert power == pytest.approx(sprt_exact(*GAMMA, 0.8, 500, better.llr0).fail, abs=0.01)
    # Older, worse version (75/100) when the truth is still 0.9: Type I must hold.
    worse = WarmStartSPRT(*GAMMA, 500, 75, 100, False)
    type_one = _warm_fail_rate(0.9, worse.llr0, seed=2)
    assert type_one <= 1.5 * ALPHA + 0.01
    # The paper's start for the same prior, Eq. 49 undiscounted, is past a: Pass at once.
    raw = stats.beta.logpdf(0.8, 96, 6) - stats.beta.logpdf(0.9, 96, 6)
    assert raw < better.lower < better.llr0


def test_docstring_examples_run() -> None:
    result = doctest.testmod(sprt_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0
