r"""Thresholds of a stream's alarming detectors from its own baseline (one ARL0 budget).

What it computes
----------------
:func:`calibrate` turns a frozen baseline (counts, fingerprint mean and covariance, and a
sample of its runs' fingerprints) into the thresholds of the two alarming detectors so
that the union of their alarms keeps one in-control ARL0 budget: a detector with share
:math:`s_i` of the budget gets ARL0 ``arl0 / s_i`` (false-alarm rates add, Bonferroni in
time, ``base.split_arl0``), each with confidence :math:`c' = (1 + c) / 2` over the
baseline's sampling so both hold together with probability at least c (union bound).

* Pass rate (``BernoulliCUSUM``): exact Markov chain of the lattice detector at the
  level-:math:`c'` Clopper-Pearson lower bound of the pass rate (``calibration``: the
  guarantee over baselines is exact at every true rate); pass/fail outcomes
  are Bernoulli whatever the agent, so nothing is gained by resampling them. The rate the
  chart is designed for is chosen between that quantile and the estimate to minimise the
  exact delay at a drop of delta (:func:`_pass_rate`).
* Fingerprint (``MultichartCUSUM``), from the data actually seen, in the spirit of
  Gandy & Kvaloy's guaranteed conditional performance. The empirical law of the sampled
  baseline runs :math:`\hat P` plays the truth; B bootstrap baselines (multinomial weights
  summing to the baseline's size N) give the chart parameters
  :math:`\xi^*_b = (\mu^*_b, \Sigma^*_b)` one would have estimated; the in-control
  increments of chart j of bootstrap b are :math:`X = \pm y_j - k` over the rows of
  :math:`\hat P`. A CUSUM with i.i.d. increments X has, for large h,

  .. math::

      \mathrm{ARL}(h) \approx \frac{e^{\theta (h + \rho)} - 1 - \theta (h + \rho)}
      {-\theta\, \mathrm{E}X}, \quad \mathrm{E}\, e^{\theta X} = 1,\ \theta \ne 0,
      \quad \rho = 1.166\, \mathrm{sd}(X)

  (Siegmund 1985: the adjustment coefficient :math:`\theta` of the *empirical* increment
  law carries its skewness and discreteness; the Gaussian case is exact to this
  approximation). The charts fall in kinds of change (:func:`chart_kinds`: a feature, a
  swap between two tools, every call's latency), and the g kinds present share the budget
  equally: chart j of kind k gets the weight :math:`w_j = 2m / (g\,m_k)`, :math:`m_k` the
  charts of its kind, and the part :math:`w_j / 2m` of its group's rate. The features and
  swaps form one group, the latency chart another: the latency law is fitted on every call
  of the baseline, far better known than the others' (a union bound over the two groups,
  the confidence's complement split in proportion to their charts; with 200-run baselines
  the latency delay went from 4.9x to 1.8x the oracle's). Within group G, at its
  confidence :math:`c_G = 1 - (1 - c') |G| / 2m`, thresholds :math:`h_j(L)` giving ARL
  :math:`e^L` under the estimated chart on :math:`\hat P`:

  1. each chart's own level :math:`L_j`: the smallest at which the :math:`c_G` quantile
     over b of its own rate :math:`1/\mathrm{ARL}_{b,j}(h_j(L_j))` is at most its part of
     G's budget. A chart that no level within 30 nats brings there (its increments may
     drift upwards in control, and the baseline cannot tell) is switched off: threshold
     :data:`_OFF_H`;
  2. one offset D of either sign for the whole group: the smallest at which the
     :math:`c_G` quantile of the group's summed rate at levels
     :math:`\max(L_j + D, \ell_j)` is at most its kinds' part of
     :math:`s / \mathrm{arl0}`, with :math:`\ell_j = \log(\mathrm{arl0} / s) - \log w_j`
     the plug-in level no chart goes below.

  Step 1 sets each chart by its own estimation noise. With one common level, the noisiest
  chart (a swap between rare tools whose adjustment coefficient fell below 0 in 5% of the
  bootstrap baselines) set every threshold: the swapped pair's went from 8 to 10-15 nats,
  and the tool-swap delay from 2.3x to 3.0x the oracle's (2,000 runs) and 3.0x to 6.1x
  (200). Step 2 keeps one joint quantile, so that the estimation noises of the ~20 feature
  charts and the swaps partly cancel. The charts on the call counts and the latency chart
  (``latency.py``; refitted on each bootstrap baseline's weights) enter with the law of
  their per-run likelihood ratios over the rows. The swap charts' ratios of call shares
  are each bootstrap baseline's lower confidence bounds at the confidence ``conf``
  (``toolcounts.swap_ratios``), the plug-in baseline's go to the chart
  (:attr:`Thresholds.swap_ratios`): a baseline that overestimates a ratio makes the
  chart drift upwards in control, and its threshold had to absorb that.

Pure and deterministic given ``seed`` (the engine derives it from the baseline id),
vectorised numpy: about 0.1-0.2 s per stream at the defaults (``bench_detectors.py``;
median 0.15 s on a 2,000-run sample, 0.11 s before the per-chart levels).

Parameters
----------
data:
    :class:`BaselineData`: the baseline's numbers and a sample of its fingerprints.
settings:
    :class:`CalibrationSettings`: arl0, shares, confidence, k, delta, reps.
seed:
    Seed of the bootstrap.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(5)
>>> x = rng.standard_normal((500, 3))
>>> data = BaselineData(mean=x.mean(0), cov=np.cov(x, rowvar=False), n_runs=500,
...                     passes=450, fails=50, sample=x)
>>> th = calibrate(data, CalibrationSettings(arl0=1_000), seed=1)
>>> th.fingerprint.shape[0], round(th.pass_rate, 1)
(2, 4.3)

References
----------
Gandy, A. & Kvaloy, J. T. (2013). Guaranteed conditional performance of control charts
via bootstrap methods. Scand. J. Statist. 40, 647-668.
Siegmund, D. (1985). Sequential Analysis: Tests and Confidence Intervals. Springer.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.detectors import latency
from assaywatch.analyzers.detectors.calibration import (
    bernoulli_cusum_arl,
    bernoulli_cusum_threshold,
)
from assaywatch.analyzers.detectors.multichart import (
    RUN_CLIP,
    MultichartCUSUM,
    projection,
    shift_directions,
)
from assaywatch.analyzers.detectors.score import ScoreSummary, best_lambda
from assaywatch.analyzers.detectors.siegmund import _adjustment, cusum_arl, cusum_h
from assaywatch.analyzers.detectors.toolcounts import (
    ratio_weights,
    run_ratio_llr,
    swap_llr,
    swap_ratios,
    tool_counts,
)
from assaywatch.analyzers.verdicts import clopper_pearson_interval

__all__ = ["BaselineData", "CalibrationSettings", "Thresholds", "calibrate", "cusum_arl"]

F64 = NDArray[np.float64]
_MAX_H = 200.0
#: the threshold of a chart switched off (:func:`_chart_levels`)
_OFF_H = 1e9
_LEVEL_SPAN = 30.0
_BINS = 240
#: fewest baseline runs the fingerprint chart is calibrated on (and twice the features)
_MIN_RUNS = 30
#: baseline size from which the fingerprint draws ``reps`` bootstrap baselines; a smaller
#: one draws up to ``_MAX_REPS_FACTOR`` times as many (:func:`fingerprint_reps`)
_FULL_REPS_RUNS = 2_000
_MAX_REPS_FACTOR = 5


def fingerprint_reps(reps: int, n_runs: int) -> int:
    """Bootstrap baselines the fingerprint's thresholds are set on, for a baseline of
    ``n_runs`` runs: ``reps`` from 2,000 runs, ``reps * 2000 / n_runs`` below (at most 5x).

    The level-c quantile of B bootstrap rates, interpolated between the top draws, covers
    on average less than c (its order statistic about k / (B + 1)), and the cost of that
    shortfall grows with the rates' spread over baselines, i.e. as the baseline shrinks.
    Measured on the realistic world (``python -m tests.benchmarks decile``, 40 streams x
    20,000 in-control runs): with 200-run baselines and B = 40 the share of baselines whose
    fingerprint ARL0 fell below its target was 0.16 (gamma fit; 95% interval 0.08-0.24)
    where 0.05 is allowed, with B = 200 0.025 (0.003-0.056); with 2,000 and 10,000 runs
    and B = 40 it is 0.00. The work, sample rows x B, stays at most the 2,000-run one's."""
    scale = _FULL_REPS_RUNS / max(1, n_runs)
    return int(min(reps * _MAX_REPS_FACTOR, max(reps, math.ceil(reps * scale))))


