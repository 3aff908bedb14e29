"""Bayesian regression probability (SPEC.md 3.6, paper Def. 3.10).

With a Beta(a0, b0) prior on each arm's pass rate, the posteriors are
p_b ~ Beta(a0 + k_b, b0 + n_b - k_b) and p_c ~ Beta(a0 + k_c, b0 + n_c - k_c),
independent. The regression probability is

    P_reg = P(p_c < p_b - delta) = integral_delta^1 f_b(x) F_c(x - delta) dx,

one-dimensional, so it is integrated exactly (adaptive quadrature) rather than sampled.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from scipy import integrate, stats

from assaywatch.analyzers.model import Verdict

#: Posterior tail mass left out of the integration range on each side of p_b's posterior.
_TAIL = 1e-12


@dataclass(frozen=True, slots=True)
class BayesianRegression:
    """Outcome of :func:`bayesian_regression`.

    ``posterior_b`` and ``posterior_c`` are the Beta shape pairs; ``abs_error`` is the
    quadrature's error estimate (plus the trimmed tail mass).
    """

    p_regression: float
    verdict: Verdict
    posterior_b: tuple[float, float]
    posterior_c: tuple[float, float]
    delta: float
    abs_error: float


def regression_probability(
    posterior_b: tuple[float, float], posterior_c: tuple[float, float], delta: float
) -> tuple[float, float]:
    """P(p_c < p_b - delta) for independent Beta posteriors, with an error estimate.

    The integrand f_b(x) F_c(x - delta) is zero below x = delta. Posteriors from hundreds
    of runs are needle-shaped, so the range is restricted to p_b's central 1 - 2e-12 mass
    and the posterior mean is passed to ``quad`` as a breakpoint; without that, quadrature
    over [0, 1] can step over the whole mass and return 0.
    """
    fb = stats.beta(*posterior_b)
    fc = stats.beta(*posterior_c)
    lo = max(delta, float(fb.ppf(_TAIL)))
    hi = float(fb.isf(_TAIL))
    if lo >= hi:
        return 0.0, _TAIL
    points = [m for m in (float(fb.mean()), float(fc.mean()) + delta) if lo < m < hi]
    value, err = integrate.quad(
        lambda x: float(fb.pdf(x) * fc.cdf(x - delta)),
        lo, hi, points=points or None, limit=200, epsabs=1e-12, epsrel=1e-10,
    )  # fmt: skip
    return min(1.0, max(0.0, float(value))), float(err) + 2 * _TAIL


def bayesian_regression(
    k_b: int,
    n_b: int,
    k_c: int,
    n_c: int,
    delta: float = 0.1,
    alpha: float = 0.05,
    beta: float = 0.1,
    a0: float = 1.0,
    b0: float = 1.0,
) -> BayesianRegression:
    """Bayesian regression verdict: Fail if P_reg > 1-alpha, Pass if P_reg < beta.

    Parameters
    ----------
    k_b, n_b, k_c, n_c:
        Passes and runs of the baseline and the candidate.
    delta:
        Drop that counts as a regression. delta = 0 asks only whether p_c < p_b.
    alpha, beta:
        Decision thresholds on the posterior probability (SPEC 3.6); they are not
        frequentist error rates.
    a0, b0:
        Beta prior shared by both arms; the default Beta(1, 1) is uniform. An informative
        prior (say the agent's historical 92%) shifts both arms alike, so it mainly
        sharpens small samples rather than biasing the comparison.
    """
    for name, k, n in (("baseline", k_b, n_b), ("candidate", k_c, n_c)):
        k, n = operator.index(k), operator.index(n)
        if n < 0 or not 0 <= k <= n:
            raise ValueError(f"{name} counts must satisfy 0 <= k <= n, got k={k}, n={n}")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    if not (a0 > 0.0 and b0 > 0.0):
        raise ValueError(f"prior shapes a0, b0 must be > 0, got a0={a0!r}, b0={b0!r}")
    post_b = (a0 + k_b, b0 + n_b - k_b)
    post_c = (a0 + k_c, b0 + n_c - k_c)
    p_reg, err = regression_probability(post_b, post_c, delta)
    if p_reg > 1.0 - alpha:
        verdict = Verdict.FAIL
    elif p_reg < beta:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.INCONCLUSIVE
    return BayesianRegression(p_reg, verdict, post_b, post_c, delta, err)
