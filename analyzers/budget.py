"""Adaptive trial budget (paper 7.2, Algorithm 4; SPEC.md "Adaptive budget").

From k calibration runs of the candidate, estimate how variable its behaviour is and how
many runs a fingerprint test needs to detect a shift of ``delta_min``:

    sigma2 = sum_i ||f_i - f_bar||^2 / (k - 1)               (Eq. 37: trace of the covariance)
    n0     = ceil(z^2 sigma2 / delta_min^2 + (d_eff + 1) / 2) (Eq. 39, z = z_{1-a} + z_{1-b})
    n_stat = ceil(n0 (1 + sqrt(2 / k)))                      (margin for estimating sigma2)
    n_star = max(n_stat, k + 5)                              (total candidate runs)

Scales -- what makes sigma2 (and the 1.5 / 5.0 class thresholds) meaningful
------------------------------------------------------------------------
sigma2 is a sum of variances, so it depends on the units of each feature. Two scales:

**natural** (the default, and always the scale of ``variance_class``): every feature is
taken in a unit-free form. Shares, kappa, e and rho are proportions in [0, 1] (variance at
most 1/4); the log1p features (steps, output length, tokens, duration) have a standard
deviation close to the coefficient of variation (CV) of the raw quantity; the two raw
counts (max depth, branches) are divided by max(1, their calibration mean), which also makes
their standard deviation a CV. On this scale a per-dimension variance of 0.107 (sd 0.33:
a 33% CV, or a share wandering by +-0.33) summed over the 14 fixed dimensions gives the
implementation threshold 1.5 (stable below), and 0.357 per dimension (sd 0.6) gives 5.0
(volatile from). The ``tool:`` columns add at most 1 in total (their sum is a share), so
the thresholds hold for any inventory size. ``delta_min`` is then in natural units.

**baseline_sd**: when the baseline's per-feature standard deviations are given, features
are divided by them (features constant in the baseline are dropped and listed), so
``delta_min`` is a shift in baseline standard deviations -- a Mahalanobis-type distance as
in Theorem 7.1 -- and sigma2 counts how much more (or less) variable the candidate is than
the baseline. The variance class is still computed on the natural scale.

The brief's fallback "standardise by the calibration sample's own sd" is not offered: it
makes every non-constant feature's variance exactly 1, so sigma2 would always equal the
number of non-constant features and carry no information about the agent.

Monotonicity in k. n_stat only decreases as k grows (the margin shrinks, sigma2 is an
unbiased estimate whose expectation does not depend on k) and the floor k + 5 grows by one
per calibration run, so ``n_additional = n_star - k = max(n_stat - k, 5)`` -- the runs still
to do -- is non-increasing in k and ``n_star`` never jumps: there is no switch of formula at
k = 30 (the released implementation jumps there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from assaywatch.analyzers.fingerprint import FIXED_FEATURES, N_FIXED
from assaywatch.analyzers.hotelling import effective_dimension

#: Class thresholds on the natural-scale total variance (see module docstring).
STABLE_BELOW = 1.5
VOLATILE_FROM = 5.0
#: Indices of the raw count features rescaled to a CV on the natural scale.
_COUNT_FEATURES = (FIXED_FEATURES.index("max_depth"), FIXED_FEATURES.index("branches"))


@dataclass(frozen=True, slots=True)
class Budget:
    """Result of :func:`adaptive_budget`.

    Attributes
    ----------
    variance_class:
        ``"stable"``, ``"moderate"`` or ``"volatile"`` (from ``sigma2_natural``).
    sigma2:
        Total variance on the scale of ``delta_min`` (used in n*).
    sigma2_natural:
        Total variance on the natural scale (the class statistic).
    d_eff:
        Effective dimension of the calibration sample on the scale of ``delta_min``.
    n_star:
        Recommended total number of candidate runs (the k calibration runs included).
    n_additional:
        ``n_star - k``: runs still to execute.
    n_statistical:
        The formula part before the k + 5 floor.
    k:
        Calibration size.
    scale:
        ``"natural"`` or ``"baseline_sd"``.
    delta_min:
        Minimum detectable shift, in units of ``scale``.
    dropped_features:
        Indices of features left out on the baseline_sd scale (zero baseline sd).
    """

    variance_class: str
    sigma2: float
    sigma2_natural: float
    d_eff: int
    n_star: int
    n_additional: int
    n_statistical: int
    k: int
    scale: str
    delta_min: float
    dropped_features: tuple[int, ...] = ()


def variance_class(sigma2_natural: float, low: float = STABLE_BELOW,
                   high: float = VOLATILE_FROM) -> str:
    """stable < low <= moderate < high <= volatile."""
    if sigma2_natural < low:
        return "stable"
    return "moderate" if sigma2_natural < high else "volatile"


def natural_scale(calibration: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-feature divisors of the natural scale (1, except the two counts: max(1, mean))."""
    x = np.asarray(calibration, dtype=np.float64)
    unit = np.ones(x.shape[1])
    if x.shape[1] >= N_FIXED:
        for j in _COUNT_FEATURES:
            unit[j] = max(1.0, abs(float(x[:, j].mean())))
    return unit