@dataclass(frozen=True)
class BaselineData:
    """What :func:`calibrate` needs of a baseline: its counts and fingerprint moments and a
    sample (rows = runs, columns = the baseline's features) of its runs' fingerprints."""

    mean: F64
    cov: F64
    n_runs: int
    passes: int
    fails: int
    sample: F64
    feature_names: Sequence[str] | None = None
    #: the baseline's evaluators (graded scores), for the score detectors' thresholds
    evaluators: Mapping[str, ScoreSummary] = field(default_factory=dict)
    #: the baseline's labelling evaluators (categorical labels, ``detectors/label.py``);
    #: an evaluator in ``evaluators`` too is monitored by its scores
    labels: Mapping[str, Any] = field(default_factory=dict)
    #: the kinds of calls of the latency chart and, per sampled run (rows of ``sample``),
    #: their sums (``latency.stats_vector``); None: no latency chart
    latency_kinds: Sequence[str] = ()
    latency_sample: F64 | None = None


@dataclass(frozen=True)
class CalibrationSettings:
    """Budget and detector settings (the engine builds them from its DetectorConfig)."""

    arl0: float = 10_000.0
    confidence: float = 0.9
    shares: Mapping[str, float] = field(
        default_factory=lambda: {"cusum_pass_rate": 0.5, "cusum_fingerprint": 0.5})
    k: float = 0.25
    delta: float = 0.1
    reps: int = 40
    clip: float = 3.0
    #: the drop of a mean score (fraction of its scale) the score detectors are tuned for
    score_shift: float = 0.1
    #: tool-swap charts on the call counts' likelihood ratio (``toolcounts.py``): only for
    #: a sample of real runs' fingerprints (counts are exact there, not in Gaussian draws)
    tool_counts: bool = False
    #: fraction of a tool's calls a swap chart on the counts is designed for
    tool_shift: float = 0.2
    #: the factor of every call's latency the latency chart is designed for
    latency_factor: float = 1.25


