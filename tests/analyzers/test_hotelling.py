from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from assaywatch.analyzers.fingerprint import N_FIXED, feature_names, fingerprint_matrix
from assaywatch.analyzers.hotelling import (
    Projection,
    effective_dimension,
    fingerprint_sample_size,
    hotelling_from_samples,
    hotelling_power,
    hotelling_two_sample,
)
from tests.analyzers.simagent import simulate_runs

TOOLS = ["calc", "lookup", "search"]
NAMES = feature_names(TOOLS)
SWAPPED = {"search": 0.3, "lookup": 0.5, "calc": 0.2}  # search <-> lookup, same call counts
POOL = 6000


def _binomial_band(p: float, reps: int, z: float = 3.0) -> tuple[float, float]:
    half = z * math.sqrt(p * (1 - p) / reps)
    return p - half, p + half


@pytest.fixture(scope="module")
def pools() -> dict[str, NDArray[np.float64]]:
    """Large seeded pools of simulated fingerprints; replicates resample from them.

    Resampling rows with replacement draws i.i.d. from the pool's empirical distribution, so
    two resamples of the same pool are an exact H0, and the pools are large enough (6000)
    that they represent the simulator. This keeps the Monte Carlo fast.
    """
    rng = np.random.default_rng(2024)
    return {
        "base": fingerprint_matrix(simulate_runs(POOL, rng), TOOLS),
        "swap": fingerprint_matrix(simulate_runs(POOL, rng, tool_weights=SWAPPED), TOOLS),
        "latency": fingerprint_matrix(simulate_runs(POOL, rng, latency_scale=1.5), TOOLS),
    }


def _nominal_reject(
    xb: NDArray[np.float64], xc: NDArray[np.float64], d: int = 14, alpha: float = 0.05
) -> bool:
    """The paper/released-code way: pseudo-inverse and the nominal d degrees of freedom."""
    nb, nc = len(xb), len(xc)
    n = nb + nc
    s = ((nb - 1) * np.cov(xb, rowvar=False) + (nc - 1) * np.cov(xc, rowvar=False)) / (n - 2)
    diff = xc.mean(0) - xb.mean(0)
    t2 = nb * nc / n * float(diff @ np.linalg.pinv(s) @ diff)
    f = (n - d - 1) / ((n - 2) * d) * t2
    return bool(stats.f.sf(f, d, n - d - 1) < alpha)


def test_full_rank_t2_matches_direct_numpy() -> None:
    rng = np.random.default_rng(1)
    cov = np.array(
        [[1.0, 0.5, 0.2, 0.0], [0.5, 2.0, 0.3, 0.1], [0.2, 0.3, 1.5, -0.4], [0.0, 0.1, -0.4, 0.7]]
    )
    xb = rng.multivariate_normal(np.zeros(4), cov, size=30)
    xc = rng.multivariate_normal([0.3, 0.0, -0.2, 0.1], cov, size=25)
    res = hotelling_from_samples(xb, xc, threshold=1.0)
    nb, nc, n, d = 30, 25, 55, 4
    s = ((nb - 1) * np.cov(xb.T) + (nc - 1) * np.cov(xc.T)) / (n - 2)
    diff = xc.mean(0) - xb.mean(0)
    q = float(diff @ np.linalg.solve(s, diff))
    t2 = nb * nc / n * q
    f = (n - d - 1) / ((n - 2) * d) * t2
    assert res.t2 == pytest.approx(t2, rel=1e-10)
    assert res.f == pytest.approx(f, rel=1e-10)
    assert (res.df1, res.df2, res.d_eff, res.rank) == (4, n - d - 1, 4, 4)
    assert res.p_value == pytest.approx(stats.f.sf(f, d, n - d - 1), rel=1e-9)
    assert res.mahalanobis == pytest.approx(math.sqrt(q), rel=1e-10)
    # Sufficient statistics give the same answer as raw baseline rows.
    res2 = hotelling_two_sample(xb.mean(0), np.cov(xb.T), nb, xc, threshold=1.0)
    assert res2.t2 == pytest.approx(res.t2, rel=1e-12)
    # T^2 is invariant to rescaling a feature (units do not matter on the full space).
    scale = np.array([1000.0, 1.0, 0.001, 1.0])
    assert hotelling_from_samples(xb * scale, xc * scale, threshold=1.0).t2 == pytest.approx(
        t2, rel=1e-8
    )


