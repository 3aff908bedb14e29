r"""Thresholds for the CUSUM charts from exact Markov-chain run lengths.

A CUSUM alarms when :math:`S_t = \max(0, S_{t-1} + x_t) \ge h`; its in-control average run
length ARL0 (observations between false alarms) is a monotone function of h, so the
threshold for an ARL0 target is found by bisection on h. The run length is computed, not
simulated, with the Markov chain of Brook & Evans (1972): the statistic's range
:math:`[0, h)` is cut into transient states, the alarm region is the absorbing state, and
the zero-start ARL is the first entry of :math:`(I - Q)^{-1} \mathbf{1}` where Q holds the
transition probabilities between transient states.

Bernoulli CUSUM (pass/fail stream)
----------------------------------
The log-likelihood-ratio increments take only two values, :math:`a = \log(p_1/p_0) < 0`
on a pass and :math:`b = \log((1-p_1)/(1-p_0)) > 0` on a fail. Following Reynolds &
Stoumbos (1999) both are scaled to integers on a lattice of unit u: the smaller magnitude
is ``m`` units (m >= 8) and the larger its ratio times m, rounded, with m chosen so the
ratio is matched within 0.2 %. The detector then *runs on the lattice* (integer state),
so the chain below is not an approximation of the detector but its exact law; the only
approximation is that the design ratio b/|a| is matched to 0.2 %, a negligible
mis-specification for a CUSUM (see the misspecification benchmark). The chain on states
0..H-1 is banded (one jump down by A units, one up by B), so ``solve_banded`` gives the
ARL in O(H * A * (A + B)) operations, a fraction of a millisecond.

Estimated baseline. When p0 is the pass rate of a finite baseline (x passes of n runs),
the true in-control rate p is uncertain. The chain's ARL is non-decreasing in the true pass
rate (a higher pass rate is stochastically fewer up-jumps, coupling argument), so with
:math:`q` the one-sided Clopper-Pearson lower confidence bound of level c,
:math:`q = \mathrm{Beta}^{-1}(1 - c;\ x,\ n - x + 1)` (0 when x = 0), for which
:math:`P_p(q \le p) \ge c` at every p,

    ARL0(h; q) >= target   =>   P_p( ARL0(h; p) >= target ) >= c   over baselines, every p.

Calibrating the chart (its llr uses the plug-in estimate) under the true rate q is exact:
no Monte Carlo error, and the guarantee is frequentist over the baselines one could have
drawn (``verdicts.clopper_pearson_interval``, one-sided). The Jeffreys posterior
quantile used before (:math:`\mathrm{Beta}^{-1}(1 - c;\ x + 1/2,\ n - x + 1/2)`,
SPEC's posterior recipe) is slightly less conservative; its coverage over baselines
oscillates around c: exact misses of 0.037-0.062 where 0.05 is allowed, at 200-run
baselines and c = 0.95 (``tests/analyzers/detectors/test_bernoulli_cusum.py``).
Clopper-Pearson's are 0.026-0.043; its threshold costs 7-12% of the delay at a drop of
0.1 with 200-run baselines and under 1% with 2,000.

Gaussian CUSUM (standardised fingerprint features)
--------------------------------------------------
For :math:`S_t = \max(0, S_{t-1} + z_t - k)` with z standard normal, optionally
winsorised to [-c, c], the Brook-Evans chain uses M states of width w = 2h / (2M - 1)
(state j stands for the value j w) and Richardson extrapolation over M and 2M removes
the O(1/M^2) discretisation error (checked against simulation in the tests).

References
----------
Brook, D. & Evans, D. A. (1972). An approach to the probability distribution of CUSUM
run length. Biometrika 59(3), 539-549.
Reynolds, M. R. & Stoumbos, Z. G. (1999). A CUSUM chart for monitoring a proportion
when inspecting continuously. Journal of Quality Technology 31(1), 87-108.
Page, E. S. (1954). Continuous inspection schemes. Biometrika 41(1/2), 100-115.

Examples
--------
>>> h = bernoulli_cusum_threshold(0.9, 0.8, arl0=10_000)
>>> round(h, 2)  # SPEC.md quotes 5.64 from simulation
5.6
>>> round(bernoulli_cusum_arl(0.8, 0.9, 0.8, h))  # detection delay from a fresh start (SPEC: ~110)
111
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import linalg, optimize, special, stats

from assaywatch.analyzers.verdicts import clopper_pearson_interval

__all__ = [
    "bernoulli_lattice",
    "bernoulli_cusum_arl",
    "bernoulli_cusum_threshold",
    "gaussian_cusum_arl",
    "gaussian_cusum_threshold",
]

_MIN_UNITS = 8
_RATIO_TOL = 2e-3
_MAX_STATES = 200_000
#: Thresholds above this (in llr units) detect nothing in useful time (a 0.1 drop of the
#: pass rate adds about 0.05 per run): the calibration refuses them quickly instead.
_MAX_H = 60.0


def _check_rates(p0: float, p1: float) -> None:
    if not (0.0 < p0 < 1.0):
        raise ValueError(
            f"p0={p0!r} must lie strictly between 0 and 1; for a baseline with all passes "
            "use the Jeffreys estimate (passes + 0.5) / (runs + 1)"
        )
    if not (0.0 < p1 < p0):
        raise ValueError(f"p1={p1!r} must satisfy 0 < p1 < p0={p0!r} (a drop in pass rate)")


def _check_arl0(arl0: float) -> None:
    if not (arl0 > 1.0 and math.isfinite(arl0)):
        raise ValueError(f"arl0={arl0!r} must be a finite number of runs > 1, e.g. 10_000")


@lru_cache(maxsize=4096)
def _lattice(p0: float, p1: float) -> tuple[float, int, int]:
    a = math.log(p1 / p0)
    b = math.log((1.0 - p1) / (1.0 - p0))
    small, big = min(-a, b), max(-a, b)
    ratio = big / small
    best_m, best_err = _MIN_UNITS, math.inf
    for m in range(_MIN_UNITS, 2000):
        err = abs(round(ratio * m) / m - ratio) / ratio
        if err < best_err:
            best_m, best_err = m, err
        if err <= _RATIO_TOL:
            break
    n_big = round(ratio * best_m)
    unit = small / best_m
    if -a <= b:
        return unit, -best_m, n_big
    return unit, -n_big, best_m


def bernoulli_lattice(p0: float, p1: float) -> tuple[float, int, int]:
    """Lattice ``(unit, step_pass, step_fail)`` of the Bernoulli CUSUM designed for p0 -> p1.

    ``unit * step_pass`` approximates log(p1/p0) and ``unit * step_fail`` approximates
    log((1-p1)/(1-p0)); their ratio is matched within 0.2 % (module docstring).
    """
    _check_rates(p0, p1)
    return _lattice(round(p0, 9), round(p1, 9))


def _arl_states(p_true: float, step_pass: int, step_fail: int, n_states: int) -> float:
    """Zero-start ARL of the integer CUSUM with transient states 0..n_states-1."""
    big_h, down, up = n_states, -step_pass, step_fail
    q = 1.0 - p_true
    ab = np.zeros((down + up + 1, big_h))
    ab[up, :] = 1.0
    # pass from state i goes to max(0, i - down): column i - down, or column 0 for i < down
    ab[up, 0] -= p_true
    rows = np.arange(1, min(down, big_h))
    ab[up + rows, 0] = -p_true
    if big_h > down:
        ab[up + down, : big_h - down] = -p_true
    # fail from state i goes to i + up (absorbed when >= H)
    if big_h > up:
        ab[0, up:] = -q
    arl = linalg.solve_banded((down, up), ab, np.ones(big_h), check_finite=False)
    return float(arl[0])


def bernoulli_cusum_arl(p_true: float, p0: float, p1: float, h: float) -> float:
    """Zero-start average run length of the Bernoulli CUSUM designed for (p0, p1) at h.

    Parameters
    ----------
    p_true:
        The actual pass probability of the stream (p0 for ARL0, the shifted rate for the
        detection delay).
    p0, p1:
        Design rates defining the llr increments.
    h:
        Threshold; alarm when S >= h. The detector's lattice state counts units of
        ``bernoulli_lattice(p0, p1)[0]``.
    """
    _check_rates(p0, p1)
    if not (0.0 <= p_true <= 1.0):
        raise ValueError(f"p_true={p_true!r} must be a probability in [0, 1]")
    unit, step_pass, step_fail = bernoulli_lattice(p0, p1)
    n_states = max(1, math.ceil(h / unit - 1e-9))
    if n_states > _MAX_STATES:
        raise ValueError(f"h={h!r} needs {n_states} lattice states; use h < 100")
    if p_true >= 1.0:
        return math.inf
    return _arl_states(p_true, step_pass, step_fail, n_states)


@lru_cache(maxsize=4096)
def _threshold_units(p_true: float, p0: float, p1: float, arl0: float) -> tuple[int, float]:
    unit, step_pass, step_fail = bernoulli_lattice(p0, p1)

    def arl(states: int) -> float:
        return _arl_states(p_true, step_pass, step_fail, states)

    lo, hi = 1, step_fail  # ARL(1 state) = one fail alarms
    if arl(lo) >= arl0:
        return lo, unit
    while arl(hi) < arl0:
        lo, hi = hi, hi * 2
        if hi * unit > _MAX_H:
            raise ValueError(
                f"arl0={arl0!r} needs a threshold above {_MAX_H:g} for p0={p0!r}, p1={p1!r} "
                f"under p={p_true!r}: the baseline is too small (or delta too small) for a "
                "useful CUSUM; use a larger baseline or delta"
            )
        if hi > _MAX_STATES:
            raise ValueError(
                f"arl0={arl0!r} is unreachable for p0={p0!r}, p1={p1!r} under p={p_true!r}: "
                "the in-control drift is not negative; use a larger delta"
            )
    log_target = math.log(arl0)
    log_lo, log_hi = math.log(arl(lo)), math.log(arl(hi))
    while hi - lo > 1:  # invariant: arl(lo) < arl0 <= arl(hi)
        # log ARL is nearly linear in h: interpolate, kept strictly inside the bracket
        frac = (log_target - log_lo) / (log_hi - log_lo)
        mid = min(hi - 1, max(lo + 1, lo + round(frac * (hi - lo))))
        log_mid = math.log(arl(mid))
        if log_mid >= log_target:
            hi, log_hi = mid, log_mid
            if mid - 1 > lo and math.log(arl(mid - 1)) < log_target:
                lo = mid - 1  # converged: mid is the smallest state count meeting it
                break
        else:
            lo, log_lo = mid, log_mid
            if mid + 1 < hi and math.log(arl(mid + 1)) >= log_target:
                hi = mid + 1
                break
    return hi, unit


def bernoulli_cusum_threshold(
    p0: float,
    p1: float,
    arl0: float,
    baseline_runs: int | None = None,
    baseline_passes: int | None = None,
    confidence: float = 0.9,
) -> float:
    """Threshold h of the Bernoulli CUSUM for an in-control ARL0 target.

    Parameters
    ----------
    p0, p1:
        Design pass rates (p1 < p0); p0 is the plug-in baseline rate when a baseline is
        given.
    arl0:
        Target in-control average run length, in runs.
    baseline_runs, baseline_passes:
        Size and passes of the baseline p0 was estimated from; both or neither. With them,
        h guarantees ARL0 >= arl0 with probability at least ``confidence`` over the
        baselines (the Clopper-Pearson lower bound, exact via the monotonicity argument of
        the module docstring).
    confidence:
        Probability over baselines of meeting the target, in (0, 1).

    Returns
    -------
    float
        The smallest lattice threshold meeting the target, returned as the midpoint
        between the last non-alarming and the first alarming lattice value (so float
        round-off cannot move the alarm by one state).
    """
    _check_rates(p0, p1)
    _check_arl0(arl0)
    p_true = p0
    if (baseline_runs is None) != (baseline_passes is None):
        raise ValueError("give both baseline_runs and baseline_passes, or neither")
    if baseline_runs is not None and baseline_passes is not None:
        if baseline_runs < 1 or not (0 <= baseline_passes <= baseline_runs):
            raise ValueError(
                f"baseline_passes={baseline_passes!r} must lie in [0, baseline_runs="
                f"{baseline_runs!r}] with baseline_runs >= 1"
            )
        if not (0.0 < confidence < 1.0):
            raise ValueError(f"confidence={confidence!r} must lie strictly between 0 and 1")
        p_true = clopper_pearson_interval(baseline_passes, baseline_runs, 1.0 - confidence,
                                          sided="lower")[0]
    states, unit = _threshold_units(
        round(p_true, 9), round(p0, 9), round(p1, 9), float(round(arl0, 6))
    )
    return (states - 0.5) * unit


def _gaussian_arl_m(h: float, k: float, mu: float, clip: float, m: int) -> float:
    """Brook-Evans ARL with m states; the increment is clip(z) - k with z ~ N(mu, 1)."""
    w = 2.0 * h / (2 * m - 1)
    i = np.arange(m)[:, None]
    j = np.arange(m)[None, :]

    def cdf(v: np.ndarray) -> np.ndarray:
        # P(clip(z) <= v): Phi(v - mu) on [-clip, clip), 0 below, 1 from clip on
        out: np.ndarray = special.ndtr(v - mu)
        out = np.where(v < -clip, 0.0, out)
        return np.where(v >= clip, 1.0, out)

    upper = cdf((j + 0.5 - i) * w + k)
    lower = np.where(j == 0, 0.0, cdf((j - 0.5 - i) * w + k))
    arl = np.linalg.solve(np.eye(m) - (upper - lower), np.ones(m))
    return float(arl[0])


def gaussian_cusum_arl(h: float, k: float, mu: float = 0.0, clip: float = math.inf) -> float:
    """Zero-start ARL of the one-sided CUSUM ``S = max(0, S + clip(z) - k)``, z ~ N(mu, 1).

    ``clip`` winsorises the standardised input to [-clip, clip] before the update
    (``math.inf`` disables it). Brook-Evans chain with Richardson extrapolation over 150
    and 300 states (the midpoint rule's error is O(1/M^2)).
    """
    if not h > 0:
        raise ValueError(f"h={h!r} must be > 0")
    coarse = _gaussian_arl_m(h, k, mu, clip, 150)
    fine = _gaussian_arl_m(h, k, mu, clip, 300)
    return (4.0 * fine - coarse) / 3.0


@lru_cache(maxsize=1024)
def _gaussian_threshold(k: float, arl0: float, clip: float) -> float:
    def gap(h: float) -> float:
        return math.log(gaussian_cusum_arl(h, k, 0.0, clip)) - math.log(arl0)

    lo, hi = 0.05, 2.0
    while gap(hi) < 0:
        lo, hi = hi, hi * 2
        if hi > 200:
            raise ValueError(f"arl0={arl0!r} unreachable with k={k!r}")
    return float(optimize.brentq(gap, lo, hi, xtol=1e-4))


def gaussian_cusum_threshold(k: float, arl0: float, clip: float = math.inf) -> float:
    """Threshold h of the one-sided standard-normal CUSUM with reference k for ARL0.

    Examples
    --------
    >>> round(gaussian_cusum_threshold(0.5, 930.9), 2)
    5.0
    >>> round(gaussian_cusum_arl(5.0, 0.5) / 2)  # two-sided h=5, k=0.5: 465 (Montgomery)
    465
    """
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"k={k!r} must be a positive finite reference value, e.g. 0.25")
    _check_arl0(arl0)
    if not clip > 0:
        raise ValueError(f"clip={clip!r} must be > 0 (math.inf disables winsorising)")
    return _gaussian_threshold(round(k, 9), float(round(arl0, 6)), float(clip))



@lru_cache(maxsize=1024)
def _estimated_threshold(k: float, arl0: float, clip: float, n: int, confidence: float) -> float:
    # Standardising by a baseline of n runs: the chart's input is z ~ N(mu, s^2) with the
    # mean error mu ~ N(0, 1/n) and s^2 = sigma^2 / sigma_hat^2 ~ (n-1) / chi2(n-1). Take
    # both at their `confidence` quantile (the adverse side), and rescale the chart to unit
    # variance: ARL(h, k, mu, s) = ARL(h/s, k/s, mu/s, clip/s).
    mu = float(stats.norm.ppf(confidence)) / math.sqrt(n)
    s = math.sqrt((n - 1) / float(stats.chi2.ppf(1.0 - confidence, n - 1)))
    if mu >= k:
        # the adverse mean error alone drifts the chart upward: no h keeps the target
        raise ValueError(
            f"a {n}-run baseline is too small for k={k!r}: its mean error at confidence "
            f"{confidence} ({mu:.3f} sd) reaches k; use a baseline of at least "
            f"{math.ceil((float(stats.norm.ppf(confidence)) / k) ** 2) + 1} runs")

    def gap(h: float) -> float:
        arl = gaussian_cusum_arl(h / s, k / s, mu / s, clip / s)
        return math.log(arl) - math.log(arl0)

    lo, hi = 0.05, 2.0
    while gap(hi) < 0:
        lo, hi = hi, hi * 2
        if hi > 128:
            raise ValueError(f"arl0={arl0!r} unreachable with k={k!r} and a {n}-run baseline")
    return float(optimize.brentq(gap, lo, hi, xtol=1e-4))


def gaussian_cusum_threshold_estimated(k: float, arl0: float, baseline_runs: int,
                                       confidence: float = 0.9,
                                       clip: float = math.inf) -> float:
    """Threshold h of a one-sided CUSUM standardised by a baseline *estimate*.

    The plug-in threshold assumes the baseline mean and sd are exact; from a finite
    baseline of n runs each standardised input is off by a mean error ~ N(0, 1/n) and a
    scale error sqrt((n-1)/chi2_{n-1}). This h keeps ARL0 >= ``arl0`` when both errors sit at
    their adverse ``confidence`` quantile, so the target holds with about that probability
    per chart (the mean error at the adverse side of zero has probability 1 - confidence of
    being worse; the scale error likewise). Larger baselines give a smaller h.

    Examples
    --------
    >>> h_known = gaussian_cusum_threshold(0.25, 1e5, 3.0)
    >>> h_200 = gaussian_cusum_threshold_estimated(0.25, 1e5, 200, 0.9, 3.0)
    >>> h_2000 = gaussian_cusum_threshold_estimated(0.25, 1e5, 2000, 0.9, 3.0)
    >>> h_known < h_2000 < h_200
    True
    """
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"k={k!r} must be a positive finite reference value, e.g. 0.25")
    _check_arl0(arl0)
    if baseline_runs < 3:
        raise ValueError(f"baseline_runs={baseline_runs!r} must be at least 3")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence={confidence!r} must lie in [0.5, 1)")
    return _estimated_threshold(round(k, 9), float(round(arl0, 6)), float(clip),
                                int(baseline_runs), round(float(confidence), 6))
