"""Multi-fidelity proxy testing (paper 7.4; SPEC.md "Multi-fidelity").

A cheap proxy model M_c whose behaviour tracks the expensive target M_e can stand in for
some target runs. Three pieces:

* **Correlation of paired fingerprints** (:func:`paired_correlation`). Target and proxy
  are run on the *same inputs*; row i of both matrices belongs to input i. rho is the mean,
  over features that vary in both samples, of the Pearson correlation of the paired
  columns -- the paper's "computed component-wise and averaged" (Def. 7.7). Correlating the
  two *mean vectors* instead (the released implementation) measures only that both agents
  have features on similar scales -- tokens large, shares small -- and scores two
  unrelated agents 0.966. Per-feature pairing is zero in expectation for independent
  agents (each term has mean ~0 and sd ~ 1/sqrt(n)), and stays interpretable: rho^2 is the
  share of a target feature's variance the proxy explains. A first-canonical-correlation
  alternative was rejected: it maximises over directions and is biased upwards (about
  sqrt(d/n)) for unrelated agents.
* **Allocation** (:func:`allocation_ratio`): n_c / n_e = rho sqrt(c_e sigma_c^2 /
  (c_c sigma_e^2)) (SPEC).
* **Combination** of the target's and the proxy's p-values by Stouffer's weighted Z
  (:func:`stouffer`), and, when the two tests are run on paired inputs so that their
  z-scores are correlated, by :func:`combine_paired`, which divides by the standard
  deviation of the weighted sum under that correlation:

      Z = (w_e z_e + w_c z_c) / sqrt(w_e^2 + w_c^2 + 2 rho w_e w_c)

  Ignoring a positive correlation overstates the evidence (for rho = 0.8 and equal
  weights, the naive combination rejects a true null at 0.05 11% of the time). If the
  two tests use independent runs (different inputs), the z-scores are independent and
  rho must be 0 here whatever the fingerprint correlation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import stats

#: p-values are clipped to [P_CLIP, 1 - P_CLIP] so that z stays finite.
P_CLIP = 1e-300


def _z(p: NDArray[np.float64]) -> NDArray[np.float64]:
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    out: NDArray[np.float64] = stats.norm.isf(np.clip(p, P_CLIP, 1.0 - 1e-16))
    return out


def stouffer(
    p_values: Sequence[float] | NDArray[np.float64],
    weights: Sequence[float] | NDArray[np.float64] | None = None,
) -> tuple[float, float]:
    """Stouffer's weighted Z for independent one-sided p-values.

    ``z_i = Phi^-1(1 - p_i)``, ``Z = sum w_i z_i / sqrt(sum w_i^2)``, ``p = 1 - Phi(Z)``.

    Returns
    -------
    (Z, p)
        Same as ``scipy.stats.combine_pvalues(p, method="stouffer", weights=w)``.

    Examples
    --------
    >>> z, p = stouffer([0.05, 0.05])
    >>> round(z, 4), round(p, 4)
    (2.3262, 0.01)
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("stouffer needs a non-empty 1-d sequence of p-values")
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != p.shape:
        raise ValueError(f"{w.size} weights for {p.size} p-values")
    norm = float(np.sqrt(np.sum(w * w)))
    if norm == 0:
        raise ValueError("stouffer weights must not all be zero")
    z = float(np.sum(w * _z(p)) / norm)
    return z, float(stats.norm.sf(z))


def combine_paired(
    p_target: float,
    p_proxy: float,
    rho: float,
    w_target: float = 1.0,
    w_proxy: float = 1.0,
) -> tuple[float, float]:
    """Stouffer combination of two correlated one-sided p-values (see module docstring).

    Parameters
    ----------
    p_target, p_proxy:
        One-sided p-values of the same hypothesis tested on target and proxy runs.
    rho:
        Correlation of the two z-scores under H0 (paired inputs; 0 if independent).
    w_target, w_proxy:
        Non-negative weights (e.g. sqrt of the sample sizes).

    Returns
    -------
    (Z, p)
    """
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [-1, 1], got {rho}")
    if w_target < 0 or w_proxy < 0 or w_target + w_proxy == 0:
        raise ValueError(f"weights must be >= 0 and not both 0, got {w_target}, {w_proxy}")
    ze, zc = _z(np.array([p_target, p_proxy], dtype=np.float64))
    z = float(combined_z(ze, zc, rho, w_target, w_proxy))
    return z, float(stats.norm.sf(z))


def combined_z(
    z_target: NDArray[np.float64] | float,
    z_proxy: NDArray[np.float64] | float,
    rho: float,
    w_target: float = 1.0,
    w_proxy: float = 1.0,
) -> NDArray[np.float64]:
    """Vectorised core of :func:`combine_paired` on z-scores (``z = Phi^-1(1 - p)``).

    ``(w_e z_e + w_c z_c) / sqrt(w_e^2 + w_c^2 + 2 rho w_e w_c)``; standard normal under H0
    when (z_e, z_c) is bivariate normal with correlation rho.
    """
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [-1, 1], got {rho}")
    var = w_target**2 + w_proxy**2 + 2.0 * rho * w_target * w_proxy
    if var <= 0:
        raise ValueError("rho = -1 with equal weights: the combination is degenerate")
    out: NDArray[np.float64] = (
        w_target * np.asarray(z_target, dtype=np.float64)
        + w_proxy * np.asarray(z_proxy, dtype=np.float64)
    ) / math.sqrt(var)
    return out


def paired_correlation(F_target: NDArray[np.float64], F_proxy: NDArray[np.float64]) -> float:
    """Mean per-feature Pearson correlation of paired fingerprints (see module docstring).

    Parameters
    ----------
    F_target, F_proxy:
        (n, d) fingerprints; row i of both comes from the same input.

    Returns
    -------
    float
        In [-1, 1]; 0.0 when no feature varies in both samples (no evidence of tracking).
    """
    a = np.asarray(F_target, dtype=np.float64)
    b = np.asarray(F_proxy, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(
            f"paired fingerprints must have the same (n, d) shape, got {a.shape} and {b.shape}"
        )
    if a.shape[0] < 3:
        raise ValueError(f"need >= 3 paired runs, got {a.shape[0]}")
    ac = a - a.mean(axis=0)
    bc = b - b.mean(axis=0)
    sa = np.sqrt((ac * ac).sum(axis=0))
    sb = np.sqrt((bc * bc).sum(axis=0))
    tol = 1e-12
    ok = (sa > tol * max(1.0, float(sa.max()))) & (sb > tol * max(1.0, float(sb.max())))
    if not ok.any():
        return 0.0
    r = (ac[:, ok] * bc[:, ok]).sum(axis=0) / (sa[ok] * sb[ok])
    return float(np.clip(r.mean(), -1.0, 1.0))


def allocation_ratio(
    rho: float, cost_target: float, cost_proxy: float, var_target: float, var_proxy: float
) -> float:
    """n_proxy / n_target = |rho| sqrt(c_e sigma_c^2 / (c_c sigma_e^2)) (SPEC.md 7.4)."""
    if cost_target <= 0 or cost_proxy <= 0:
        raise ValueError(f"costs must be > 0, got {cost_target}, {cost_proxy}")
    if var_target <= 0 or var_proxy < 0:
        raise ValueError(f"variances must be > 0, got {var_target}, {var_proxy}")
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [-1, 1], got {rho}")
    return abs(rho) * math.sqrt(cost_target * var_proxy / (cost_proxy * var_target))