@dataclass(frozen=True)
class Thresholds:
    """Calibrated thresholds: ``pass_rate`` (nats, None without decided outcomes or share)
    and ``fingerprint`` (2, m) (None without share or directions; a chart switched off has
    ``_OFF_H``); ``level`` is the least log ARL of a fingerprint chart under the plug-in
    law (infinite when every chart is off), ``confidence`` the per-detector one."""

    pass_rate: float | None
    fingerprint: F64 | None
    #: the in-control pass rate the pass-rate CUSUM is designed for (its p0)
    pass_rate_p0: float = math.nan
    level: float = math.nan
    confidence: float = math.nan
    #: detector -> why it has no threshold for this baseline
    disabled: Mapping[str, str] = field(default_factory=dict)
    #: evaluator -> the threshold (nats) of its score detector (``score_threshold``) or of
    #: its label detector (``label.label_threshold``)
    scores: Mapping[str, float] = field(default_factory=dict)
    #: the fingerprint thresholds are for swap charts on the call counts (``toolcounts``)
    tool_counts: bool = False
    #: the latency chart's kinds and model (a, b, sigma^2 per kind, ``latency.fit`` on the
    #: baseline's sample), when the fingerprint thresholds include it (the last chart)
    latency: tuple[tuple[str, ...], F64] | None = None
    #: the swap charts' ratios of call shares (2, pairs), ``toolcounts.swap_ratios``; None:
    #: from the baseline mean's shares
    swap_ratios: F64 | None = None


def _chart_h(level: float | F64, theta: F64, mu: F64, sd: F64, h_min: float | F64) -> F64:
    """Per chart, the h with ARL e^level (Siegmund's formula inverted, ``cusum_h``), within
    [``h_min``, :data:`_MAX_H`]: ``h_min`` where no h gives it (the formula is negative or
    infinite at every h), :data:`_MAX_H` where none below it does."""
    h = cusum_h(np.asarray(level, dtype=np.float64), theta, mu, sd)
    out: F64 = np.clip(np.where(np.isnan(h), -np.inf, h), h_min, _MAX_H)
    return out


def _latency_model(data: BaselineData) -> tuple[tuple[str, ...], F64] | None:
    """The latency chart's kinds and model fitted on the whole sample, if it has one."""
    lat = data.latency_sample
    if lat is None or not len(data.latency_kinds) or lat.shape[0] != data.sample.shape[0]:
        return None
    n = lat.shape[0]
    return tuple(data.latency_kinds), latency.fit(lat, np.full(n, 1.0 / n))


