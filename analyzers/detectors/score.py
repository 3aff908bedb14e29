"""A sequential detector for a drop in a graded evaluation score (one evaluator's signal).

Evaluation scores are bounded (helpfulness in [0, 1], a 1-5 rubric, 0-100) and lumpy
(many 1.0s, a handful of ordinal levels): Gaussian tables do not hold for them. The
detector here needs only the bound.

**The e-CUSUM.** Scores are mapped to ``y = (x - lo) / (hi - lo)`` in [0, 1] with the
evaluator's scale ``[lo, hi]``. For a baseline mean ``m0`` (in those units), every factor
``1 + lam * (m0 - y)`` with ``0 <= lam < 1 / (1 - m0)`` is non-negative and has expectation
``1 + lam * (m0 - E[y]) <= 1`` whenever the true mean is at least ``m0``: a product of them
started at any run is a test supermartingale, so by Ville's inequality it ever reaches
``c`` with probability at most ``1 / c``. The CUSUM recursion

    W_n = max(0, W_{n-1} + log(1 + lam * (m0 - y_n))),  alarm when W_n >= log(c)

alarms at the first run where one of those products started at an earlier run reaches
``c``; by Lorden's theorem (1971) its in-control average run length is at least ``c``, for
**any** distribution of independent scores on the scale with mean >= ``m0``. No
calibration on Gaussian draws, no table: the guarantee holds for lumpy and ordinal scores.
It is conservative (the true ARL0 is above ``c``), which costs some delay; the measured
delay against the optimal CUSUM that knows both distributions is in README.

**The baseline's mean is an estimate.** ``m0`` is the lower confidence bound of the
baseline mean at the stated confidence (normal bound with one pseudo-observation of
maximal variance, so a baseline of all 1.0s does not claim certainty): with that
probability over the baseline's sampling the true mean is above ``m0`` and the guarantee
holds.

**Tuning.** ``lam`` maximises the expected log-growth ``E[log(1 + lam (m0 - y))]`` under
the alternative "the baseline's own score distribution shifted down by ``shift``"
(clipped to the scale), on a grid below ``1 / (1 - m0)``: the growth per run, hence the
delay, is that of the drop the detector is meant for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm

#: Scales recognised from the scores themselves, tried in order: the first that holds
#: every baseline score is the evaluator's (a 1-5 rubric needs integer scores).
KNOWN_SCALES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 5.0), (0.0, 10.0),
                                                 (0.0, 100.0))
#: Histogram bins over the scale kept in a summary (101 levels: 0.00 .. 1.00).
HIST_LEVELS = 100


def infer_scale(values: Iterable[float]) -> tuple[float, float]:
    """The evaluator's scale from its scores: the first of :data:`KNOWN_SCALES` holding
    them all (1-5 only for integers), else the observed range (a single value: +-0.5).

    >>> infer_scale([0.2, 1.0, 0.7])
    (0.0, 1.0)
    >>> infer_scale([1, 4, 5, 3])
    (1.0, 5.0)
    >>> infer_scale([3.5, 7.0])
    (0.0, 10.0)
    """
    xs = [float(v) for v in values if math.isfinite(float(v))]
    if not xs:
        return KNOWN_SCALES[0]
    lo, hi = min(xs), max(xs)
    for a, b in KNOWN_SCALES:
        if a <= lo and hi <= b:
            if (a, b) == (1.0, 5.0) and not all(x == int(x) for x in xs):
                continue
            return a, b
    if hi - lo <= 0:
        return lo - 0.5, hi + 0.5
    return lo, hi


def effective_variance(n: int, var: float) -> float:
    """The variance with one pseudo-observation of maximal variance (0.25 on [0, 1]) among
    ``n``: a sample of identical scores does not claim certainty."""
    return (n * var + 0.25) / (n + 1)


@dataclass(frozen=True)
class ScoreSummary:
    """What a baseline keeps of one evaluator's scores: count, mean and variance (in score
    units), the scale and a 101-level histogram of the scores on it (for tests of the
    whole distribution). Content-free and JSON-able (:meth:`to_dict`)."""

    n: int
    mean: float
    var: float
    lo: float
    hi: float
    #: level (0..100 over the scale) -> count
    hist: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_scores(cls, values: Iterable[float],
                    scale: tuple[float, float] | None = None) -> ScoreSummary:
        xs = np.array([float(v) for v in values if math.isfinite(float(v))], dtype=float)
        lo, hi = scale if scale is not None else infer_scale(xs.tolist())
        if not hi > lo:
            raise ValueError(f"score scale [{lo}, {hi}] is empty")
        if xs.size == 0:
            return cls(0, float("nan"), float("nan"), lo, hi, {})
        xs = np.clip(xs, lo, hi)
        levels = np.rint((xs - lo) / (hi - lo) * HIST_LEVELS).astype(int)
        uniq, counts = np.unique(levels, return_counts=True)
        var = float(xs.var(ddof=1)) if xs.size > 1 else 0.0
        return cls(int(xs.size), float(xs.mean()), var, float(lo), float(hi),
                   {int(u): int(c) for u, c in zip(uniq, counts, strict=True)})

    def normalised(self) -> tuple[float, float]:
        """Mean and variance on [0, 1]."""
        w = self.hi - self.lo
        return (self.mean - self.lo) / w, self.var / (w * w)

    def mean_lower(self, confidence: float) -> float:
        """Lower confidence bound of the mean on [0, 1] (module docstring)."""
        m, v = self.normalised()
        n = max(self.n, 1)
        return float(max(0.0, m - norm.ppf(confidence)
                         * math.sqrt(effective_variance(n, v) / n)))

    def with_counts(self, counts: np.ndarray) -> ScoreSummary:
        """A summary of the same size and scale whose histogram has ``counts`` at this
        one's levels (:meth:`levels`): one bootstrap baseline drawn from it."""
        ys, _ = self.levels()
        q = counts / counts.sum()
        m = float((q * ys).sum())
        var = float((q * (ys - m) ** 2).sum()) * self.n / max(self.n - 1, 1)
        w = self.hi - self.lo
        keep = counts > 0
        return ScoreSummary(self.n, self.lo + m * w, var * w * w, self.lo, self.hi,
                            {int(round(y * HIST_LEVELS)): int(k)
                             for y, k in zip(ys[keep], counts[keep], strict=True)})

    def levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(values on [0, 1], probabilities) of the histogram."""
        if not self.hist:
            return np.array([]), np.array([])
        keys = np.array(sorted(self.hist), dtype=float)
        counts = np.array([self.hist[int(k)] for k in keys], dtype=float)
        return keys / HIST_LEVELS, counts / counts.sum()

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "var": self.var, "scale": [self.lo, self.hi],
                "hist": {str(k): v for k, v in sorted(self.hist.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScoreSummary:
        lo, hi = (float(x) for x in d["scale"])
        return cls(int(d["n"]), float(d["mean"]), float(d["var"]), lo, hi,
                   {int(k): int(v) for k, v in dict(d.get("hist", {})).items()})


def drop_alternatives(ys: np.ndarray, ps: np.ndarray, shift: float
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two shapes of a drop of the mean by ``shift`` (on [0, 1]) of the distribution
    (ys, ps): every score ``shift`` lower (clipped at 0), and a share of the answers
    collapsing to the lowest level (a judge's 1.0s stay 1.0s while some answers fail)."""
    out = [(np.clip(ys - shift, 0.0, 1.0), ps)]
    mean, low = float((ys * ps).sum()), float(ys.min())
    if mean - low > 1e-9:
        q = min(1.0, shift / (mean - low))
        moved = ps * (1.0 - q)
        moved[int(np.argmin(ys))] += q
        out.append((ys, moved))
    return out


