"""Siegmund's approximation of a CUSUM's in-control ARL for increments of any law, shared by
the calibration of the fingerprint and score charts (``bootstrap.py``) and of the label
charts (``label.py``): :func:`_adjustment` finds the law's adjustment coefficient theta
(the non-zero root of ``E exp(theta X) = 1``), :func:`cusum_arl` the zero-start ARL of a
CUSUM at threshold h (``bootstrap.py``'s module docstring gives the formula and its
measured accuracy).

Siegmund, D. (1985). Sequential Analysis: Tests and Confidence Intervals. Springer.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["cusum_arl", "cusum_h"]

F64 = NDArray[np.float64]

_OVERSHOOT = 1.166  # Siegmund's rho / sd for the Gaussian random walk
#: |theta| of a law without a root (support on one side of 0): every ARL infinite
_NO_ROOT = 1e30


def cusum_arl(h: F64, theta: F64, mu: F64, sd: F64) -> F64:
    """Siegmund's approximation of a CUSUM's zero-start ARL (module docstring)."""
    x = theta * (h + _OVERSHOOT * sd)
    small = np.abs(x) < 1e-6
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        num = np.where(small, x * x / 2.0, np.expm1(x) - x)
        out: F64 = np.where(small, (h + _OVERSHOOT * sd) ** 2 / np.maximum(sd, 1e-12) ** 2,
                            num / (-theta * mu))
    return np.where(np.isfinite(out), out, np.inf)


def cusum_h(level: F64, theta: F64, mu: F64, sd: F64) -> F64:
    """The threshold h at which :func:`cusum_arl` is ``e^level`` (not clamped; NaN where no
    h gives it: an increment law whose formula is negative or infinite at every h).

    With x = theta (h + rho) the formula reads expm1(x) - x = c, c = e^level (-theta mu):
    x is the root with the sign of theta, found by Newton's method from an upper bound of
    |x| (sqrt(2 c) for small c; log(2 (1 + c)) or c + 1 for large), where the convex
    function's iterates converge monotonically after at most one step; where |x| < 1e-6
    the formula's small-x form ((h + rho) / sd)^2 is inverted instead."""
    level, theta, mu, sd = np.broadcast_arrays(level, theta, mu, sd)
    rho = _OVERSHOOT * sd
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        c = np.exp(level) * (-theta * mu)
        ok = np.isfinite(c) & (c > 0) & (theta != 0)
        c1 = np.where(ok, c, 1.0)
        up = theta > 0
        small = c1 < 1.0
        x = np.where(up, np.where(small, np.sqrt(2.0 * c1), np.log(2.0 * (1.0 + c1))),
                     np.where(small, -np.sqrt(2.0 * c1), -c1))
        for _ in range(100):
            e = np.expm1(x)
            step = (e - x - c1) / np.where(e == 0.0, 1e-300, e)
            x_new = x - step
            # keep the root's sign (a step across 0 is halved back)
            x_new = np.where(np.sign(x_new) == np.sign(x), x_new, x / 2.0)
            done = np.abs(x_new - x) <= 1e-13 * np.maximum(1.0, np.abs(x_new))
            x = x_new
            if np.all(done | ~ok):
                break
        h = x / np.where(ok, theta, 1.0) - rho
        # the small-x form (theta = 0 included: the formula's limit)
        tiny = (np.abs(x) < 1e-6) | (theta == 0)
        h = np.where(tiny, np.sqrt(np.exp(level)) * np.maximum(sd, 1e-12) - rho, h)
    out: F64 = np.where(ok | (theta == 0), h,
                        np.where(np.isinf(c) & (c > 0), np.inf, np.nan))
    return out


def _adjustment(x: F64, w: F64) -> tuple[F64, F64, F64]:
    """(theta, mean, sd) of increments taking values x (c, K) with weights w (..., c, K)
    (rows summing to 1): theta the non-zero root of sum(w exp(theta x)) = 1, by Newton
    from the Gaussian value, moving outwards where Newton would head back towards 0."""
    mu = (w * x).sum(axis=-1)
    sd = np.sqrt(np.maximum((w * x * x).sum(axis=-1) - mu**2, 0.0)) + 1e-12
    # No root where the support lies on one side of 0 (a chart that never moves towards
    # its threshold: theta = +inf, every ARL infinite; or never away from 0: -inf). Newton
    # would double theta 40 times there (40% of a calibration's laws, and all its time).
    support, xb = w > 0, np.broadcast_to(x, w.shape)
    never_up = (mu < 0) & ~np.any(support & (xb > 0), axis=-1)
    never_down = (mu > 0) & ~np.any(support & (xb < 0), axis=-1)
    fixed = never_up | never_down
    theta = np.where(fixed, 0.0, -2.0 * mu / sd**2)
    for _ in range(40):
        e = w * np.exp(np.clip(theta[..., None] * x, -60.0, 60.0))
        m0, m1 = e.sum(axis=-1), (e * x).sum(axis=-1)
        psi, dpsi = np.log(m0), m1 / m0
        bad = dpsi * np.sign(theta) <= 0
        step = np.where(bad, -theta, psi / np.where(bad, 1.0, dpsi))
        theta = theta - step
        if np.all(fixed | (np.abs(step) <= 1e-7 * np.abs(theta))):
            break
    theta = np.where(never_up, _NO_ROOT, np.where(never_down, -_NO_ROOT, theta))
    return theta, mu, sd
