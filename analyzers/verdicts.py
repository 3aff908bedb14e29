"""Fixed-sample verdicts: single-version pass-rate verdict and two-version regression verdict.

SPEC.md 3.3 (stochastic verdict) and 3.4 (regression verdict, effect sizes, sample size).
Intervals and tests are scipy's (``binomtest(...).proportion_ci``, ``fisher_exact``,
``hypergeom``, ``norm``); this module adds the decision rules and the power computation.

Measured properties (tests/analyzers/test_verdicts.py):

* The two-sided Wilson rule at level 1-alpha decides a one-sided question, so its real
  false-pass rate at p = theta is about alpha/2, not alpha: exactly 0.005-0.027 for
  theta in {0.8, 0.85, 0.9}, n in {50, 100, 200, 500} at alpha = 0.05 (the rate saw-tooths
  with n because k is discrete). ``method="one-sided"`` spends the whole alpha on the
  Pass side: 0.034-0.058 on the same grid (Wilson coverage is approximate, it can exceed
  alpha a little; use ``"clopper-pearson"`` when a guaranteed bound matters).
* The regression rule's Fail needs p < alpha AND an observed drop >= delta (SPEC 3.4). At a
  true drop of exactly delta the observed drop reaches delta only about half the time, so
  P(Fail) is about 0.5 there however large n is; the *test* rejects with the planned power.
  A regression clearly larger than delta fails with the test's power.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from assaywatch.analyzers.model import Verdict

SingleMethod = Literal["wilson", "clopper-pearson", "one-sided"]
RegressionTest = Literal["fisher", "z"]
Sided = Literal["two-sided", "lower", "upper"]

SINGLE_METHODS: tuple[str, ...] = ("wilson", "clopper-pearson", "one-sided")
REGRESSION_TESTS: tuple[str, ...] = ("fisher", "z")
#: Exact power sums over at most this many (k_b, k_c) outcome pairs (binomial tails below
#: 1e-10 are trimmed): about 10 ms at n = 215 per arm, 0.3 s at 40,000 cells. Beyond it the
#: normal approximation is used (with Yates' continuity correction for Fisher); at
#: p_b=0.9, delta=0.1 and n = 100..1000 per arm it is within 0.012 of the exact power.
EXACT_POWER_MAX_CELLS = 40_000
_TAIL = 1e-10


def _check_counts(k: int, n: int) -> tuple[int, int]:
    k, n = operator.index(k), operator.index(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"counts must satisfy 0 <= k <= n and n >= 1, got k={k}, n={n}")
    return k, n


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")


_ALTERNATIVE = {"two-sided": "two-sided", "lower": "greater", "upper": "less"}


def _interval(k: int, n: int, alpha: float, sided: str, method: str) -> tuple[float, float]:
    k, n = _check_counts(k, n)
    _check_level("alpha", alpha)
    if sided not in _ALTERNATIVE:
        raise ValueError(f"sided must be one of {sorted(_ALTERNATIVE)}, got {sided!r}")
    ci = stats.binomtest(k, n, alternative=_ALTERNATIVE[sided]).proportion_ci(
        confidence_level=1.0 - alpha, method=method
    )
    return float(ci.low), float(ci.high)


def wilson_interval(
    k: int, n: int, alpha: float = 0.05, sided: Sided = "two-sided"
) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (SPEC Eq. 3).

    ``(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with z = z_{1-alpha/2};
    ``sided="lower"`` returns the one-sided lower bound at level 1-alpha (z = z_{1-alpha})
    and 1.0 as the upper end, ``sided="upper"`` the mirror image.
    """
    return _interval(k, n, alpha, sided, "wilson")


def clopper_pearson_interval(
    k: int, n: int, alpha: float = 0.05, sided: Sided = "two-sided"
) -> tuple[float, float]:
    """Clopper-Pearson (exact) interval: Beta quantiles, coverage >= 1-alpha for every p."""
    return _interval(k, n, alpha, sided, "exact")


@dataclass(frozen=True, slots=True)
class SingleVerdict:
    """Outcome of :func:`single_verdict`."""

    verdict: Verdict
    p_hat: float
    lower: float
    upper: float
    n: int
    method: str


