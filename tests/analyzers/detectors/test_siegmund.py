"""Siegmund's ARL formula, its inverse in h, and the adjustment coefficient of a law."""

from __future__ import annotations

import numpy as np

from assaywatch.analyzers.detectors.siegmund import _adjustment, cusum_arl, cusum_h


def test_cusum_h_inverts_cusum_arl_on_laws_of_both_signs() -> None:
    """cusum_arl(cusum_h(level)) = e^level for drifts down (theta > 0) and up (theta < 0),
    small and large ARLs, and theta = 0 (the formula's limit ((h + rho) / sd)^2)."""
    rng = np.random.default_rng(3)
    n = 4_000
    theta = np.concatenate([rng.uniform(1e-4, 5, n), -rng.uniform(1e-4, 5, n), np.zeros(4)])
    mu = -np.sign(theta) * rng.uniform(1e-3, 3, theta.size)
    mu[theta == 0] = 0.0
    sd = rng.uniform(0.05, 4, theta.size)
    level = rng.uniform(0.5, 40, theta.size)
    h = cusum_h(level, theta, mu, sd)
    ok = h > 0  # a level below the ARL at h = 0 has a negative h (callers clamp it)
    assert ok.mean() > 0.5
    got = np.log(cusum_arl(h[ok], theta[ok], mu[ok], sd[ok]))
    np.testing.assert_allclose(got, level[ok], rtol=0, atol=1e-9)


def test_cusum_h_where_no_h_gives_the_arl() -> None:
    # the formula is negative at every h (theta and mu of one sign): NaN
    assert np.isnan(cusum_h(np.array([3.0]), np.array([1.0]), np.array([0.5]), np.array([1.0])))
    # an infinite target: infinite h
    assert cusum_h(np.array([1e4]), np.array([1.0]), np.array([-0.5]), np.array([1.0]))[0] \
        == np.inf


def test_adjustment_of_a_law_on_one_side_of_zero_is_infinite() -> None:
    """Increments never above 0: the chart never moves towards its threshold, theta = +inf
    (as a huge number), every ARL infinite. Never below 0: theta = -inf, and the formula's
    limit is the walk's time to climb h + rho at its mean step, (h + rho) / mu. A law with
    both signs gets its finite root: E exp(theta X) = 1."""
    x = np.array([[-1.0, -0.5, 0.0], [0.2, 0.5, 1.0], [-1.0, 0.0, 0.5]])
    w = np.array([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.3, 0.3, 0.4]])
    theta, mu, sd = _adjustment(x, w)
    assert theta[0] >= 1e30 and theta[1] <= -1e30
    arl = cusum_arl(np.array([4.0, 4.0]), theta[:2], mu[:2], sd[:2])
    assert np.isinf(arl[0])
    assert abs(mu[1] - 0.61) < 1e-12 and abs(arl[1] - (4.0 + 1.166 * sd[1]) / mu[1]) < 1e-9
    assert 0 < theta[2] < 100
    assert abs(float((w[2] * np.exp(theta[2] * x[2])).sum()) - 1.0) < 1e-9
