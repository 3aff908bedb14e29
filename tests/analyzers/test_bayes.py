"""Bayesian regression probability (SPEC 3.6): quadrature against a closed form and a
large seeded Monte Carlo sample; verdict thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from assaywatch.analyzers.bayes import bayesian_regression, regression_probability
from assaywatch.analyzers.model import Verdict


def prob_b_beats_c(a_b: int, b_b: float, a_c: float, b_c: float) -> float:
    """Closed form of P(p_b > p_c) for Beta posteriors with integer a_b (delta = 0).

    P = sum_{i<a_b} B(a_c + i, b_c + b_b) / ((b_b + i) B(1 + i, b_b) B(a_c, b_c)).
    """
    i = np.arange(a_b)
    terms = (
        special.betaln(a_c + i, b_c + b_b)
        - np.log(b_b + i)
        - special.betaln(1 + i, b_b)
        - special.betaln(a_c, b_c)
    )
    return float(np.exp(terms).sum())


@pytest.mark.parametrize(
    "k_b,n_b,k_c,n_c", [(9, 10, 6, 10), (45, 50, 40, 50), (180, 200, 185, 200), (3, 4, 0, 2)]
)
def test_delta_zero_matches_the_closed_form(k_b: int, n_b: int, k_c: int, n_c: int) -> None:
    result = bayesian_regression(k_b, n_b, k_c, n_c, delta=0.0)
    expected = prob_b_beats_c(1 + k_b, 1 + n_b - k_b, 1 + k_c, 1 + n_c - k_c)
    assert result.p_regression == pytest.approx(expected, abs=1e-8)
    assert result.posterior_b == (1 + k_b, 1 + n_b - k_b)


def test_identical_data_is_symmetric_at_delta_zero() -> None:
    assert bayesian_regression(70, 80, 70, 80, delta=0.0).p_regression == pytest.approx(
        0.5, abs=1e-9
    )


@pytest.mark.parametrize(
    "k_b,n_b,k_c,n_c,delta,a0,b0",
    [
        (90, 100, 75, 100, 0.1, 1.0, 1.0),
        (45, 50, 41, 50, 0.05, 0.5, 0.5),  # Jeffreys prior
        (4_500, 5_000, 3_950, 5_000, 0.1, 1.0, 1.0),  # needle posteriors, P_reg near 0.9
        (18, 20, 12, 20, 0.1, 9.2, 0.8),  # informative 92% prior
        (10, 10, 10, 10, 0.1, 1.0, 1.0),
    ],
)
def test_quadrature_agrees_with_large_monte_carlo(
    k_b: int, n_b: int, k_c: int, n_c: int, delta: float, a0: float, b0: float
) -> None:
    # 1,000,000 seeded joint posterior draws: SE = sqrt(P(1-P)/1e6) <= 5e-4; tolerance
    # 5 SE plus 2e-5 for probabilities so small that the SE itself is ~0.
    result = bayesian_regression(k_b, n_b, k_c, n_c, delta, a0=a0, b0=b0)
    rng = np.random.default_rng(k_b * 7 + k_c)
    size = 1_000_000
    p_b = rng.beta(*result.posterior_b, size)
    p_c = rng.beta(*result.posterior_c, size)
    mc = float(np.mean(p_c < p_b - delta))
    se = math.sqrt(mc * (1 - mc) / size)
    assert abs(result.p_regression - mc) <= 5 * se + 2e-5
    assert result.abs_error < 1e-6


def test_verdict_thresholds() -> None:
    fail = bayesian_regression(95, 100, 60, 100)
    assert fail.p_regression > 0.95 and fail.verdict is Verdict.FAIL
    ok = bayesian_regression(900, 1_000, 905, 1_000)
    assert ok.p_regression < 0.1 and ok.verdict is Verdict.PASS
    unsure = bayesian_regression(9, 10, 7, 10)
    assert 0.1 <= unsure.p_regression <= 0.95 and unsure.verdict is Verdict.INCONCLUSIVE
    # The thresholds are alpha and beta: a stricter alpha turns a Fail into Inconclusive.
    p = bayesian_regression(90, 100, 70, 100).p_regression
    assert 0.95 < p < 0.999
    assert bayesian_regression(90, 100, 70, 100, alpha=0.001).verdict is Verdict.INCONCLUSIVE


def test_impossible_drop_gives_zero_and_validation() -> None:
    value, _ = regression_probability((3.0, 50.0), (1.0, 1.0), 0.95)
    assert value == 0.0  # p_b's posterior has (almost) no mass above 0.95
    with pytest.raises(ValueError, match="0 <= k <= n"):
        bayesian_regression(11, 10, 5, 10)
    with pytest.raises(ValueError, match="a0, b0 must be > 0"):
        bayesian_regression(5, 10, 5, 10, a0=0.0)
    with pytest.raises(ValueError, match="delta"):
        bayesian_regression(5, 10, 5, 10, delta=1.0)