def _fingerprint(data: BaselineData, s: CalibrationSettings, share: float, conf: float,
                 rng: np.random.Generator
                 ) -> tuple[F64 | None, float, tuple[tuple[str, ...], F64] | None,
                            F64 | None]:
    lat_model = _latency_model(data)
    det = MultichartCUSUM(data.mean, data.cov, k=s.k, h=1.0, clip=s.clip,
                          feature_names=data.feature_names, tool_counts=s.tool_counts,
                          tool_shift=s.tool_shift, latency=lat_model,
                          latency_factor=s.latency_factor)
    x = np.asarray(data.sample, dtype=np.float64)
    m = len(det.labels)
    if m == 0 or x.shape[0] < 2:
        return None, math.nan, None, None
    mean = np.asarray(data.mean, dtype=np.float64)
    sd0 = np.sqrt(np.clip(np.diag(np.asarray(data.cov)), 0.0, None))
    labels, vecs = shift_directions(det.feature_labels, mean, sd0, det.min_sd,
                                    det.max_swap_tools)
    # the swap charts on the call counts have no projection: a zero row, law replaced below
    zero = np.zeros((1, mean.size))
    vecs = np.vstack([vecs, zero])[[labels.index(lab) if lab in labels and j not in det._swap
                                    else len(labels) for j, lab in enumerate(det.labels)]]
    # The projections y are clipped to [-clip, clip]: their law is kept as a histogram of
    # _BINS bins per chart (bin centres as values), which makes every mgf evaluation below
    # cost (reps, charts, bins) instead of (reps, charts, runs).
    edges = np.linspace(-s.clip, s.clip, _BINS + 1)
    centres = (edges[:-1] + edges[1:]) / 2.0
    offsets = np.arange(m)[:, None] * _BINS
    n, big_n = x.shape[0], max(data.n_runs, 2)

    scale = _BINS / (2 * s.clip)

    def histogram(centre: F64, proj: F64) -> F64:
        # einsum, not BLAS: these products are small and a threaded BLAS spends more time
        # waking its threads than computing
        idx = np.einsum("nd,md->mn", x - centre, proj * scale) + _BINS / 2  # (m, n), in bins
        np.clip(idx, 0, _BINS - 1, out=idx)
        counts = np.bincount((idx.astype(np.int64) + offsets).ravel(), minlength=m * _BINS)
        h: F64 = counts.reshape(m, _BINS) / n
        return h

    hists = [histogram(mean, det.projections)]
    weights_b = [np.full(n, 1.0 / n)]
    for _ in range(fingerprint_reps(s.reps, big_n)):
        # a bootstrap baseline of the baseline's size: multinomial weights on the sample
        w = np.bincount(rng.integers(0, n, size=big_n), minlength=n) / big_n
        weights_b.append(w)
        mean_b = np.einsum("n,nd->d", w, x)
        xc = x - mean_b
        cov_b = np.einsum("nd,n,ne->de", xc, w, xc) * big_n / (big_n - 1)
        proj_b, _ = projection(cov_b, vecs, det.min_sd, det.eig_tol)
        hists.append(histogram(mean_b, proj_b))
    hist = np.array(hists)  # (reps + 1, m, bins): the law of y under P-hat
    boot_w = np.array(weights_b)  # (reps + 1, n): each bootstrap baseline's run weights
    values = np.concatenate([np.tile(centres - s.k, (m, 1)), np.tile(-centres - s.k, (m, 1))])
    weights = np.concatenate([hist, hist], axis=1)
    theta, mu, sd = _adjustment(values, weights)
    target_rate = share / s.arl0
    h_min = np.full(2 * m, s.clip)  # one run never alarms on its own
    ratios = None
    if det._swap.size:
        # the ratios' lower bounds at the confidence the thresholds hold at over baselines
        z = statistics.NormalDist().inv_cdf(conf)
        ratios = _count_laws(det, x, boot_w, big_n, z, (theta, mu, sd), h_min)
    if det.latency_kinds:
        assert data.latency_sample is not None
        _latency_laws(det, data.latency_sample, boot_w, (theta, mu, sd), h_min)
    # Each kind of change (features, swaps, latency) gets an equal part of the budget:
    # chart j's part of its group's rate is w_j / 2m, w_j = 2m / (kinds x its kind's
    # charts). The latency chart's law is fitted on every call of the baseline, far better
    # known than the others': it gets its own part of the confidence's complement (union
    # bound; parts in proportion to the charts).
    kinds = chart_kinds(det)
    n_kinds = len(np.unique(kinds))
    groups = [np.flatnonzero(kinds != LATENCY_KIND), np.flatnonzero(kinds == LATENCY_KIND)]
    groups = [g for g in groups if g.size]
    counts = np.bincount(kinds, minlength=LATENCY_KIND + 1)
    weight = kinds.size / (n_kinds * counts[kinds])
    # the plug-in level of each chart: ARL e^(start - log w_j) on P-hat; never below it
    plug = math.log(s.arl0 / share) - np.log(weight)
    h = np.empty(2 * m)
    level = np.empty(2 * m)
    for cols in groups:
        part = len(np.unique(kinds[cols])) / n_kinds
        conf_g = 1.0 - (1.0 - conf) * cols.size / kinds.size
        law = theta[:, cols], mu[:, cols], sd[:, cols], h_min[cols]
        # chart j's own part of the rate: e^-(plug_j + log 2m) = w_j / 2m x s / arl0
        own = _chart_levels(*law, plug[cols] + math.log(kinds.size), conf_g)
        level[cols] = _group_levels(*law, own, plug[cols], target_rate * part, conf_g)
        h[cols] = _thresholds(level[cols], theta[0, cols], mu[0, cols], sd[0, cols],
                              h_min[cols])
    on = np.isfinite(level)
    return (h.reshape(2, m), float(level[on].min()) if on.any() else math.inf, lat_model,
            ratios)