def test_null_statistic_follows_the_f_distribution() -> None:
    # 2000 Gaussian replicates, d=3, 20 vs 20: F should be F(3, 36). A KS test at the 1% level
    # and the upper quantiles within the Monte Carlo error of 2000 draws.
    rng = np.random.default_rng(7)
    reps, nb, nc, d = 2000, 20, 20, 3
    xb = rng.normal(size=(reps, nb, d))
    xc = rng.normal(size=(reps, nc, d))
    fs = np.array([hotelling_from_samples(xb[i], xc[i], threshold=1.0).f for i in range(reps)])
    dist = stats.f(d, nb + nc - d - 1)
    assert stats.kstest(fs, dist.cdf).pvalue > 0.01
    for q in (0.5, 0.9, 0.95):
        # the empirical CDF at the true quantile is within 3 binomial sd of q
        lo, hi = _binomial_band(q, reps)
        assert lo <= float(np.mean(fs <= dist.ppf(q))) <= hi


def _rank_deficient_gaussian(
    rng: np.random.Generator, n: int, shift: float = 0.0
) -> NDArray[np.float64]:
    """10 columns from 4 latent factors: 2 constants, 2 exact duplicates, shares summing to 1."""
    z = rng.normal(size=(n, 4))
    z[:, 0] += shift
    share = 1 / (1 + np.exp(-z[:, 1]))
    return np.column_stack(
        [
            z[:, 0],
            z[:, 1],
            z[:, 2],
            z[:, 3],
            np.full(n, 1.0),
            np.zeros(n),  # constants
            2.0 * z[:, 0] - z[:, 2],
            z[:, 1] + z[:, 3],  # collinear combinations
            share,
            1.0 - share,  # shares summing to one
        ]
    )


@pytest.mark.parametrize("threshold", [0.95, 1.0])
def test_type_one_error_on_rank_deficient_gaussian(threshold: float) -> None:
    # 400 replicates: sd of the rejection rate at 0.05 is 0.011; [0.025, 0.08] is about
    # -2.3 / +2.8 sd.
    rng = np.random.default_rng(11)
    rej = [
        hotelling_from_samples(
            _rank_deficient_gaussian(rng, 60),
            _rank_deficient_gaussian(rng, 60),
            threshold=threshold,
        ).reject
        for _ in range(400)
    ]
    assert 0.025 <= float(np.mean(rej)) <= 0.08


def test_type_one_error_on_simulated_fingerprints(pools: dict[str, NDArray[np.float64]]) -> None:
    a = pools["base"]
    assert np.linalg.matrix_rank(np.cov(a.T)) < a.shape[1] - 3  # constants and collinearity
    rng = np.random.default_rng(12)
    res = [
        hotelling_from_samples(a[rng.integers(0, POOL, 100)], a[rng.integers(0, POOL, 100)])
        for _ in range(400)
    ]
    rate = float(np.mean([r.reject for r in res]))
    assert 0.025 <= rate <= 0.08  # same tolerance as above (400 replicates)
    assert all(r.rank < a.shape[1] for r in res) and all(r.d_eff <= r.rank for r in res)


def test_power_on_tool_mix_swap_with_unchanged_counts(
    pools: dict[str, NDArray[np.float64]],
) -> None:
    a, b = pools["base"], pools["swap"]
    rng = np.random.default_rng(13)
    reps = 200
    full = fixed = 0
    top_is_tool = 0
    for _ in range(reps):
        xb, xc = a[rng.integers(0, POOL, 200)], b[rng.integers(0, POOL, 200)]
        r = hotelling_from_samples(xb, xc, feature_names=NAMES)
        full += r.reject
        top_is_tool += r.shifts[0].name.startswith("tool:")
        fixed += hotelling_from_samples(xb[:, :N_FIXED], xc[:, :N_FIXED]).reject
    # power >= 0.8 required; the swap is invisible to the 14 fixed features, whose rejection
    # rate stays at the Type I level (200 reps: 3 sd band around 0.05 is [0.004, 0.096]).
    assert full / reps >= 0.8
    assert fixed / reps <= 0.1
    assert top_is_tool / reps >= 0.9  # the report names a tool column as what moved


def test_projection_beats_nominal_degrees_of_freedom(pools: dict[str, NDArray[np.float64]]) -> None:
    # Same replicates for both methods (paired): McNemar-style exact test on the discordant
    # replicates -- if both had equal power, "ours rejects, nominal does not" would be
    # Binomial(discordant, 1/2). Measured power is printed by bench_hotelling.py.
    a, b = pools["base"], pools["swap"]
    rng = np.random.default_rng(14)
    ours_only = nominal_only = ours = nominal = 0
    reps = 300
    for _ in range(reps):
        xb, xc = a[rng.integers(0, POOL, 50)], b[rng.integers(0, POOL, 50)]
        r1 = hotelling_from_samples(xb, xc).reject
        r2 = _nominal_reject(xb, xc)
        ours, nominal = ours + r1, nominal + r2
        ours_only += r1 and not r2
        nominal_only += r2 and not r1
    assert ours > nominal
    test = stats.binomtest(ours_only, ours_only + nominal_only, 0.5, alternative="greater")
    assert test.pvalue < 1e-3


