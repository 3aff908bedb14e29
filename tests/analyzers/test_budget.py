from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.budget import (
    STABLE_BELOW,
    VOLATILE_FROM,
    adaptive_budget,
    budget_from_variance,
    natural_scale,
    variance_class,
)
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from tests.analyzers.simagent import simulate_runs

TOOLS = ["calc", "lookup", "search"]


def _gaussian(rng: np.random.Generator, k: int, total_var: float, d: int = 14) -> np.ndarray:
    """k fingerprints with mean 0 and per-dimension variance total_var / d."""
    return rng.normal(0.0, math.sqrt(total_var / d), size=(k, d))


@pytest.mark.parametrize(
    ("total", "expected"), [(0.5, "stable"), (3.0, "moderate"), (10.0, "volatile")]
)
def test_variance_classes_on_constructed_data(total: float, expected: str) -> None:
    # k = 400: (k-1) s^2 / sigma^2 ~ chi2 with ~ 14 * 399 dof overall, so the estimate is
    # within a few percent of `total`, far from the thresholds 1.5 and 5.0.
    b = adaptive_budget(_gaussian(np.random.default_rng(1), 400, total))
    assert b.variance_class == expected
    assert b.sigma2_natural == pytest.approx(total, rel=0.1)
    assert b.scale == "natural"


def test_class_thresholds_are_half_open() -> None:
    assert variance_class(STABLE_BELOW - 1e-9) == "stable"
    assert variance_class(STABLE_BELOW) == "moderate"
    assert variance_class(VOLATILE_FROM - 1e-9) == "moderate"
    assert variance_class(VOLATILE_FROM) == "volatile"


def test_sigma2_is_eq37_total_variance() -> None:
    x = _gaussian(np.random.default_rng(2), 25, 2.0)
    direct = float(np.sum((x - x.mean(0)) ** 2) / (len(x) - 1))
    assert adaptive_budget(x).sigma2 == pytest.approx(direct, rel=1e-12)


def test_natural_scale_turns_counts_into_cv() -> None:
    rng = np.random.default_rng(3)
    x = np.zeros((500, 14))
    x[:, 2] = rng.normal(10.0, 2.0, 500)  # branches: mean 10, sd 2 -> CV^2 = 0.04
    unit = natural_scale(x)
    assert unit[2] == pytest.approx(10.0, rel=0.02) and unit[1] == 1.0 and unit[0] == 1.0
    assert adaptive_budget(x).sigma2_natural == pytest.approx(0.04, rel=0.15)


def test_n_star_formula_by_hand() -> None:
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.9)
    n0 = math.ceil(z**2 * 2.0 / 0.25 + (4 + 1) / 2)
    n_stat = math.ceil(n0 * (1 + math.sqrt(2 / 10)))
    assert budget_from_variance(2.0, 4, 10) == (n_stat, max(n_stat, 15))
    # the k + 5 floor binds for tiny variance
    assert budget_from_variance(0.0, 1, 50)[1] == 55


def test_recommendation_is_monotone_in_k_without_a_jump_at_30() -> None:
    for sigma2, d_eff in [(0.2, 2), (1.5, 5), (6.0, 9)]:
        prev_add, prev_star = None, None
        for k in range(5, 101):
            n_stat, n_star = budget_from_variance(sigma2, d_eff, k)
            add = n_star - k
            assert add >= 5
            if prev_add is not None and prev_star is not None:
                assert add <= prev_add  # runs still to do never increase with k
                assert n_star - prev_star <= 1  # the total grows at most with k itself
            prev_add, prev_star = add, n_star


def test_expected_recommendation_on_simulated_calibrations_is_smooth_in_k() -> None:
    # 50 replicate calibration sequences of one simulated agent; calibration of size k is
    # the first k runs of a sequence (nested, as when calibrating run by run). The change of
    # the runs still to do from k to k+1, averaged over replicates, must not be positive
    # beyond 3 standard errors at any k in 5..99: no jump anywhere, in particular at 30.
    rng = np.random.default_rng(4)
    pool = fingerprint_matrix(simulate_runs(3000, rng), TOOLS)
    ks = np.arange(5, 101)
    add = np.empty((50, ks.size))
    for r in range(add.shape[0]):
        seq = pool[rng.integers(0, len(pool), ks[-1])]
        add[r] = [adaptive_budget(seq[:k]).n_additional for k in ks]
    step = np.diff(add, axis=1)
    mean, se = step.mean(axis=0), step.std(axis=0, ddof=1) / np.sqrt(add.shape[0]) + 1e-9
    assert np.all(mean <= 3 * se), list(zip(ks[:-1], mean.round(2), strict=True))
    assert add[:, -1].mean() < add[:, 5].mean() - 5  # k = 100 needs clearly fewer than k = 10


def test_baseline_sd_scale_measures_variance_relative_to_baseline() -> None:
    rng = np.random.default_rng(5)
    base = fingerprint_matrix(simulate_runs(2000, rng), TOOLS)
    cal = fingerprint_matrix(simulate_runs(400, rng), TOOLS)
    sd = base.std(axis=0, ddof=1)
    b = adaptive_budget(cal, baseline_sd=sd)
    constant = tuple(int(i) for i in np.flatnonzero(sd == 0))
    assert b.scale == "baseline_sd" and b.dropped_features == constant and constant
    # same agent: each kept feature has variance ratio ~1, so sigma2 ~ number kept
    assert b.sigma2 == pytest.approx(cal.shape[1] - len(constant), rel=0.15)
    # the class is always computed on the natural scale
    assert b.variance_class == adaptive_budget(cal).variance_class
    noisier = adaptive_budget(cal + rng.normal(0, sd, cal.shape), baseline_sd=sd)
    assert noisier.sigma2 > 1.5 * b.sigma2 and noisier.n_star > b.n_star


def test_more_variable_agent_needs_more_runs() -> None:
    rng = np.random.default_rng(6)
    calm = adaptive_budget(_gaussian(rng, 30, 0.5))
    wild = adaptive_budget(_gaussian(rng, 30, 8.0))
    assert calm.n_star < wild.n_star
    assert calm.variance_class == "stable" and wild.variance_class == "volatile"


def test_invalid_input() -> None:
    with pytest.raises(ValueError, match="k >= 2"):
        adaptive_budget(np.zeros((1, 14)))
    with pytest.raises(ValueError, match="baseline_sd"):
        adaptive_budget(np.zeros((5, 14)), baseline_sd=np.ones(3))
    with pytest.raises(ValueError, match="delta_min"):
        budget_from_variance(1.0, 2, 10, delta_min=0.0)