def _thresholds(level: F64, theta: F64, mu: F64, sd: F64, h_min: F64) -> F64:
    """Per chart, the h with ARL e^level on its law (:func:`_chart_h`); :data:`_OFF_H` where
    the level is infinite (a chart switched off)."""
    off = np.isinf(level)
    out: F64 = np.where(off, _OFF_H, _chart_h(np.where(off, 0.0, level), theta, mu, sd,
                                               h_min))
    return out


def _rate_quantile(theta: F64, mu: F64, sd: F64, h_min: F64, level: F64, conf: float,
                   axis: int | None) -> F64:
    """The ``conf`` quantile over bootstrap baselines (rows 1:) of the charts' rates at
    thresholds giving ARL e^level on the plug-in law (row 0): per chart (``axis`` 0) or
    of their sum (``axis`` None)."""
    h = _thresholds(level, theta[0], mu[0], sd[0], h_min)
    r = 1.0 / cusum_arl(h[None, :], theta[1:], mu[1:], sd[1:])
    out: F64 = np.quantile(r if axis == 0 else r.sum(axis=1), conf, axis=0)
    return out


def _chart_levels(theta: F64, mu: F64, sd: F64, h_min: F64, target: F64, conf: float
                  ) -> F64:
    """Per chart j, the smallest level L_j >= target_j at which the ``conf`` quantile of its
    own rate is at most e^-target_j; infinite (the chart off) when none below target_j + 30
    is, i.e. the baseline cannot tell whether the chart drifts upwards in control."""
    law = theta, mu, sd, h_min
    lo, hi = target.copy(), target + _LEVEL_SPAN
    limit = np.exp(-target)
    for _ in range(24):
        mid = (lo + hi) / 2.0
        over = _rate_quantile(*law, mid, conf, 0) > limit
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    out: F64 = np.where(_rate_quantile(*law, target, conf, 0) <= limit, target, hi)
    out[_rate_quantile(*law, target + _LEVEL_SPAN, conf, 0) > limit] = np.inf
    return out


def _group_levels(theta: F64, mu: F64, sd: F64, h_min: F64, own: F64, floor: F64,
                  target_rate: float, conf: float) -> F64:
    """Levels max(own_j + D, floor_j) with the smallest offset D at which the ``conf``
    quantile of the charts' summed rate is at most ``target_rate``."""

    def rate(offset: float) -> float:
        return float(_rate_quantile(theta, mu, sd, h_min, np.maximum(own + offset, floor),
                                    conf, None))

    lo, hi = -_LEVEL_SPAN, _LEVEL_SPAN
    if rate(lo) > target_rate:
        for _ in range(30):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if rate(mid) > target_rate else (lo, mid)
        lo = hi
    out: F64 = np.maximum(own + lo, floor)
    return out