def best_lambda(summary: ScoreSummary, m0: float, shift: float, grid: int = 400) -> float:
    """The bet maximising the worst expected log-growth over the :func:`drop_alternatives`
    of the baseline's distribution, on a grid of ``[0, 0.99 / (1 - m0))``: robust to the
    shape of the drop (the growth-optimal bet for a clean shift is twice too bold for a
    lumpy judge whose 1.0s stay, and loses money there)."""
    ys, ps = summary.levels()
    if ys.size == 0:
        m, v = summary.normalised()
        ys, ps = np.array([m]), np.array([1.0])
    top = 0.99 / max(1.0 - m0, 1e-3)
    lams = np.linspace(0.0, top, grid + 1)[1:]
    growth = np.min([(q[None, :] * np.log1p(lams[:, None] * (m0 - y[None, :]))).sum(axis=1)
                     for y, q in drop_alternatives(ys, ps, shift)], axis=0)
    i = int(np.argmax(growth))
    return float(lams[i]) if growth[i] > 0 else float(lams[0])


class ScoreDropCUSUM:
    """Alarms when one evaluator's mean score drops below its baseline (module docstring).

    Parameters
    ----------
    summary:
        The evaluator's baseline scores.
    shift:
        Drop on the normalised scale (a fraction of ``hi - lo``) the bet is tuned for.
    arl0:
        In-control average run length guaranteed (Lorden), in scores.
    confidence:
        Probability over the baseline's sampling that its true mean is above ``m0``.
    h:
        A calibrated threshold (never above Lorden's ``log(arl0)``); None: Lorden's.
    """

    name = "evaluation"

    def __init__(self, summary: ScoreSummary, *, shift: float = 0.1, arl0: float = 10_000.0,
                 confidence: float = 0.95, h: float | None = None) -> None:
        if summary.n < 2:
            raise ValueError("an evaluator baseline needs at least 2 scores")
        if not 0 < shift < 1:
            raise ValueError(f"shift must be in (0, 1) of the scale, got {shift}")
        if not arl0 > 1:
            raise ValueError(f"arl0 must be > 1, got {arl0}")
        self.summary = summary
        self.shift = shift
        self.arl0 = arl0
        self.m0 = summary.mean_lower(confidence)
        if self.m0 <= 0.0:
            raise ValueError("the baseline's scores sit at the bottom of the scale: "
                             "a drop cannot be seen")
        self.lam = best_lambda(summary, self.m0, shift)
        #: Lorden's threshold log(arl0) (valid for any score distribution), or a lower one
        #: calibrated on the baseline's own distribution (``bootstrap.score_threshold``)
        self.lorden_h = math.log(arl0)
        self.h = self.lorden_h if h is None else min(float(h), self.lorden_h)
        self.statistic = 0.0
        self.n = 0
        self.drift_detected = False

    @property
    def threshold(self) -> float:
        """The alarm threshold ``h`` (the detector protocol's name for it)."""
        return self.h

    def update(self, score: float) -> None:
        s = self.summary
        y = min(max((float(score) - s.lo) / (s.hi - s.lo), 0.0), 1.0)
        self.statistic = max(0.0, self.statistic + math.log1p(self.lam * (self.m0 - y)))
        self.n += 1
        self.drift_detected = self.statistic >= self.h

    def reset(self) -> None:
        self.statistic = 0.0
        self.drift_detected = False

    def evidence(self) -> dict[str, Any]:
        s = self.summary
        w = s.hi - s.lo
        return {"statistic": self.statistic, "threshold": self.h, "lambda": self.lam,
                "baseline_mean": s.mean, "baseline_mean_lower": s.lo + self.m0 * w,
                "scale": [s.lo, s.hi], "shift": self.shift * w, "arl0": self.arl0}
