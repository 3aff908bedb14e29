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
* The regression rule (SPEC 3.4 with the errata of 2026-12-02) is two one-sided tests on
  the same counts. **Fail**: the one-sided Fisher exact test (or the pooled z-test) says the
  candidate is worse than the baseline, p < alpha (after Holm in a suite), and the data do
  not show the drop to be smaller than delta. **Pass**: the non-inferiority test says the
  candidate is no worse than baseline - delta (H0: p_c <= p_b - delta rejected at level
  beta), and the Fail test does not reject. Anything else is Inconclusive: too few runs to
  tell (neither test rejects), or a real drop shown to be smaller than delta (both reject).
* Why beta for the non-inferiority test: a Pass is the decision "deploy", and deploying a
  candidate that is delta worse is exactly the Type II error the gate promises to keep at
  beta. A suite deploys only if *every* stream passes, so by the intersection-union
  principle (Berger 1982) P(deploy | some stream regressed by >= delta) <= beta with no
  multiplicity correction at all; the correction (Holm, alpha/m) belongs to the Fail side
  only. The old rule ("observed drop >= delta" for Fail, "power >= 1 - beta" for Pass) blocks
  a true drop of exactly delta only about half the time and deploys it far more often than
  beta (measured 35% among 20 scenarios).
* The non-inferiority test is the Farrington-Manning score test for a difference with
  margin (restricted maximum likelihood variance under p_c = p_b - delta, closed form). It
  is asymptotic; its exact size is computed by :func:`noninferiority_power` (a sum over the
  binomial outcomes): at p = 0.9 it is 0.099-0.101 for 232-450 runs per arm, at most 0.104
  over p in [0.15, 0.999] for 232-450 runs per arm, 0.108 for 2,000 vs 50 and 0.124 for
  1,000 vs 30 at p near 1 (tests/analyzers/test_verdicts.py).
* Exact arithmetic: the observed difference k_c/n_c - k_b/n_b + delta is a fraction of
  integers (delta as written, ``Fraction(repr(delta))``), so 240/300 against 270/300 with
  delta 0.1 is exactly on the margin (z = 0), not "0.0999... < 0.1".
* Planning: :func:`planned_sample_size` (equal arms) and :func:`candidate_sample_size`
  (baseline fixed) give the smallest n at which the Fail test run at the *smallest level a
  stream can face*, alpha/m for a Holm family of m tests, has power 1 - beta at a drop of
  delta, and the Pass test passes an unchanged stream with probability >= 1 - alpha/m. At
  that n the two rejection regions meet (normal approximation: exactly), so an unchanged
  suite is held back only by a Holm rejection (probability <= alpha) or a rare outcome
  between the regions; a regression of delta deploys with probability <= beta at any n.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
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
#: Exact powers sum over k_b, with the test's rejection threshold in k_c for each k_b found
#: by a vectorised bisection (cached per sample sizes and level, so a new baseline rate costs
#: one pass over k_b): exact while n_b * log2(n_c + 2) <= this many p-value evaluations.
#: Beyond it the normal approximation is used (with Yates' continuity correction for
#: Fisher); at p_b=0.9, delta=0.1 and n = 100..1000 per arm it is within 0.012 of exact.
EXACT_POWER_MAX_CELLS = 4_000_000


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


def _exact_ok(n_b: int, n_c: int) -> bool:
    return (n_b + 1) * math.log2(n_c + 2) <= EXACT_POWER_MAX_CELLS