LATENCY_KIND = 2


def chart_kinds(det: MultichartCUSUM) -> NDArray[np.int64]:
    """The kind of change of each chart, up charts then down charts: 0 a feature, 1 a
    swap between two tools (of a share of every run's calls, or of whole runs), 2 every
    call's latency. Each kind gets an equal part of the fingerprint's budget."""
    m = len(det.labels)
    kind = np.zeros(m, dtype=np.int64)
    kind[[j for j, lab in enumerate(det.labels) if lab.startswith(("swap:", "runswap:"))]] = 1
    if det.latency_kinds:
        kind[det._lat_chart] = LATENCY_KIND
    out: NDArray[np.int64] = np.concatenate([kind, kind])
    return out


def _latency_laws(det: MultichartCUSUM, lat: F64, weights: F64,
                  laws: tuple[F64, F64, F64], h_min: F64) -> None:
    """Replace, in ``laws``, those of the latency chart (up and down) by its increments'
    law: the clipped LLR of every sampled run (uniform weights: the law P-hat) under the
    model each bootstrap baseline (``weights``, (reps + 1, n)) would have fitted; its
    ``h_min`` is the clip."""
    params = latency.fit(lat, weights)[:, None]  # (B, 1, K, 3)
    theta = math.log(det.latency_factor)
    up, down = latency.sides(lat[None], params, theta)  # (B, n) each
    vals = np.clip(np.stack([up, down], axis=1), -det.count_clip, det.count_clip)  # (B, 2, n)
    th, mu, sd = _adjustment(vals, np.full(vals.shape, 1.0 / lat.shape[0]))
    j = det._lat_chart
    cols = np.array([j, j + len(det.labels)])
    for dst, src in zip(laws, (th, mu, sd), strict=True):
        dst[:, cols] = src
    h_min[cols] = det.count_clip


def _count_laws(det: MultichartCUSUM, x: F64, weights: F64, n_runs: int, z: float,
                laws: tuple[F64, F64, F64], h_min: F64) -> F64:
    """Replace, in ``laws`` (theta, mu, sd of shape (reps + 1, 2m)), those of the swap
    charts on the call counts by their increments' law: the clipped LLR of every sampled
    run (uniform weights: the law P-hat) under the ratios of call shares each bootstrap
    baseline (``weights``, (reps + 1, n)) would have given its charts
    (``toolcounts.swap_ratios``: lower bounds, ``z`` standard errors below); their
    ``h_min`` is the per-call charts' clip ``count_clip``, the whole-run charts' included:
    one run alone alarms only with an LR of at least e^count_clip (~150 at 5 nats), though
    a whole-run chart counts up to ``RUN_CLIP`` of it (a floor at ``RUN_CLIP`` kept those
    charts 1-3 nats above what their part of the budget asks for, and their delays 11%
    longer with 2,000-run baselines). Returns the plug-in baseline's ratios (row 0),
    (2, pairs): the chart's own."""
    a, b, j = det._pa, det._pb, det._swap
    counts = tool_counts(x, det._steps_col, det._tool_cols)  # (n, tools)
    ratios = swap_ratios(counts, weights, a, b, n_runs, z)  # (B, 2, P)
    w = ratio_weights(ratios, det.tool_shift)
    charts = [(j, swap_llr(counts[None, :, :], w[:, None], a, b, det.count_clip))]
    runs = getattr(det, "_runswap", np.zeros(0, dtype=np.int64))
    if runs.size:
        charts.append((runs, run_ratio_llr(counts[None, :, :], ratios[:, None], a, b,
                                           det.swap_runs, RUN_CLIP)))
    for idx, ll in charts:  # ll: (B, n, 2, P)
        vals = np.moveaxis(ll, 1, -1).reshape(weights.shape[0], 2 * idx.size,
                                               counts.shape[0])
        th, mu, sd = _adjustment(vals, np.full(vals.shape, 1.0 / counts.shape[0]))
        cols = np.concatenate([idx, idx + len(det.labels)])
        for dst, src in zip(laws, (th, mu, sd), strict=True):
            dst[:, cols] = src
        h_min[cols] = det.count_clip
    out: F64 = ratios[0]
    return out