def test_default_keeps_low_variance_directions(pools: dict[str, NDArray[np.float64]]) -> None:
    # Latency x1.5 moves duration along a direction of small residual variance (duration
    # tracks the step count): the default (every non-null component) catches it at 50 per
    # side, the paper's 95% truncation mostly misses it. 100 replicates: the bounds are
    # > 4 binomial sd away from the measured 1.00 and 0.27.
    a, c = pools["base"], pools["latency"]
    rng = np.random.default_rng(18)
    full = trunc = 0
    for _ in range(100):
        xb, xc = a[rng.integers(0, POOL, 50)], c[rng.integers(0, POOL, 50)]
        full += hotelling_from_samples(xb, xc).reject
        trunc += hotelling_from_samples(xb, xc, threshold=0.95).reject
    assert full >= 90 and trunc <= 50


def test_power_matches_noncentral_f() -> None:
    # Gaussian, d=3, Mahalanobis 0.5, 40 vs 40: rejection rate vs scipy's non-central F,
    # within 3 binomial sd of 600 replicates.
    rng = np.random.default_rng(15)
    reps, n, d, delta = 600, 40, 3, 0.5
    rej = [
        hotelling_from_samples(
            rng.normal(size=(n, d)),
            rng.normal(size=(n, d)) + np.array([delta, 0, 0]),
            threshold=1.0,
        ).reject
        for _ in range(reps)
    ]
    power = hotelling_power(n, n, d, delta)
    lo, hi = _binomial_band(power, reps)
    assert lo <= float(np.mean(rej)) <= hi
    assert hotelling_power(n, n, d, 0.0) == pytest.approx(0.05, rel=1e-6)
    assert hotelling_power(2 * n, 2 * n, d, delta) > power


def test_changed_constant_feature_forces_rejection() -> None:
    rng = np.random.default_rng(16)
    xb = np.column_stack([rng.normal(size=30), np.ones(30)])
    xc = np.column_stack([rng.normal(size=30), np.full(30, 2.0)])
    r = hotelling_from_samples(xb, xc, feature_names=["x", "depth"])
    assert r.reject and r.p_value == 0.0 and r.constant_shifts == ("depth",)
    assert r.shifts[0].name == "depth" and r.shifts[0].shift == math.inf
    assert r.feature_shifts[0] == ("depth", math.inf) and set(dict(r.feature_shifts)) == {
        "x", "depth"}
    same = hotelling_from_samples(xb, np.column_stack([rng.normal(size=30), np.ones(30)]))
    assert same.constant_shifts == () and same.d_eff == 1


def test_all_constant_gives_no_evidence() -> None:
    r = hotelling_from_samples(np.ones((10, 3)), np.ones((12, 3)))
    assert (r.d_eff, r.t2, r.p_value, r.reject) == (0, 0.0, 1.0, False)


def test_effective_dimension_cases() -> None:
    assert effective_dimension(np.diag([10.0, 1.0, 0.0]), 0.9) == 1
    assert effective_dimension(np.diag([10.0, 1.0, 0.0]), 0.95) == 2
    assert effective_dimension(np.diag([1.0, 1.0, 1.0, 1.0]), 0.95) == 4
    assert effective_dimension(np.zeros((3, 3))) == 0
    v = np.array([1.0, 2.0, 3.0])
    assert effective_dimension(np.outer(v, v), 1.0) == 1  # rank one: duplicates do not count
    assert effective_dimension(np.diag([100.0, 1.0]), 0.95, standardize=True) == 2
    with pytest.raises(ValueError):
        effective_dimension(np.eye(2), 0.0)


def test_projection_scores_are_whitened() -> None:
    rng = np.random.default_rng(17)
    x = _rank_deficient_gaussian(rng, 5000)
    proj = Projection.fit(x.mean(0), np.cov(x.T), threshold=1.0)
    assert proj.rank == 5  # 4 latent factors + the (non-linear) share; 1 - share is collinear
    s = proj.scores(x)
    np.testing.assert_allclose(np.cov(s.T), np.eye(proj.d_eff), atol=1e-8)


def test_fingerprint_sample_size_eq30() -> None:
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.90)
    assert fingerprint_sample_size(0.05, 0.1, 3, 0.5) == math.ceil(4 * z**2 / 0.25 + 2)
    assert fingerprint_sample_size(0.05, 0.1, 3, 0.5) == 140
    assert fingerprint_sample_size(0.05, 0.1, 3, 1.0) < fingerprint_sample_size(0.05, 0.1, 3, 0.5)
    with pytest.raises(ValueError):
        fingerprint_sample_size(0.05, 0.1, 0, 0.5)


def test_input_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="tool inventory"):
        hotelling_two_sample(np.zeros(3), np.eye(3), 10, np.zeros((5, 4)))
    with pytest.raises(ValueError, match=">= 2 runs"):
        hotelling_two_sample(np.zeros(3), np.eye(3), 10, np.zeros((1, 3)))