@lru_cache(maxsize=256)
def _thresholds(n_b: int, n_c: int, level: float, kind: str, delta: float = 0.0
                ) -> npt.NDArray[np.int64]:
    """For every k_b, the largest k_c the Fail test (``kind`` fisher or z) rejects at
    ``level`` (-1: none), or for ``kind="ni"`` the smallest k_c the non-inferiority test
    passes at ``level`` (n_c + 1: none). Both tests are monotone in k_c for fixed k_b, so a
    vectorised bisection finds them."""
    kb = np.arange(n_b + 1)
    if kind == "ni":
        crit = float(stats.norm.isf(level))

        def good(kc: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
            return np.asarray(noninferiority_z(kb, n_b, kc, n_c, delta) > crit)

        lo, hi = np.full(kb.size, -1), np.full(kb.size, n_c)  # good(hi) assumed, lo not
        ok_top = good(hi)
        while np.any(hi - lo > 1):
            mid = (lo + hi) // 2
            g = good(mid)
            hi, lo = np.where(g, mid, hi), np.where(g, lo, mid)
        return np.where(ok_top, hi, n_c + 1)
    pvalue = fisher_pvalue if kind == "fisher" else z_pvalue

    def rejects(kc: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return np.asarray(pvalue(kb, n_b, kc, n_c) < level)

    lo, hi = np.zeros(kb.size, dtype=np.int64), np.full(kb.size, n_c + 1)  # lo rejects?
    ok_bottom = rejects(lo)
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        r = rejects(mid)
        lo, hi = np.where(r, mid, lo), np.where(r, hi, mid)
    return np.where(ok_bottom, lo, -1)


@lru_cache(maxsize=4096)
def _power(p_b: float, n_b: int, p_c: float, n_c: int, alpha: float, test: str) -> float:
    if _exact_ok(n_b, n_c):
        # Exact: sum over k_b of P(k_b) P(K_c <= threshold(k_b)).
        c = _thresholds(n_b, n_c, alpha, test)
        w = stats.binom.pmf(np.arange(n_b + 1), n_b, p_b)
        return float(min(1.0, np.sum(w * stats.binom.cdf(c, n_c, p_c))))
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
    Exact (a sum over the binomial outcomes, see :data:`EXACT_POWER_MAX_CELLS`), normal
    approximation beyond; results are cached.
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


def noninferiority_z(
    k_b: npt.ArrayLike, n_b: int, k_c: npt.ArrayLike, n_c: int, delta: float
) -> npt.NDArray[np.float64]:
    """Farrington-Manning score statistic for H0: p_c <= p_b - delta, vectorised.

    z = (p_c_hat - p_b_hat + delta) / sqrt(~p_c ~q_c / n_c + ~p_b ~q_b / n_b), where ~p are the
    maximum likelihood estimates restricted to p_c = p_b - delta (the root of a cubic, in
    closed form: Farrington and Manning 1990, Miettinen and Nurminen 1985). Large z: the
    candidate is shown to be no worse than baseline - delta. One-sided p-value: ``norm.sf``.
    """
    kb = np.asarray(k_b, dtype=np.float64)
    kc = np.asarray(k_c, dtype=np.float64)
    p1, p2 = kc / n_c, kb / n_b  # 1: candidate, 2: baseline; H0 boundary p1 - p2 = s0
    s0 = -float(delta)
    theta = n_b / n_c
    a = 1.0 + theta
    b = -(1.0 + theta + p1 + theta * p2 + s0 * (theta + 2.0))
    c = s0 * s0 + s0 * (2.0 * p1 + theta + 1.0) + p1 + theta * p2
    d = -p1 * s0 * (1.0 + s0)
    v = b**3 / (3.0 * a) ** 3 - b * c / (6.0 * a * a) + d / (2.0 * a)
    u = np.sign(v) * np.sqrt(np.maximum(b * b / (3.0 * a) ** 2 - c / (3.0 * a), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(u != 0, v / u**3, 0.0)
    w = (math.pi + np.arccos(np.clip(ratio, -1.0, 1.0))) / 3.0
    pc = np.clip(2.0 * u * np.cos(w) - b / (3.0 * a), 0.0, 1.0)
    pb = np.clip(pc - s0, 0.0, 1.0)
    var = pc * (1.0 - pc) / n_c + pb * (1.0 - pb) / n_b
    diff = p1 - p2 - s0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, diff / np.sqrt(var), np.sign(diff) * np.inf)
    return np.asarray(z, dtype=np.float64)


def _exact_fraction(x: float) -> Fraction:
    """A level or margin as written (0.1 is 1/10, not the binary double nearest to it)."""
    return Fraction(repr(float(x)))


def noninferiority_pvalue(k_b: int, n_b: int, k_c: int, n_c: int, delta: float) -> float:
    """One-sided p-value of H0: p_c <= p_b - delta (small: non-inferior), for one table.

    The sign of the observed margin k_c/n_c - k_b/n_b + delta is decided in exact rational
    arithmetic: exactly on the margin the statistic is 0 and p = 0.5.
    """
    k_b, n_b = _check_counts(k_b, n_b)
    k_c, n_c = _check_counts(k_c, n_c)
    margin = Fraction(k_c, n_c) - Fraction(k_b, n_b) + _exact_fraction(delta)
    if margin == 0:
        return 0.5
    z = abs(float(noninferiority_z(k_b, n_b, k_c, n_c, delta)))
    return float(stats.norm.sf(z if margin > 0 else -z))


@lru_cache(maxsize=4096)
def _ni_power(p_b: float, n_b: int, p_c: float, n_c: int, delta: float, beta: float) -> float:
    crit = float(stats.norm.isf(beta))
    if _exact_ok(n_b, n_c):
        c = _thresholds(n_b, n_c, beta, "ni", delta)
        w = stats.binom.pmf(np.arange(n_b + 1), n_b, p_b)
        return float(min(1.0, np.sum(w * stats.binom.sf(c - 1, n_c, p_c))))
    # Normal approximation: the restricted variance at the truth's nearest boundary point.
    pb0 = min(1.0, max(delta, (n_b * p_b + n_c * (p_c + delta)) / (n_b + n_c)))
    se0 = math.sqrt(pb0 * (1 - pb0) / n_b + (pb0 - delta) * (1 - pb0 + delta) / n_c)
    se1 = math.sqrt(p_b * (1 - p_b) / n_b + p_c * (1 - p_c) / n_c)
    gap = p_c - p_b + delta
    if se1 == 0.0:
        return 1.0 if gap > crit * se0 else 0.0
    return float(stats.norm.cdf((gap - crit * se0) / se1))


def noninferiority_power(
    p_b: float, n_b: int, p_c: float, n_c: int, delta: float = 0.1, beta: float = 0.1
) -> float:
    """P(the non-inferiority test passes) when the true rates are p_b and p_c, exact.

    A sum over every outcome the test passes (see :data:`EXACT_POWER_MAX_CELLS`; normal
    approximation beyond it).
    At p_c = p_b - delta it is the test's exact size (the probability of deploying a
    regression of exactly delta); at p_c = p_b its power against no change.
    """
    _check_level("beta", beta)
    n_b, n_c = operator.index(n_b), operator.index(n_c)
    if n_b < 1 or n_c < 1:
        raise ValueError(f"sample sizes must be >= 1, got n_b={n_b}, n_c={n_c}")
    if not (0.0 <= p_b <= 1.0 and 0.0 <= p_c <= 1.0 and 0.0 < delta < 1.0):
        raise ValueError(f"need rates in [0, 1] and 0 < delta < 1, got {p_b!r}, {p_c!r}, {delta!r}")
    return _ni_power(float(p_b), n_b, float(p_c), n_c, float(delta), float(beta))


def _designed(p_b: float, n_b: int, n_c: int, delta: float, alpha: float, beta: float,
              tests: int, test: str) -> bool:
    level = alpha / tests
    p_c = max(0.0, p_b - delta)
    return (_power(p_b, n_b, p_c, n_c, level, test) >= 1 - beta
            and _ni_power(p_b, n_b, p_b, n_c, delta, beta) >= 1 - level)


def _smallest(ok: Callable[[int], bool], start: int, limit: int) -> int | None:
    """Smallest n in [start, limit] with ok(n), treating ok as monotone (exact powers
    saw-tooth by a run or two) by doubling and bisection; None when ok(limit) fails."""
    if not ok(limit):
        return None
    lo, hi = start - 1, start
    while not ok(hi):
        lo, hi = hi, min(limit, 2 * hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _check_plan(p_b: float, delta: float, alpha: float, beta: float, tests: int,
                test: str) -> int:
    _check_level("alpha", alpha)
    _check_level("beta", beta)
    if not 0.0 < delta <= p_b <= 1.0:
        raise ValueError(f"need 0 < delta <= p_b <= 1, got p_b={p_b!r}, delta={delta!r}")
    if test not in REGRESSION_TESTS:
        raise ValueError(f"test must be one of {REGRESSION_TESTS}, got {test!r}")
    tests = operator.index(tests)
    if tests < 1:
        raise ValueError(f"tests must be >= 1, got {tests}")
    return tests


def planned_sample_size(
    p_b: float,
    delta: float,
    alpha: float = 0.05,
    beta: float = 0.1,
    test: RegressionTest = "fisher",
    tests: int = 1,
) -> int:
    """Smallest equal n per arm at which the regression verdict keeps its error rates.

    ``tests`` is the size of the Holm family the stream's p-value joins (every pass-rate and
    fingerprint test of the suite). At the returned n: the Fail test at level alpha/tests
    has exact power >= 1 - beta at p_c = p_b - delta (Holm rejects at least where Bonferroni
    does), and the non-inferiority test passes an unchanged stream with exact probability
    >= 1 - alpha/tests. p_b = 0.9, delta = 0.1: 232 per arm alone (Eq. 6: 215), 446 among 20
    tests, 486 among 40 (20 streams with a fingerprint test each).
    """
    tests = _check_plan(p_b, delta, alpha, beta, tests, test)
    p_b = float(p_b)
    n = _smallest(lambda k: _designed(p_b, k, k, delta, alpha, beta, tests, test),
                  max(2, sample_size(p_b, delta, alpha, beta) // 2), 10_000_000)
    assert n is not None  # both powers tend to 1 with n
    return n


def planning_rate(k_b: int, n_b: int, delta: float, alpha: float = 0.05) -> float:
    """The baseline rate a candidate size is planned at: the least favourable value in the
    two-sided 1 - alpha Wilson interval of k_b / n_b (the one nearest 1/2 + delta/2, where
    the variance of a drop of delta is largest), so that the plan holds although the
    baseline's rate is itself an estimate."""
    lo, hi = wilson_interval(k_b, n_b, alpha)
    return float(min(max(0.5 + delta / 2, lo), hi))


def candidate_sample_size(
    k_b: int,
    n_b: int,
    delta: float,
    alpha: float = 0.05,
    beta: float = 0.1,
    test: RegressionTest = "fisher",
    tests: int = 1,
    limit: int = 1_000_000,
) -> int | None:
    """Candidate runs needed against a fixed baseline of k_b passes in n_b decided runs.

    The criterion of :func:`planned_sample_size` with n_b fixed, at :func:`planning_rate`
    (the baseline's own sampling counts twice: in the two-sample variance, and in the rate
    the plan assumes). None when no candidate size up to ``limit`` is enough: the baseline
    itself is too small (record more baseline runs).
    """
    k_b, n_b = _check_counts(k_b, n_b)
    p_plan = planning_rate(k_b, n_b, delta, alpha)
    if p_plan < delta:
        return None
    tests = _check_plan(p_plan, delta, alpha, beta, tests, test)
    return _smallest(lambda k: _designed(p_plan, n_b, k, delta, alpha, beta, tests, test),
                     1, limit)


@dataclass(frozen=True, slots=True)
class RegressionVerdict:
    """Outcome of :func:`regression_verdict`.

    ``p_value`` is the Fail test's (Fisher or z), ``ni_p_value`` the non-inferiority test's
    (H0: p_c <= p_b - delta); ``power`` is the Fail test's planned power at delta at level
    alpha (informative: the decision does not use it); ``n_required`` the candidate runs
    :func:`candidate_sample_size` asks for when the verdict is Inconclusive for lack of
    runs, else 0.
    """

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
    ni_p_value: float = 1.0
    k_b: int = 0
    k_c: int = 0


def decide_regression(p_value: float, ni_p_value: float, alpha: float, beta: float) -> Verdict:
    """Fail if the drop is significant (p < alpha) and not shown smaller than delta
    (ni_p >= beta); Pass if non-inferior (ni_p < beta) and not significantly worse; else
    Inconclusive (too few runs to tell, or a real drop shown smaller than delta)."""
    worse, within = p_value < alpha, ni_p_value < beta
    if worse and not within:
        return Verdict.FAIL
    if within and not worse:
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

    Fail test: H0 p_c >= p_b against p_c < p_b, one-sided Fisher exact (default) or pooled
    z-test, at alpha. Pass test: H0 p_c <= p_b - delta against p_c > p_b - delta
    (Farrington-Manning score, non-inferiority) at beta. Fail if only the first rejects,
    Pass if only the second does, else Inconclusive (module docstring). In a suite the
    Fail p-values are Holm-adjusted first (:func:`assaywatch.analyzers.suite.suite_verdict`).
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
    ni_p = noninferiority_pvalue(k_b, n_b, k_c, n_c, delta)
    p_b, p_c = k_b / n_b, k_c / n_c
    power = planned_power(p_b, n_b, n_c, delta, alpha, test)
    verdict = decide_regression(p_value, ni_p, alpha, beta)
    n_required = 0
    if verdict is Verdict.INCONCLUSIVE and ni_p >= beta:
        n_required = candidate_sample_size(k_b, n_b, delta, alpha, beta, test) or 0
    effects = effect_sizes(p_b, p_c, n_b, n_c)
    return RegressionVerdict(
        verdict, p_value, p_b, p_c, power, effects, n_required, test,
        n_b, n_c, alpha, beta, delta, ni_p, k_b, k_c,
    )  # fmt: skip