def single_verdict(
    k: int, n: int, theta: float, alpha: float = 0.05, method: SingleMethod = "wilson"
) -> SingleVerdict:
    """Three-valued verdict of one version against a pass threshold (SPEC 3.3, Eq. 4).

    Pass if lower >= theta, Fail if upper < theta, else Inconclusive.

    Parameters
    ----------
    k, n:
        Passing trials and trials.
    theta:
        Required pass rate.
    alpha:
        ``"wilson"`` and ``"clopper-pearson"`` use the two-sided 1-alpha interval, as the
        paper does; the decision is one-sided, so the real false-pass rate at p = theta is
        about alpha/2 (measured 0.005-0.027 at alpha = 0.05, see the module docstring).
        ``"one-sided"`` uses the one-sided Wilson bounds at level 1-alpha each (lower for
        Pass, upper for Fail): false-pass about alpha (measured 0.034-0.058).
    """
    _check_level("theta", theta)
    if method == "wilson":
        lower, upper = wilson_interval(k, n, alpha)
    elif method == "clopper-pearson":
        lower, upper = clopper_pearson_interval(k, n, alpha)
    elif method == "one-sided":
        lower = wilson_interval(k, n, alpha, sided="lower")[0]
        upper = wilson_interval(k, n, alpha, sided="upper")[1]
    else:
        raise ValueError(f"method must be one of {SINGLE_METHODS}, got {method!r}")
    if lower >= theta:
        verdict = Verdict.PASS
    elif upper < theta:
        verdict = Verdict.FAIL
    else:
        verdict = Verdict.INCONCLUSIVE
    return SingleVerdict(verdict, k / n, lower, upper, n, method)


@dataclass(frozen=True, slots=True)
class EffectSizes:
    """Effect sizes of a drop from p_b to p_c (SPEC 3.4, paper Def. 3.8)."""

    difference: float
    cohens_h: float
    odds_ratio: float
    label: str


def effect_sizes(
    p_b: float, p_c: float, n_b: int | None = None, n_c: int | None = None
) -> EffectSizes:
    """Difference p_b - p_c, Cohen's h and the odds ratio, labelled by |h|.

    h = 2 asin(sqrt p_b) - 2 asin(sqrt p_c); |h| < 0.2 small, < 0.5 medium, else large.
    OR = (p_b/(1-p_b)) / (p_c/(1-p_c)). With the sample sizes the odds ratio is computed
    from the 2x2 counts, adding 0.5 to every cell when one is 0 (Haldane-Anscombe), so it
    stays finite; without them a zero cell gives inf, 0 or nan.
    """
    for name, p in (("p_b", p_b), ("p_c", p_c)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {p!r}")
    h = 2.0 * math.asin(math.sqrt(p_b)) - 2.0 * math.asin(math.sqrt(p_c))
    label = "small" if abs(h) < 0.2 else "medium" if abs(h) < 0.5 else "large"
    if n_b is not None and n_c is not None:
        cells = np.array([p_b * n_b, (1 - p_b) * n_b, p_c * n_c, (1 - p_c) * n_c])
        if np.any(np.isclose(cells, 0.0)):
            cells = cells + 0.5
        odds_ratio = float((cells[0] * cells[3]) / (cells[1] * cells[2]))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            num, den = np.float64(p_b) * (1 - p_c), np.float64(p_c) * (1 - p_b)
            odds_ratio = float(num / den)
    return EffectSizes(p_b - p_c, h, odds_ratio, label)


def sample_size(p_b: float, delta: float, alpha: float = 0.05, beta: float = 0.1) -> int:
    """Runs per arm to detect a drop of delta (SPEC Eq. 6, one-sided).

    n* = ceil((z_{1-alpha} + z_{1-beta})^2 (p_b q_b + p_c q_c) / delta^2), p_c = p_b - delta.
    This is the unpooled normal approximation; Fisher's exact test is conservative and
    needs somewhat more (see :func:`planned_sample_size`).
    """
    _check_level("alpha", alpha)
    _check_level("beta", beta)
    if not 0.0 < delta <= p_b <= 1.0:
        raise ValueError(f"need 0 < delta <= p_b <= 1, got p_b={p_b!r}, delta={delta!r}")
    p_c = p_b - delta
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - beta)
    n = z**2 * (p_b * (1 - p_b) + p_c * (1 - p_c)) / delta**2
    return max(1, math.ceil(float(n) - 1e-9))  # the epsilon absorbs float noise at integers