def _pass_rate(data: BaselineData, delta: float, arl0: float, conf: float
               ) -> tuple[float, float]:
    """(h, p0) of the pass-rate CUSUM (:func:`_pass_rate_exact`, cached by its sufficient
    inputs)."""
    out = _pass_rate_exact(int(data.passes), int(data.fails), float(delta), float(arl0),
                           float(conf))
    if isinstance(out, str):
        raise ValueError(out)
    return out


@functools.lru_cache(maxsize=8192)
def _pass_rate_exact(passes: int, fails: int, delta: float, arl0: float, conf: float
                     ) -> tuple[float, float] | str:
    """The pass-rate threshold depends on the baseline only through its passes and fails:
    the key is exact, and a monitor whose streams learn from the same number of runs sees
    at most ``learn_runs + 1`` keys per configuration (0.05-0.3 s each uncached, the larger
    part of a calibration). A failure is cached as its message."""
    try:
        return _pass_rate_uncached(passes, fails, delta, arl0, conf)
    except ValueError as exc:
        return str(exc)


def _pass_rate_uncached(passes: int, fails: int, delta: float, arl0: float, conf: float
                        ) -> tuple[float, float]:
    """(h, p0) of the pass-rate CUSUM: h keeps ``arl0`` at the Clopper-Pearson lower bound
    q of the pass rate (exact, ``calibration``); the design rate p0 is chosen on a grid
    between q and the Jeffreys estimate to minimise the delay at a drop of ``delta`` from
    the estimate (a small baseline's chart designed for its point estimate needs a large h
    to survive q; one designed nearer q needs less and detects sooner)."""
    n, x = passes + fails, passes
    p_hat = (x + 0.5) / (n + 1.0)
    q = clopper_pearson_interval(x, n, 1.0 - conf, sided="lower")[0]
    best: tuple[float, float, float] | None = None
    why = f"pass rate {p_hat:.3f} leaves no room for a drop of {delta}"
    for p0 in np.linspace(max(q, delta + 1e-3), p_hat, 6):
        if not delta < p0 < 1.0:
            continue
        try:
            h = bernoulli_cusum_threshold(float(p0), float(p0) - delta, arl0, n, x, conf)
        except ValueError as exc:  # this design needs an unusable threshold: try the next
            why = str(exc)
            continue
        delay = bernoulli_cusum_arl(max(p_hat - delta, 1e-3), float(p0), float(p0) - delta, h)
        if best is None or delay < best[0]:
            best = (delay, h, float(p0))
    if best is None:
        raise ValueError(why)
    return best[1], best[2]


def calibrate(data: BaselineData, settings: CalibrationSettings, seed: int) -> Thresholds:
    """Thresholds of the stream's alarming detectors (module docstring)."""
    shares = {k: v for k, v in settings.shares.items() if v > 0}
    decided = data.passes + data.fails
    if not decided:
        shares.pop("cusum_pass_rate", None)
    total = sum(shares.values())
    if total <= 0:
        return Thresholds(None, None)
    conf = 1.0 - (1.0 - settings.confidence) / max(1, len(shares))
    h_pass, p0_pass, disabled = None, math.nan, {}
    if "cusum_pass_rate" in shares:
        try:
            h_pass, p0_pass = _pass_rate(data, settings.delta,
                                         settings.arl0 / (shares["cusum_pass_rate"] / total),
                                         conf)
        except ValueError as exc:  # e.g. a baseline too small or too perfect
            disabled["cusum_pass_rate"] = str(exc)
    h_fp, level, lat_model, ratios = None, math.nan, None, None
    d = int(np.asarray(data.mean).size)
    if "cusum_fingerprint" in shares and data.n_runs < max(_MIN_RUNS, 2 * d):
        disabled["cusum_fingerprint"] = (
            f"the fingerprint covariance of {d} features needs at least "
            f"{max(_MIN_RUNS, 2 * d)} baseline runs, the baseline has {data.n_runs}")
    elif "cusum_fingerprint" in shares:
        rng = np.random.default_rng(seed)
        h_fp, level, lat_model, ratios = _fingerprint(data, settings,
                                              shares["cusum_fingerprint"] / total, conf, rng)
    h_scores: dict[str, float] = {}
    labels = evaluator_labels(data.evaluators, data.labels)
    n_eval = len(data.evaluators) + len(labels)
    if "evaluation" in shares and n_eval:
        from assaywatch.analyzers.detectors.label import LABEL_REPS, label_threshold

        share_each = shares["evaluation"] / total / n_eval
        det_conf = 1.0 - (1.0 - settings.confidence) / max(1, len(shares) - 1 + n_eval)
        rng_s = np.random.default_rng([seed, 1])
        for name, summary in sorted(data.evaluators.items()):
            if summary.n >= 2:
                h_scores[name] = score_threshold(summary, settings.score_shift,
                                                 settings.arl0 / share_each, det_conf,
                                                 max(SCORE_REPS, settings.reps), rng_s)
        rng_l = np.random.default_rng([seed, 2])
        for name, lab in sorted(labels.items()):
            h_scores[name] = label_threshold(lab, settings.score_shift,
                                             settings.arl0 / share_each, det_conf,
                                             max(LABEL_REPS, settings.reps), rng_l)
    return Thresholds(h_pass, h_fp, p0_pass, level, conf, disabled, h_scores,
                      tool_counts=settings.tool_counts,
                      latency=lat_model if h_fp is not None else None,
                      swap_ratios=ratios if h_fp is not None else None)