def budget_from_variance(
    sigma2: float, d_eff: int, k: int, alpha: float = 0.05, beta: float = 0.1,
    delta_min: float = 0.5,
) -> tuple[int, int]:
    """``(n_statistical, n_star)`` for a given total variance (the formulas above)."""
    if k < 2:
        raise ValueError(f"calibration needs k >= 2 runs, got {k}")
    if not (0 < alpha < 1 and 0 < beta < 1):
        raise ValueError(f"alpha and beta must be in (0, 1), got {alpha}, {beta}")
    if not delta_min > 0:
        raise ValueError(f"delta_min must be > 0, got {delta_min}")
    z = float(-special.ndtri(alpha) - special.ndtri(beta))  # z_{1-a} + z_{1-b}
    n0 = math.ceil(z * z * max(sigma2, 0.0) / delta_min**2 + (d_eff + 1) / 2)
    n_stat = math.ceil(n0 * (1.0 + math.sqrt(2.0 / k)))
    return n_stat, max(n_stat, k + 5)


def adaptive_budget(
    calibration: NDArray[np.float64],
    alpha: float = 0.05,
    beta: float = 0.1,
    delta_min: float = 0.5,
    baseline_sd: NDArray[np.float64] | Sequence[float] | None = None,
    threshold: float = 0.95,
    low: float = STABLE_BELOW,
    high: float = VOLATILE_FROM,
) -> Budget:
    """Variance class and recommended candidate runs from k calibration fingerprints.

    Parameters
    ----------
    calibration:
        (k, d) fingerprints of the candidate's calibration runs, columns as
        ``fingerprint.feature_names``.
    alpha, beta:
        Type I and Type II error of the planned fingerprint test (one-sided z's).
    delta_min:
        Smallest shift worth detecting, in natural units, or in baseline standard
        deviations when ``baseline_sd`` is given (paper default 0.5).
    baseline_sd:
        Per-feature standard deviations of the baseline (``Baseline.sd``).
    threshold:
        Variance share for d_eff.
    low, high:
        Class thresholds on the natural scale.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> b = adaptive_budget(rng.normal(0.0, 0.1, size=(20, 14)))
    >>> b.variance_class, b.n_star >= b.k + 5
    ('stable', True)
    """
    x = np.asarray(calibration, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"calibration must be (k >= 2, d) fingerprints, got shape {x.shape}")
    k, d = x.shape
    nat = x / natural_scale(x)
    sigma2_nat = float(np.var(nat, axis=0, ddof=1).sum())
    dropped: tuple[int, ...] = ()
    if baseline_sd is None:
        scaled, scale = nat, "natural"
    else:
        sd = np.asarray(baseline_sd, dtype=np.float64)
        if sd.shape != (d,):
            raise ValueError(f"baseline_sd has shape {sd.shape}, calibration has {d} features")
        keep = sd > 1e-12 * max(1.0, float(sd.max(initial=0.0)))
        dropped = tuple(int(i) for i in np.flatnonzero(~keep))
        scaled, scale = x[:, keep] / sd[keep], "baseline_sd"
    cov = np.cov(scaled, rowvar=False, ddof=1).reshape(scaled.shape[1], scaled.shape[1])
    sigma2 = float(np.trace(cov))
    d_eff = effective_dimension(cov, threshold) if scaled.shape[1] else 0
    n_stat, n_star = budget_from_variance(sigma2, d_eff, k, alpha, beta, delta_min)
    return Budget(
        variance_class=variance_class(sigma2_nat, low, high),
        sigma2=sigma2,
        sigma2_natural=sigma2_nat,
        d_eff=d_eff,
        n_star=n_star,
        n_additional=n_star - k,
        n_statistical=n_stat,
        k=k,
        scale=scale,
        delta_min=delta_min,
        dropped_features=dropped,
    )
