"""The control-variates evidence of the multi-fidelity live gate, vectorised over
replicates: the shrunk correlation rho_u, the CV estimate of the target pass rate and its
Stouffer form, the predicted cost per unit of evidence and the allocation ratio.

The formulas and their justification are in :mod:`assaywatch.monitor.live.fidelity`'s
docstring; these are pure functions of sufficient statistics (pass counts of paired and
extra runs), so the live gate and its simulations share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.fidelity import allocation_ratio

FArr = NDArray[np.float64]


def shrunk_phi(k: FArr, s_e: FArr, s_c: FArr, s_ec: FArr, shrink: float) -> FArr:
    """rho_u from k pairs with s_e target passes, s_c proxy passes, s_ec joint passes."""
    a, b, c = s_ec + 0.5, s_e - s_ec + 0.5, s_c - s_ec + 0.5  # pp, pf, fp cells
    d = k - s_e - s_c + s_ec + 0.5                              # ff cell
    den = np.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    phi = np.clip((a * d - b * c) / den, -0.999, 0.999)
    lb = np.tanh(np.arctanh(phi) - shrink / np.sqrt(np.maximum(k - 3.0, 1.0)))
    out: FArr = np.where(k > 3, np.maximum(lb, 0.0), 0.0)
    return out


def sd_hat(passes: FArr, n: FArr) -> FArr:
    p = (passes + 0.5) / (n + 1.0)
    out: FArr = np.sqrt(p * (1.0 - p))
    return out


@dataclass
class Evidence:
    """The CV estimate and its Stouffer form (module docstring), arrays over replicates."""

    p_hat: FArr
    f: FArr
    rho_u: FArr
    z_target: FArr
    z_proxy: FArr
    corr: FArr
    w_target: FArr
    w_proxy: FArr

    @property
    def n_eff_factor(self) -> FArr:
        out: FArr = 1.0 / self.f
        return out


def evidence(n: FArr, s_e: FArr, k: FArr, s_eP: FArr, s_cP: FArr, s_ecP: FArr, m: FArr,
             s_cE: FArr, theta: float, shrink: float) -> Evidence:
    """Control-variates estimate from sufficient statistics (vectorised)."""
    rho = shrunk_phi(k, s_eP, s_cP, s_ecP, shrink)
    sd_e, sd_c = sd_hat(s_e, n), sd_hat(s_cP + s_cE, k + m)
    nn, kk, mm = np.maximum(n, 1.0), np.maximum(k, 1.0), np.maximum(m, 1.0)
    frac = np.where(m > 0, k * m / (nn * (k + m)), 0.0)
    g = rho * sd_e / sd_c * frac
    diff = np.where(m > 0, s_cP / kk - s_cE / mm, 0.0)
    se_d = sd_c * np.sqrt(1.0 / kk + 1.0 / mm)
    return Evidence(p_hat=s_e / nn - g * diff, f=1.0 - rho**2 * frac, rho_u=rho,
                    z_target=(theta - s_e / nn) * np.sqrt(nn) / sd_e, z_proxy=diff / se_d,
                    corr=-rho * np.sqrt(frac), w_target=sd_e / np.sqrt(nn), w_proxy=g * se_d)


def predicted_cost(rho_u: FArr, kappa: FArr, r: FArr) -> FArr:
    """R = (1 - rho_u^2 (1 - 1/r)) (1 + r kappa): cost per unit evidence vs target alone."""
    out: FArr = (1.0 - rho_u**2 * (1.0 - 1.0 / r)) * (1.0 + r * kappa)
    return out


def choose_ratio(rho_u: FArr, kappa: FArr, sd_e: FArr, sd_c: FArr) -> FArr:
    """r = max(1, allocation_ratio(rho_u, 1, kappa, s_e^2, s_c^2)), vectorised."""
    args = np.broadcast_arrays(rho_u, kappa, sd_e, sd_c)
    flat = [allocation_ratio(float(r), 1.0, float(c), float(e) ** 2, float(p) ** 2)
            for r, c, e, p in zip(*(a.ravel() for a in args), strict=True)]
    out: FArr = np.maximum(1.0, np.array(flat, dtype=np.float64).reshape(args[0].shape))
    return out
