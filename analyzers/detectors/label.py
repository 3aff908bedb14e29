r"""A sequential detector for a shift in a categorical evaluation label (one evaluator's labels).

LLM judges often emit labels, not scores: "correct" / "partially_correct" / "incorrect",
"safe" / "unsafe", "relevant" / "irrelevant", an error class. A regression shows as a
shift of the labels' distribution away from the baseline's: more "incorrect", a new
"refused". The detector here alarms on such a shift with a stated in-control average run
length (ARL0), from the baseline's label counts alone.

**Categories.** The baseline keeps at most :data:`MAX_LABELS` categories, ``"other"``
among them (:class:`LabelSummary`): the most frequent labels, the rest folded into
``"other"``; a label the baseline never saw is counted as ``"other"`` when monitored (a
judge's literal label ``"other"`` is the same category). ``p0`` is the baseline's
estimate with additive (Jeffreys, 1/2) smoothing, so an unseen label has a positive rate.

**The charts.** A shift of the law must raise the rate of at least one category, so there
is one chart per category j, a likelihood-ratio CUSUM of the alternative "category j gains
``shift`` of probability (in total variation), the others lose it in proportion" against
the null "category j at rate ``u_j``, the others in proportion". Both laws scale the other
categories alike, so the multinomial log-likelihood ratio of a label x is

.. math::

    \ell_j(x) = \log\frac{r_j}{u_j} \text{ if } x = j, \qquad
    \log\frac{1 - r_j}{1 - u_j} \text{ otherwise},

with ``r_j = p0_j + shift``, at least ``u_j + shift / 2`` (a small baseline's bound can
exceed the estimate by more than the shift) and at most half-way from ``u_j`` to 1 (a
dominant category that cannot gain the full shift); and
:math:`W_j = \max(0, W_j + \ell_j(x))`; the detector alarms when :math:`\max_j W_j \ge h`.

**Guarantee (analytic threshold).** For labels drawn i.i.d. from any law q with
:math:`q_j \le u_j`, :math:`\mathrm{E}_q e^{\ell_j} = q_j r_j/u_j + (1-q_j)(1-r_j)/(1-u_j)
\le 1` (linear in q_j, equal to 1 at u_j, increasing as r_j > u_j): the product of the
likelihood ratios of chart j started at any run is a non-negative supermartingale, and by
Ville's inequality it ever reaches :math:`e^h` with probability at most :math:`e^{-h}`.
(A negative drift :math:`\mathrm{E}\ell_j < 0`, the KL divergence, alone would not do: it
is the exponential moment that bounds the crossing.) Let :math:`N_k` be the first run from
k at which *some* chart's sum from k reaches h: by the union bound
:math:`P(N_k < \infty) \le K e^{-h}`; the max-of-K CUSUM alarms at
:math:`\min_k N_k` (:math:`W_{j,n} \ge h` iff some sum of chart j ending at n and started
at some k reaches h), so by Lorden's theorem (1971, i.i.d. labels) its ARL0 is at least
:math:`e^h / K`: ``h = log(K arl0)`` gives ARL0 >= arl0 for every such q. The design's
null ``u_j`` is the Clopper-Pearson **upper** confidence bound of category j's rate at
level ``1 - (1 - confidence) / K``: with probability at least ``confidence`` over the
baseline's sampling every true rate is below its bound (union bound) and the guarantee
holds for the true law, not only for the estimate (as the score detector's ``m0``). With
``confidence=None`` the null is the smoothed estimate itself (``u = p0``, the plain
multinomial CUSUM): the bound then holds under p0 only, which is not
the truth. With calibrated thresholds the two designs have about the same delay at 1,000
baseline labels (the bound's 0-13 % shorter at a shift of 0.2); at 200 the plain design
detects a 0.1 shift of a 10 % category 1.4-2 times as fast (median), but its calibrated
threshold then reaches the analytic cap, which does not hold for it, and its ARL0 is
below the target for more baselines than stated (``bench_labels.py``).

**Calibrated threshold.** Lorden's bound and the union over K charts are far from tight
(the measured ARL0 at ``log(K arl0)`` is hundreds of times the target), which costs
delay. :func:`label_threshold` spends the budget as ``bootstrap.score_threshold`` does:
bootstrap baselines of the baseline's size drawn from its smoothed law, the detector
built on each, the threshold giving it ARL0 ``arl0 * LABEL_ARL_MARGIN`` when the labels
follow that law, and a conservative order statistic over the draws; never above
``log(K arl0)``, never below the largest single step (one label never alarms on its own).
Each chart's ARL is computed (:class:`ChartARL`) on a lattice where one step is many
times the other (0.7-1.07 times the exact chain's ARL; a rare category, where Siegmund's
approximation is 2 to 30 times too low), by Siegmund's approximation elsewhere (within
15 % at the chart's null rate); the charts' false-alarm rates are added
(measured within 5 % of the simulated max-of-K chart, conservative). The ``"other"``
chart, which gathers the labels the baseline never saw, is calibrated at the upper
confidence bound of its rate, not at the estimate 1/(2n) (:func:`label_threshold`).
The claim, ARL0 >= arl0 for at least ``confidence`` of baselines, is approximate (a
bootstrap); measured on three judge worlds (300 baselines of 200 or 1,000 labels each,
targets 500 and 10,000): 0-4.3 % of baselines below the target, with the median ARL0
2-100 times the target (conservative: the order statistic, the bound on "other").
Conditions for both claims: labels independent and identically distributed in control.

**Tuning.** ``shift`` (default 0.1) is the total-variation distance of the alternative;
the per-chart design puts it all on one category, the shape of a judge that starts
answering "incorrect" or "refused" more often. A shift spread over several categories is
still seen by the charts of the categories that gain, more slowly. The baseline's size
bounds what can be seen: a chart only reacts to rates above its null, the upper bound,
which for 200 labels lies 0.07 above a 10 % category's estimate; a shift of 0.1 then
takes a few hundred labels (the oracle: 49), a shift of 0.2 about 60. With 1,000 labels,
about 100 and 37 (oracle 49 and 21). Measured ARL0 and delays are printed by
``tests/benchmarks/bench_labels.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import special

from assaywatch.analyzers.detectors.siegmund import _adjustment, cusum_arl

__all__ = ["LABEL_ARL_MARGIN", "MAX_LABELS", "OTHER", "LabelShiftCUSUM", "LabelSummary",
           "label_threshold"]

F64 = NDArray[np.float64]

#: Categories a label summary keeps, ``"other"`` among them.
MAX_LABELS = 16
#: The category of labels folded out of a summary or never seen in the baseline.
OTHER = "other"
#: Additive smoothing of the baseline's counts (Jeffreys).
SMOOTHING = 0.5
#: Per chart, :class:`ChartARL` is 0.72-1.07 times the exact chain's ARL where it uses the
#: lattice, Siegmund's approximation 0.86-1.14 times it at the chart's null rate and up to
#: 1.5 times it for truths well below the null (where a chart adds little to the sum);
#: the sum of the charts' rates is conservative by 2-5 %. The calibration target is
#: raised by this factor (as ``bootstrap.SCORE_ARL_MARGIN``).
LABEL_ARL_MARGIN = 1.1
#: Bootstrap baselines of a calibrated threshold (as ``bootstrap.SCORE_REPS``).
LABEL_REPS = 300
_BISECT = 40


@dataclass(frozen=True)
class LabelSummary:
    """What a baseline keeps of one evaluator's labels: label -> count, at most
    :data:`MAX_LABELS` categories with ``"other"`` among them (the most frequent labels
    kept, ties by name; the rest folded into ``"other"``). Content-free beyond the label
    names and JSON-able (:meth:`to_dict`)."""

    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # folding and validation here, so every way of building a summary is bounded
        object.__setattr__(self, "counts", _fold(self.counts))

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @classmethod
    def from_labels(cls, labels: Iterable[object]) -> LabelSummary:
        """Count labels (``str()`` of each; ``None`` is skipped)."""
        return cls(dict(Counter(str(x) for x in labels if x is not None)))

    def categories(self) -> list[str]:
        """The detector's categories: the kept labels by name, then ``"other"``."""
        return sorted(k for k in self.counts if k != OTHER) + [OTHER]

    def probabilities(self, smoothing: float = SMOOTHING) -> tuple[list[str], F64]:
        """(categories, smoothed probabilities): ``(count + s) / (n + K s)``, so
        ``"other"`` (always a category) and every kept label have a positive rate."""
        if not smoothing > 0:
            raise ValueError(f"smoothing must be > 0, got {smoothing}")
        labels = self.categories()
        c = np.array([self.counts.get(k, 0) for k in labels], dtype=np.float64)
        p: F64 = (c + smoothing) / (c.sum() + smoothing * len(labels))
        return labels, p

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "counts": dict(sorted(self.counts.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LabelSummary:
        return cls({str(k): int(v) for k, v in dict(d.get("counts", {})).items()})


def _fold(counts: Mapping[str, int]) -> dict[str, int]:
    clean: dict[str, int] = {}
    for k, v in counts.items():
        if int(v) < 0:
            raise ValueError(f"label {k!r} has a negative count {v}")
        if int(v) > 0:
            clean[str(k)] = clean.get(str(k), 0) + int(v)
    named = sorted((k for k in clean if k != OTHER), key=lambda k: (-clean[k], k))
    if len(named) <= MAX_LABELS - 1:
        return dict(sorted(clean.items()))
    kept = {k: clean[k] for k in named[:MAX_LABELS - 1]}
    kept[OTHER] = clean.get(OTHER, 0) + sum(clean[k] for k in named[MAX_LABELS - 1:])
    return dict(sorted(kept.items()))


def chart_rates(counts: F64, p0: F64, shift: float, confidence: float | None
                ) -> tuple[F64, F64]:
    """(null u, alternative r) per category (module docstring), vectorised over leading
    axes of ``counts`` (..., K) and the smoothed ``p0`` of the same shape. The null is the
    Clopper-Pearson upper bound at ``1 - (1 - confidence) / K`` (at least ``p0``), or
    ``p0`` when ``confidence`` is None; a category holding every baseline label has the
    bound 1: its chart is off (:func:`chart_steps`)."""
    k = counts.shape[-1]
    if confidence is None:
        u = p0.copy()
    else:
        n = counts.sum(axis=-1, keepdims=True)
        full = counts >= n
        u = np.where(full, 1.0,
                     special.betaincinv(counts + 1.0, np.where(full, 1.0, n - counts),
                                        1.0 - (1.0 - confidence) / k))
        u = np.maximum(np.asarray(u, dtype=np.float64), p0)
    r = np.minimum(np.maximum(p0 + shift, u + shift / 2.0), (1.0 + u) / 2.0)
    return u, r


def chart_steps(u: F64, r: F64) -> tuple[F64, F64]:
    """Per chart, the log-LR of a label of its own category (up) and of any other (down);
    both 0 for a chart that is off (``u`` = 1)."""
    live = u < 1.0
    uu, rr = np.where(live, u, 0.5), np.where(live, r, 0.75)
    up: F64 = np.where(live, np.log(rr / uu), 0.0)
    down: F64 = np.where(live, np.log1p(-rr) - np.log1p(-uu), 0.0)
    return up, down


class LabelShiftCUSUM:
    """Alarms when one evaluator's label distribution shifts from its baseline's (module
    docstring).

    Parameters
    ----------
    summary:
        The evaluator's baseline labels.
    shift:
        Probability (total variation) the alternative of each chart moves onto its
        category, in (0, 1).
    arl0:
        In-control average run length, in labels.
    confidence:
        Probability over the baseline's sampling that every category's true rate is below
        its chart's null rate (upper confidence bounds); None: the null is the smoothed
        estimate (the analytic guarantee then holds under the estimate only).
    h:
        A calibrated threshold (:func:`label_threshold`; never above the analytic
        ``log(K arl0)``); None: the analytic one.
    smoothing:
        Additive smoothing of the baseline counts.
    """

    name = "evaluation_label"

    def __init__(self, summary: LabelSummary, *, shift: float = 0.1, arl0: float = 10_000.0,
                 confidence: float | None = 0.95, h: float | None = None,
                 smoothing: float = SMOOTHING) -> None:
        if summary.n < 1:
            raise ValueError("a label baseline needs at least 1 label")
        if not 0 < shift < 1:
            raise ValueError(f"shift must be in (0, 1), got {shift}")
        if not arl0 > 1:
            raise ValueError(f"arl0 must be > 1, got {arl0}")
        if confidence is not None and not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1) or None, got {confidence}")
        self.summary = summary
        self.shift = shift
        self.arl0 = arl0
        self.confidence = confidence
        self.labels, self.p0 = summary.probabilities(smoothing)
        self.index = {k: i for i, k in enumerate(self.labels)}
        counts = np.array([summary.counts.get(k, 0) for k in self.labels], dtype=np.float64)
        self.null, self.alt = chart_rates(counts, self.p0, shift, confidence)
        up, down = chart_steps(self.null, self.alt)
        self._up: list[float] = up.tolist()
        self._down: list[float] = down.tolist()
        #: log(K arl0): ARL0 >= arl0 by Lorden and a union bound (module docstring)
        self.analytic_h = math.log(len(self.labels) * arl0)
        self.h = self.analytic_h if h is None else min(float(h), self.analytic_h)
        self.charts: list[float] = [0.0] * len(self.labels)
        self.statistic = 0.0
        self.n = 0
        self.drift_detected = False

    def category(self, label: object) -> int:
        """Index of a label's category (an unknown label is ``"other"``)."""
        return self.index.get(str(label), self.index[OTHER])

    def increments(self) -> F64:
        """(K, K) table: ``[j, i]`` is chart j's log-LR of a label of category i (for
        vectorised simulation)."""
        up, down = np.array(self._up), np.array(self._down)
        out: F64 = np.repeat(down[:, None], len(self.labels), axis=1)
        np.fill_diagonal(out, up)
        return out

    @property
    def threshold(self) -> float:
        """The alarm threshold ``h`` (the detector protocol's name for it)."""
        return self.h

    def update(self, label: object) -> None:
        i = self.category(label)
        w = self.charts
        for j, d in enumerate(self._down):
            w[j] = max(0.0, w[j] + (self._up[j] if j == i else d))
        self.statistic = max(w)
        self.n += 1
        self.drift_detected = self.statistic >= self.h

    def reset(self) -> None:
        self.charts = [0.0] * len(self.labels)
        self.statistic = 0.0
        self.drift_detected = False

    def evidence(self) -> dict[str, Any]:
        top = max(range(len(self.charts)), key=self.charts.__getitem__)
        return {"statistic": self.statistic, "threshold": self.h,
                "analytic_threshold": self.analytic_h, "category": self.labels[top],
                "charts": dict(zip(self.labels, self.charts, strict=True)),
                "baseline_probabilities": dict(zip(self.labels, self.p0.tolist(),
                                                   strict=True)),
                "baseline_n": self.summary.n, "shift": self.shift, "arl0": self.arl0,
                "confidence": self.confidence}


#: A chart's in-control ARL is computed on a lattice whose unit is its smaller step when the
#: larger step is at least this many times it (a hit of a rare category against many small
#: steps down: Siegmund's approximation is 2 to 30 times too low there), interpolating
#: log ARL between the lattices with the larger step rounded down and up (they bracket the
#: chart's ARL, coupling). Measured against the exact chain on rates 0.003-0.98, truths
#: 0.7-1 times the null and h 2.5-9: 0.72-1.07 times it from a ratio of 8 (large up-step)
#: or 3 (large down-step); below those ratios the interpolation is poor and Siegmund's is
#: used (0.86-1.14 at the null).
_LATTICE_RATIO_UP = 8.0
_LATTICE_RATIO_DOWN = 3.0
_MAX_STATES = 800


def _log_or_inf(x: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        out: F64 = np.where(np.isfinite(x) & (x > 0), np.log(np.where(x > 0, x, 1.0)), np.inf)
    return out


def _jumps_up(q: F64, steps: NDArray[np.int64], n: int) -> F64:
    """ARL (rows H = 1..n) of the lattice CUSUM going up ``steps`` units with
    probability q and down one unit otherwise, absorbed at H units. Shooting from the top:
    with f_k the ARL from state H-1-k, f_{k+1} = (f_k - 1 - q f_{k-U}) / (1 - q) for
    states above 0 (f = 0 beyond the top), f_k = a_k + b_k z in the unknown z = f_0, and z
    from the equation of state 0, q f_{H-1} = 1 + q f_{H-1-U}. The ARL is the recursion's
    dominant (growing) solution: no loss of precision (checked against the banded solve)."""
    c = q.size
    a, b = np.zeros((n + 1, c)), np.zeros((n + 1, c))
    b[0] = 1.0
    cols = np.arange(c)
    p = 1.0 - q
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for k in range(n):
            j = k - steps
            ok = j >= 0
            jj = np.maximum(j, 0)
            a[k + 1] = (a[k] - 1.0 - q * np.where(ok, a[jj, cols], 0.0)) / p
            b[k + 1] = (b[k] - q * np.where(ok, b[jj, cols], 0.0)) / p
        k_ = np.arange(n)[:, None]
        j = k_ - steps[None, :]
        ok = j >= 0
        jj = np.maximum(j, 0)
        a_u = np.where(ok, np.take_along_axis(a, jj, axis=0), 0.0)
        b_u = np.where(ok, np.take_along_axis(b, jj, axis=0), 0.0)
        z = (1.0 + q * a_u - q * a[:n]) / (q * (b[:n] - b_u))
        arl = a[:n] + b[:n] * z
    out: F64 = np.concatenate([np.ones((1, c)), arl])
    return out


def _jumps_down(q: F64, steps: NDArray[np.int64], n: int) -> F64:
    """ARL (rows H = 1..n) of the lattice CUSUM going up one unit with probability q
    and down ``steps`` units otherwise: it reaches every level on its way up, so the ARL to
    H units is the sum of the expected times tau_i from level i to i + 1,
    tau_i = (1 + (1 - q) sum_{max(0, i - D) <= k < i} tau_k) / q (a step down from i must
    climb back): every H at once, sums of positive terms."""
    c = q.size
    t = np.zeros((n + 1, c))
    cols = np.arange(c)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(n):
            back = t[i] - t[np.maximum(i - steps, 0), cols]
            t[i + 1] = t[i] + (1.0 + (1.0 - q) * back) / q
    return t


class ChartARL:
    """Zero-start in-control ARL, as a function of the threshold, of C charts with
    increments ``up`` (probability q) or ``down`` (a label of another category): on a
    lattice for the charts whose steps differ by a large ratio (see
    ``_LATTICE_RATIO_UP``), Siegmund's approximation (``bootstrap.cusum_arl``) for the
    others. Tables are built for thresholds up to ``h_max``."""

    def __init__(self, up: F64, down: F64, q: F64, h_max: float) -> None:
        up, down, q = (np.asarray(v, dtype=np.float64).ravel() for v in (up, down, q))
        self.theta, self.mu, self.sd = _adjustment(np.stack([up, down], axis=-1),
                                                   np.stack([q, 1.0 - q], axis=-1))
        #: charts that are off (both steps 0) never alarm
        self.off = (up <= 0.0) | (down >= 0.0)
        big_up = up >= -down
        unit = np.where(self.off, 1.0, np.where(big_up, -down, up))
        ratio = np.where(big_up, up, -down) / unit
        states = np.ceil(h_max / unit).astype(np.int64) + 1
        use = (np.where(big_up, ratio >= _LATTICE_RATIO_UP, ratio >= _LATTICE_RATIO_DOWN)
               & (states <= _MAX_STATES) & (q > 0.0) & (q < 1.0) & ~self.off)
        self.index = np.flatnonzero(use)
        #: chart -> its column in the lattice tables (-1: Siegmund)
        self.position = np.full(up.size, -1, dtype=np.intp)
        self.position[self.index] = np.arange(self.index.size)
        self.unit, self.states = unit[use], states[use]
        self.weight = ratio[use] - np.floor(ratio[use])
        n = int(self.states.max()) if self.index.size else 0
        self.floor = np.full((n + 1, self.index.size), np.inf)
        self.ceil = np.full((n + 1, self.index.size), np.inf)
        for sel, build in ((big_up[use], _jumps_up), (~big_up[use], _jumps_down)):
            if sel.any():
                lo = np.floor(ratio[use][sel]).astype(np.int64)
                qq = q[use][sel]
                self.floor[:, sel] = build(qq, lo, n)
                self.ceil[:, sel] = build(qq, lo + 1, n)

    def log_arl(self, h: F64, which: NDArray[np.intp] | None = None) -> F64:
        """log ARL of charts ``which`` (all by default) at thresholds ``h`` (one each)."""
        h = np.asarray(h, dtype=np.float64)
        if which is None:
            which = np.arange(self.theta.size)
        out: F64 = _log_or_inf(cusum_arl(h, self.theta[which], self.mu[which],
                                         self.sd[which]))
        pos = self.position[which]
        lat = pos >= 0
        if lat.any():
            col = pos[lat]
            big_h = np.clip(np.ceil(h[lat] / self.unit[col] - 1e-9).astype(np.int64), 1,
                            self.states[col])
            lo = _log_or_inf(self.floor[big_h, col])
            hi = _log_or_inf(self.ceil[big_h, col])
            with np.errstate(invalid="ignore"):
                mixed = lo + self.weight[col] * (hi - lo)
            out[lat] = np.where(np.isfinite(lo) & np.isfinite(hi), mixed, np.minimum(lo, hi))
        out[self.off[which]] = np.inf
        return out


def label_threshold(summary: LabelSummary, shift: float, arl0: float, confidence: float,
                    reps: int, rng: np.random.Generator, *, plain: bool = False,
                    smoothing: float = SMOOTHING) -> float:
    """The calibrated threshold of a :class:`LabelShiftCUSUM` built on ``summary`` with
    ``confidence`` for its null rates (``plain``: the detector with ``confidence=None``).

    ``reps`` bootstrap baselines of the baseline's size are drawn from its smoothed law;
    for each, the detector built on it and the threshold h_b giving it in-control ARL
    ``arl0 * LABEL_ARL_MARGIN`` when the labels follow the smoothed law, except the
    ``"other"`` category taken at its upper confidence bound (comment below); per chart
    :class:`ChartARL`, the union's false-alarm rate the sum of the charts' (measured
    within 5 % of the simulated max-of-K chart, above it). Returns the
    ``ceil(confidence (reps + 1))``-th smallest h_b (which covers the ``confidence``
    quantile at least that often), at least the largest single step of the detector and
    never above the analytic ``log(K arl0)``. About 40 ms for 300 draws of 16 categories
    (``bench_labels.py``)."""
    labels, p = summary.probabilities(smoothing)
    k = len(labels)
    analytic = math.log(k * arl0)
    if summary.n < 2 or reps < 1:
        return analytic
    design = None if plain else confidence
    own = np.array([summary.counts.get(x, 0) for x in labels], dtype=np.float64)
    # one label never alarms on its own: the bootstrap's law gives a label the baseline
    # never saw the rate 1 / (2 n) and cannot tell a category that is rare from one that
    # is absent (a judge's rare "error" missing from a small baseline would alarm every
    # time it appears)
    h_min = float(chart_steps(*chart_rates(own, p, shift, design))[0].max()) + 1e-9
    # "other" gathers every label the baseline never saw: a bootstrap from its estimate
    # (1 / (2 n)) never meets the baselines that missed labels worth 1-4 % together
    # (measured: 9-11 % of 200-label baselines of a lumpy judge below the target instead
    # of 5 %). Its chart is calibrated at the Clopper-Pearson upper bound of its rate at
    # ``confidence`` (4 % then); every other chart at the estimate.
    truth = p.copy()
    io = labels.index(OTHER)
    c_o = own[io]
    truth[io] = max(p[io], 1.0 if c_o >= summary.n else
                    float(special.betaincinv(c_o + 1.0, summary.n - c_o, confidence)))
    counts = rng.multinomial(summary.n, p, size=reps).astype(np.float64)
    p_b = (counts + smoothing) / (summary.n + smoothing * k)
    u, r = chart_rates(counts, p_b, shift, design)
    # chart j of a bootstrap baseline depends on that baseline only through its count of
    # category j: the distinct (j, count) charts are computed once (~10 times fewer)
    key = (np.arange(k)[None, :] * (summary.n + 1) + counts.astype(np.int64)).ravel()
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    up, down = (v.ravel()[first] for v in chart_steps(u, r))
    charts = ChartARL(up, down, np.tile(truth, reps)[first], analytic)
    log_target = math.log(arl0 * LABEL_ARL_MARGIN)

    def log_union(h: F64) -> F64:
        la = charts.log_arl(np.repeat(h, k), which).reshape(reps, k)
        out: F64 = -special.logsumexp(-la, axis=1)
        return out

    lo, hi = np.zeros(reps), np.full(reps, analytic)
    reach = log_union(hi) >= log_target
    for _ in range(_BISECT):
        mid = (lo + hi) / 2.0
        below = log_union(mid) < log_target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    hs = np.where(reach, hi, np.inf)
    idx = min(reps, int(math.ceil(confidence * (reps + 1)))) - 1
    h = float(np.sort(hs)[idx])
    return min(max(h, h_min), analytic)