def fisher_pvalue(
    k_b: npt.ArrayLike, n_b: int, k_c: npt.ArrayLike, n_c: int
) -> npt.NDArray[np.float64]:
    """One-sided Fisher exact p-value for H1: p_c < p_b, vectorised over the counts.

    Conditional on the total t = k_b + k_c, K_c is hypergeometric (n_b + n_c, t, n_c) under
    H0 and p = P(K_c <= k_c); identical to ``fisher_exact(table, alternative="greater")``.
    """
    kb, kc = np.asarray(k_b), np.asarray(k_c)
    return np.asarray(stats.hypergeom.cdf(kc, n_b + n_c, kb + kc, n_c), dtype=np.float64)


def z_pvalue(k_b: npt.ArrayLike, n_b: int, k_c: npt.ArrayLike, n_c: int) -> npt.NDArray[np.float64]:
    """One-sided pooled two-proportion z-test p-value for H1: p_c < p_b, vectorised.

    z = (p_b - p_c) / sqrt(pbar (1-pbar) (1/n_b + 1/n_c)), p = 1 - Phi(z). When both arms
    are all-pass or all-fail there is no variation and no evidence: p = 1.
    """
    kb, kc = np.asarray(k_b, dtype=np.float64), np.asarray(k_c, dtype=np.float64)
    pooled = (kb + kc) / (n_b + n_c)
    se = np.sqrt(pooled * (1 - pooled) * (1 / n_b + 1 / n_c))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (kb / n_b - kc / n_c) / se
    return np.where(se > 0, stats.norm.sf(z), 1.0).astype(np.float64)


def _support(n: int, p: float) -> npt.NDArray[np.int64]:
    lo, hi = stats.binom.ppf(_TAIL, n, p), stats.binom.isf(_TAIL, n, p)
    return np.arange(int(np.nan_to_num(lo)), int(np.nan_to_num(hi, nan=n)) + 1)


@lru_cache(maxsize=4096)
def _power(p_b: float, n_b: int, p_c: float, n_c: int, alpha: float, test: str) -> float:
    kb, kc = _support(n_b, p_b), _support(n_c, p_c)
    if kb.size * kc.size <= EXACT_POWER_MAX_CELLS:
        # Exact: sum P(k_b) P(k_c) over the outcomes the test rejects.
        pvalue = fisher_pvalue if test == "fisher" else z_pvalue
        reject = pvalue(kb[:, None], n_b, kc[None, :], n_c) < alpha
        w = stats.binom.pmf(kb, n_b, p_b)[:, None] * stats.binom.pmf(kc, n_c, p_c)[None, :]
        return float(min(1.0, np.sum(w * reject)))
    # Normal approximation: pooled SE under H0, unpooled under H1; Fisher behaves like the
    # continuity-corrected z-test, so the drop is reduced by (1/n_b + 1/n_c)/2 for it.
    drop = p_b - p_c - ((1 / n_b + 1 / n_c) / 2 if test == "fisher" else 0.0)
    pooled = (n_b * p_b + n_c * p_c) / (n_b + n_c)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / n_b + 1 / n_c))
    se1 = math.sqrt(p_b * (1 - p_b) / n_b + p_c * (1 - p_c) / n_c)
    if se1 == 0.0:
        return 1.0 if drop > 0 else 0.0
    return float(stats.norm.cdf((drop - stats.norm.ppf(1 - alpha) * se0) / se1))


