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

__all__ = ["cusum_arl"]

F64 = NDArray[np.float64]

_OVERSHOOT = 1.166  # Siegmund's rho / sd for the Gaussian random walk


def cusum_arl(h: F64, theta: F64, mu: F64, sd: F64) -> F64:
    """Siegmund's approximation of a CUSUM's zero-start ARL (module docstring)."""
    x = theta * (h + _OVERSHOOT * sd)
    small = np.abs(x) < 1e-6
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        num = np.where(small, x * x / 2.0, np.expm1(x) - x)
        out: F64 = np.where(small, (h + _OVERSHOOT * sd) ** 2 / np.maximum(sd, 1e-12) ** 2,
                            num / (-theta * mu))
    return np.where(np.isfinite(out), out, np.inf)


def _adjustment(x: F64, w: F64) -> tuple[F64, F64, F64]:
    """(theta, mean, sd) of increments taking values x (c, K) with weights w (..., c, K)
    (rows summing to 1): theta the non-zero root of sum(w exp(theta x)) = 1, by Newton
    from the Gaussian value, moving outwards where Newton would head back towards 0."""
    mu = (w * x).sum(axis=-1)
    sd = np.sqrt(np.maximum((w * x * x).sum(axis=-1) - mu**2, 0.0)) + 1e-12
    theta = -2.0 * mu / sd**2
    for _ in range(40):
        e = w * np.exp(np.clip(theta[..., None] * x, -60.0, 60.0))
        m0, m1 = e.sum(axis=-1), (e * x).sum(axis=-1)
        psi, dpsi = np.log(m0), m1 / m0
        bad = dpsi * np.sign(theta) <= 0
        step = np.where(bad, -theta, psi / np.where(bad, 1.0, dpsi))
        theta = theta - step
        if np.all(np.abs(step) <= 1e-7 * np.abs(theta)):
            break
    return theta, mu, sd