def evaluator_labels(evaluators: Mapping[str, Any], labels: Mapping[str, Any]
                     ) -> dict[str, Any]:
    """The label summaries monitored: those of evaluators that do not score (an evaluator
    with scores is monitored by them) with at least 2 labels."""
    return {k: v for k, v in labels.items() if k not in evaluators and v.n >= 2}


#: Bootstrap baselines of a score threshold at least: its quantile near 0.97 from 40 draws
#: swung from 5.6 to 10.0 nats between seeds on one baseline (within 6.9-8.3 with 400);
#: a draw costs ~2.5 ms, so 300 cost under a second per evaluator, in the worker.
SCORE_REPS = 300
#: Siegmund's approximation overstates these detectors' ARL by 3-5% (measured against an
#: exact Markov chain on lumpy and smooth scores): the target is raised by this factor.
SCORE_ARL_MARGIN = 1.1


def score_threshold(summary: ScoreSummary, shift: float, arl0: float, confidence: float,
                    reps: int, rng: np.random.Generator) -> float:
    """The threshold of a :class:`~assaywatch.analyzers.detectors.score.ScoreDropCUSUM`
    built on ``summary`` with ``confidence`` for its ``m0``: the ``confidence`` quantile,
    over ``reps`` bootstrap baselines drawn from the summary's histogram, of the threshold
    that gives the detector built on the bootstrap baseline an in-control ARL of ``arl0``
    under the histogram's law (Siegmund's approximation, as for the fingerprint charts);
    never above Lorden's ``log(arl0)``, which holds for any law with the baseline's mean.
    Lorden's bound is far from tight on real scores (measured ARL0 13 to 190 times the
    target), which cost the detector delay: this spends the budget as the other
    detectors do, with the baseline's sampling accounted for by the bootstrap."""
    lorden = math.log(arl0)
    ys, ps = summary.levels()
    if ys.size < 2 or summary.n < 2:
        return lorden
    counts = rng.multinomial(summary.n, ps, size=reps).astype(np.float64)
    xs = np.zeros((reps, ys.size))
    usable = np.zeros(reps, dtype=bool)
    for b, c in enumerate(counts):
        boot = summary.with_counts(c)
        m0 = boot.mean_lower(confidence)
        if m0 <= 0.0:
            continue
        xs[b] = np.log1p(best_lambda(boot, m0, shift) * (m0 - ys))
        usable[b] = True
    hs = np.full(reps, np.inf)
    if usable.any():
        theta, mu, sd = _adjustment(xs[usable], np.broadcast_to(ps, xs[usable].shape))
        ok = (mu < 0) & (theta > 0)  # else it drifts up in control: no finite threshold
        h_ok = _chart_h(math.log(arl0 * SCORE_ARL_MARGIN), theta[ok], mu[ok], sd[ok], 0.0)
        idx = np.flatnonzero(usable)[ok]
        hs[idx] = h_ok
    # a conservative order statistic: the ceil(confidence (B + 1))-th smallest, which
    # covers the quantile at least `confidence` of the time (np.quantile of 40 covered 0.93)
    k = min(reps, int(math.ceil(confidence * (reps + 1)))) - 1
    h = float(np.sort(hs)[k])
    return min(h, lorden) if math.isfinite(h) else lorden