def planned_power(
    p_b: float,
    n_b: int,
    n_c: int,
    delta: float,
    alpha: float = 0.05,
    test: RegressionTest = "fisher",
) -> float:
    """Power of the one-sided test to detect p_c = p_b - delta with these sample sizes.

    This is the design's power at the *planned* effect, not "observed power" (which is a
    function of the p-value and says nothing new). p_c is clipped at 0 when p_b < delta.
    Exact (a sum over the binomial outcomes) up to :data:`EXACT_POWER_MAX_CELLS` outcome
    pairs, normal approximation beyond; results are cached.
    """
    _check_level("alpha", alpha)
    n_b, n_c = operator.index(n_b), operator.index(n_c)
    if n_b < 1 or n_c < 1:
        raise ValueError(f"sample sizes must be >= 1, got n_b={n_b}, n_c={n_c}")
    if not 0.0 <= p_b <= 1.0 or not delta > 0.0:
        raise ValueError(f"need p_b in [0, 1] and delta > 0, got p_b={p_b!r}, delta={delta!r}")
    if test not in REGRESSION_TESTS:
        raise ValueError(f"test must be one of {REGRESSION_TESTS}, got {test!r}")
    return _power(float(p_b), n_b, max(0.0, float(p_b) - delta), n_c, float(alpha), test)


def planned_sample_size(
    p_b: float,
    delta: float,
    alpha: float = 0.05,
    beta: float = 0.1,
    test: RegressionTest = "fisher",
) -> int:
    """Smallest equal n per arm whose :func:`planned_power` reaches 1-beta.

    Starts from Eq. 6 and walks; exact power saw-tooths with n, so a slightly larger n can
    occasionally have slightly less power. p_b=0.9, delta=0.1: Fisher 232, z 213 (Eq. 6 215).
    """
    n = sample_size(p_b, delta, alpha, beta)
    while n > 1 and planned_power(p_b, n - 1, n - 1, delta, alpha, test) >= 1 - beta:
        n -= 1
    while planned_power(p_b, n, n, delta, alpha, test) < 1 - beta:
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class RegressionVerdict:
    """Outcome of :func:`regression_verdict`; ``power`` is the planned power at delta."""

    verdict: Verdict
    p_value: float
    p_b: float
    p_c: float
    power: float
    effects: EffectSizes
    n_required: int
    test: str
    n_b: int
    n_c: int
    alpha: float
    beta: float
    delta: float


def decide_regression(
    p_value: float, drop: float, power: float, alpha: float, beta: float, delta: float
) -> Verdict:
    """SPEC 3.4: Fail if p < alpha and drop >= delta; Pass if p >= alpha and power >= 1-beta."""
    if p_value < alpha and drop >= delta - 1e-12:  # tolerance: k/n arithmetic at the edge
        return Verdict.FAIL
    if p_value >= alpha and power >= 1 - beta:
        return Verdict.PASS
    return Verdict.INCONCLUSIVE


def regression_verdict(
    k_b: int,
    n_b: int,
    k_c: int,
    n_c: int,
    alpha: float = 0.05,
    beta: float = 0.1,
    delta: float = 0.1,
    test: RegressionTest = "fisher",
) -> RegressionVerdict:
    """Regression verdict of a candidate (k_c of n_c) against a baseline (k_b of n_b).

    H0: p_c >= p_b, H1: p_c < p_b, one-sided Fisher exact (default) or pooled z-test.
    Fail if p < alpha and the observed drop >= delta (statistical and practical
    significance); Pass if p >= alpha and the design had power >= 1-beta to detect a drop
    of delta at the baseline's observed rate; else Inconclusive. ``n_required`` is Eq. 6
    at the observed baseline rate (0 when a drop of delta is impossible, p_b < delta).
    """
    k_b, n_b = _check_counts(k_b, n_b)
    k_c, n_c = _check_counts(k_c, n_c)
    _check_level("alpha", alpha)
    _check_level("beta", beta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    if test == "fisher":
        p_value = float(stats.fisher_exact([[k_b, n_b - k_b], [k_c, n_c - k_c]], "greater")[1])
    elif test == "z":
        p_value = float(z_pvalue(k_b, n_b, k_c, n_c))
    else:
        raise ValueError(f"test must be one of {REGRESSION_TESTS}, got {test!r}")
    p_b, p_c = k_b / n_b, k_c / n_c
    power = planned_power(p_b, n_b, n_c, delta, alpha, test)
    n_required = sample_size(p_b, delta, alpha, beta) if p_b >= delta else 0
    verdict = decide_regression(p_value, p_b - p_c, power, alpha, beta, delta)
    effects = effect_sizes(p_b, p_c, n_b, n_c)
    return RegressionVerdict(
        verdict, p_value, p_b, p_c, power, effects, n_required, test,
        n_b, n_c, alpha, beta, delta,
    )  # fmt: skip
