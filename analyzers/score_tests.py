"""Candidate against baseline on one evaluator's graded scores: the gate's tests.

Scores are mapped to [0, 1] with the evaluator's scale (``detectors/score.py``); ``drop``
is the smallest fall of the mean, as a fraction of the scale, that counts (the gate's
``score_drop``, default 0.1). Two questions, as for the pass rate (``verdicts.py``):

- **did the mean drop?** H0: mu_c >= mu_b against mu_c < mu_b;
- **is the candidate no worse than baseline - drop?** (non-inferiority) H0: mu_c <=
  mu_b - drop against mu_c > mu_b - drop.

**Fixed n** (:func:`score_verdict`, the offline gate): Welch's t statistics on the two
samples (the baseline given as count, mean and variance: its summary, or its runs' scores
when the baseline came as span files). Scores are bounded, so the central limit theorem
holds quickly even for lumpy, ordinal scores; the variance gets one pseudo-observation of
maximal variance (0.25 on [0, 1]) so a sample of identical scores does not claim
certainty. Its Type I error on realistic lumpy scores is measured in
tests/analyzers/test_score_tests.py.

**Sequential** (:class:`SequentialScoreTest`, ``gate --run``): two test supermartingales
on the candidate's scores y_1, y_2, ... (betting e-processes, valid at any stopping time
by Ville's inequality, for any distribution on [0, 1], no Gaussian approximation):

- regression: ``E_F = prod (1 + lam_F (m_lo - y_i))``; Fail when ``E_F >= 2 / alpha``,
  with ``m_lo`` the baseline mean's lower confidence bound at level 1 - alpha / 2;
- non-inferiority: ``E_P = prod (1 + lam_P (y_i - (m_hi - drop)))``; Pass when
  ``E_P >= 2 / beta``, with ``m_hi`` the upper bound at level 1 - beta / 2.

So an unchanged candidate is failed with probability at most alpha (alpha / 2 for the
baseline's estimate, alpha / 2 for the e-process) and a candidate whose mean dropped by
``drop`` or more passes with probability at most beta. The bets are fixed before the
first run, each the one maximising the expected log-growth under a law the test is meant
for: ``lam_P`` under the baseline's own distribution (the candidate the gate hopes to
see), and one ``lam_F`` per shape of a drop of ``drop`` (``detectors/score.py``
``drop_alternatives``): the baseline's law shifted down, and a share of its answers
collapsing to the lowest level. The two differ by a factor 2 (a lumpy judge) to 5 (a
high-quality agent whose 1.0s stay 1.0s while a fifth of its answers fail): the bet tuned
to a clean shift alone expects no score above 1 - drop, bets too boldly and loses money
on a collapse. Each e-process is a weighted average of e-processes (an average of
e-processes is one) betting half, once and twice each designed bet, with weights
:data:`BET_WEIGHTS` (two thirds on the designs: when one is right the average costs
log 1.5 of evidence, not log 3). Measured against the shift-only design (equal weights),
both calibrated: a fifth of a high-quality agent's answers collapsing is failed after 34
scores instead of 129, none undecided after 405 scores against 24%
(tests/analyzers/test_score_tests.py); the lumpy judge's regression after 34 instead of
40 scores, the unchanged 1-5 rubric passed after 51 instead of 55, smooth scores
unchanged (the ``gate_scores`` benchmark at scale 0.1, the test alone on the same
candidates).

**Calibrated thresholds** (:meth:`SequentialScoreTest.calibrate`, what ``gate --run``
uses). The anytime-valid thresholds are far from tight: measured, an unchanged candidate
is failed in 0.5% of gates against the alpha of 5% it may spend, and the test needs about
twice the scores it would at its nominal error rates. The gate has a horizon (its planned
maximum n_plan), so the thresholds can be set on the baseline's own law instead: over
bootstrap baselines (the baseline's sampling) and candidate paths of n_plan scores drawn
from the baseline's histogram, ``h_F`` is the 1 - alpha quantile of the largest
``log E_F``; over paths drawn from the two shapes of a drop of ``drop`` (a clean shift, a
collapse of answers to the lowest level, ``detectors/score.py``), ``h_P`` is the larger
1 - beta quantile of the largest ``log E_P``. Each stays at most its anytime-valid value.
The guarantee becomes the plug-in one the other detectors have (measured, not proven:
error rates in tests/analyzers/test_score_tests.py and the ``gate_scores`` benchmark),
and it covers the drop shapes simulated, not every conceivable one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from assaywatch.analyzers.detectors.score import (
    ScoreSummary,
    drop_alternatives,
    effective_variance,
)
from assaywatch.analyzers.model import Verdict


def _moments(values: NDArray[np.float64]) -> tuple[int, float, float]:
    n = int(values.size)
    return n, float(values.mean()) if n else float("nan"), \
        float(values.var(ddof=1)) if n > 1 else 0.0


def normalise(scores: Sequence[float] | NDArray[np.float64],
              summary: ScoreSummary) -> NDArray[np.float64]:
    """Scores on [0, 1] with the baseline evaluator's scale (clipped)."""
    x = np.asarray(scores, dtype=float)
    x = x[np.isfinite(x)]
    out: NDArray[np.float64] = np.clip((x - summary.lo) / (summary.hi - summary.lo), 0.0, 1.0)
    return out


@dataclass(frozen=True)
class ScoreTestResult:
    """The two one-sided p-values of a fixed-n comparison, on the [0, 1] scale."""

    evaluator: str
    n_b: int
    n_c: int
    mean_b: float
    mean_c: float
    var_b: float
    var_c: float
    drop: float
    #: p-value of "the mean dropped" (small: it did)
    p_value: float
    #: p-value of the non-inferiority null "dropped by ``drop`` or more" (small: it did not)
    ni_p_value: float

    @property
    def difference(self) -> float:
        return self.mean_c - self.mean_b

    def n_required(self, alpha: float, beta: float) -> int | None:
        """Candidate scores a design at level ``alpha`` needs to show non-inferiority with
        power 1 - beta when nothing changed (None: the baseline is too small)."""
        z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - beta)
        se2 = (self.drop / z) ** 2 - effective_variance(self.n_b, self.var_b) / max(self.n_b, 1)
        if se2 <= 0:
            return None
        return int(math.ceil(effective_variance(max(self.n_c, 1), self.var_c or self.var_b) / se2))


def score_verdict(evaluator: str, summary: ScoreSummary, candidate: Sequence[float],
                  drop: float = 0.1,
                  baseline_scores: Sequence[float] | None = None) -> ScoreTestResult:
    """Welch's one-sided tests of the candidate's scores against the baseline's (module
    docstring); ``baseline_scores``, when the baseline's runs are at hand, replace its
    summary."""
    if not 0 < drop < 1:
        raise ValueError(f"drop must be in (0, 1) of the scale, got {drop}")
    y = normalise(candidate, summary)
    n_c, m_c, v_c = _moments(y)
    if baseline_scores is not None and len(baseline_scores) >= 2:
        n_b, m_b, v_b = _moments(normalise(baseline_scores, summary))
    else:
        n_b = summary.n
        m_b, v_b = summary.normalised()
    if n_c == 0 or n_b == 0:
        return ScoreTestResult(evaluator, n_b, n_c, m_b, m_c, v_b, v_c, drop, 1.0, 1.0)
    a, b = effective_variance(n_b, v_b) / n_b, effective_variance(n_c, v_c) / n_c
    se = math.sqrt(a + b)
    df = (a + b) ** 2 / (a * a / max(n_b - 1, 1) + b * b / max(n_c - 1, 1))
    p = float(stats.t.cdf((m_c - m_b) / se, df))
    p_ni = float(stats.t.sf((m_c - m_b + drop) / se, df))
    return ScoreTestResult(evaluator, n_b, n_c, m_b, m_c, v_b, v_c, drop, p, p_ni)


#: The bets of each e-process, as multiples of each designed one (module docstring) ...
BET_SPREAD = (0.5, 1.0, 2.0)
#: ... and their weights in the average: most on the design, the rest hedging its scale.
BET_WEIGHTS = (1 / 6, 2 / 3, 1 / 6)


def _spread(lams: Sequence[float], top: float) -> tuple[NDArray[np.float64],
                                                         NDArray[np.float64]]:
    """The bets (each design times :data:`BET_SPREAD`, at most ``top``) and the logs of
    their weights (:data:`BET_WEIGHTS`, the designs weighted equally)."""
    bets = np.minimum(np.outer(lams, BET_SPREAD).ravel(), top)
    w = np.tile(np.array(BET_WEIGHTS), len(lams)) / len(lams)
    return bets, np.log(w)


def _log_mix(logs: NDArray[np.float64], log_w: NDArray[np.float64]) -> NDArray[np.float64]:
    """log sum_k w_k exp(logs[k]) over the first axis (one formula for :meth:`update`
    and the vectorised paths, so that both give the same decisions)."""
    x = logs + log_w.reshape((-1,) + (1,) * (logs.ndim - 1))
    top = x.max(axis=0)
    out: NDArray[np.float64] = top + np.log(np.exp(x - top).sum(axis=0))
    return out


def _best_bet(ys: NDArray[np.float64], ps: NDArray[np.float64], centre: float,
              sign: float, grid: int = 400) -> float:
    """The bet lam maximising E[log(1 + lam * sign * (y - centre))] over the distribution
    (ys, ps), on [0, 0.99 * the largest bet keeping every factor positive)."""
    worst = centre if sign > 0 else 1.0 - centre  # largest loss per unit of bet
    top = 0.99 / max(worst, 1e-3)
    lams = np.linspace(0.0, top, grid + 1)[1:]
    growth = (ps[None, :] * np.log1p(lams[:, None] * sign * (ys[None, :] - centre))).sum(1)
    i = int(np.argmax(growth))
    return float(lams[i]) if growth[i] > 0 else float(lams[0])


class SequentialScoreTest:
    """The live gate's anytime-valid test of one evaluator (module docstring).

    Feed candidate scores with :meth:`update`; :attr:`decision` becomes FAIL (the mean
    dropped) or PASS (no worse than baseline - ``drop``) at the first crossing.
    ``lams_fail`` holds the designed regression bets (a clean shift, then a collapse to
    the lowest level when the baseline has more than one level); ``bets_fail`` /
    ``bets_pass`` every bet of the two averages, ``log_w_fail`` / ``log_w_pass`` the logs
    of their weights.
    """

    def __init__(self, evaluator: str, summary: ScoreSummary, *, alpha: float = 0.05,
                 beta: float = 0.1, drop: float = 0.1) -> None:
        if summary.n < 2:
            raise ValueError("an evaluator baseline needs at least 2 scores")
        self.evaluator = evaluator
        self.summary = summary
        self.alpha, self.beta, self.drop = alpha, beta, drop
        m, v = summary.normalised()
        se = math.sqrt(effective_variance(summary.n, v) / summary.n)
        self.m_lo = max(1e-6, m - float(stats.norm.ppf(1 - alpha / 2)) * se)
        self.m_hi = min(1.0, m + float(stats.norm.ppf(1 - beta / 2)) * se)
        ys, ps = summary.levels()
        if ys.size == 0:
            ys, ps = np.array([m]), np.array([1.0])
        # one regression bet per shape of drop: tuned to a clean shift alone, the bet is
        # too bold for a judge whose 1.0s stay while some answers fall to the bottom
        self.lams_fail = [_best_bet(ya, pa, self.m_lo, -1.0)
                          for ya, pa in drop_alternatives(ys, ps, drop)]
        self.lam_fail = self.lams_fail[0]
        self.centre_pass = max(1e-6, self.m_hi - drop)
        self.lam_pass = _best_bet(ys, ps, self.centre_pass, 1.0)
        self.bets_fail, self.log_w_fail = _spread(self.lams_fail, 0.99 / (1.0 - self.m_lo))
        self.bets_pass, self.log_w_pass = _spread([self.lam_pass], 0.99 / self.centre_pass)
        self._logs_fail = np.zeros(self.bets_fail.size)
        self._logs_pass = np.zeros(self.bets_pass.size)
        self.log_fail = 0.0
        self.log_pass = 0.0
        self.h_fail = math.log(2.0 / alpha)
        self.h_pass = math.log(2.0 / beta)
        self.n = 0
        self.decision: Verdict | None = None
        #: thresholds lowered by :meth:`calibrate`
        self.calibrated = False

    def calibrate(self, horizon: int, reps: int = 2_000, boots: int = 100,
                  seed: int = 0) -> None:
        """Lower the two thresholds to what the baseline's own law needs over ``horizon``
        scores (module docstring, "Calibrated thresholds"); never above the anytime-valid
        ``log(2 / alpha)`` and ``log(2 / beta)``."""
        s = self.summary
        ys, ps = s.levels()
        if ys.size < 2 or horizon < 1:
            return
        rng = np.random.default_rng(seed)
        per = max(1, reps // boots)
        top_fail: list[NDArray[np.float64]] = []
        top_pass: dict[int, list[NDArray[np.float64]]] = {}
        shapes = drop_alternatives(ys, ps, self.drop)
        for _ in range(boots):
            boot = s.with_counts(rng.multinomial(s.n, ps).astype(np.float64))
            t_b = SequentialScoreTest(self.evaluator, boot, alpha=self.alpha, beta=self.beta,
                                      drop=self.drop)
            same = ys[rng.choice(ys.size, size=(per, horizon), p=ps)]
            top_fail.append(t_b._log_e(same, fail=True).max(axis=1))
            for k, (ya, pa) in enumerate(shapes):
                worse = ya[rng.choice(ya.size, size=(per, horizon), p=pa)]
                top_pass.setdefault(k, []).append(t_b._log_e(worse, fail=False).max(axis=1))
        h_f = float(np.quantile(np.concatenate(top_fail), 1.0 - self.alpha))
        h_p = max(float(np.quantile(np.concatenate(v), 1.0 - self.beta))
                  for v in top_pass.values())
        self.h_fail = min(self.h_fail, max(h_f, 1e-6))
        self.h_pass = min(self.h_pass, max(h_p, 1e-6))
        self.calibrated = True

    def _log_e(self, y: NDArray[np.float64], fail: bool) -> NDArray[np.float64]:
        """log E_F (``fail``) or log E_P after each score of each row of ``y`` (on [0, 1])."""
        bets = self.bets_fail if fail else self.bets_pass
        step = (self.m_lo - y) if fail else (y - self.centre_pass)
        logs = np.cumsum(np.log1p(bets[:, None, None] * step[None, :, :]), axis=2)
        return _log_mix(logs, self.log_w_fail if fail else self.log_w_pass)

    def _paths(self, y: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """log E_F and log E_P after each score of each row of ``y`` (on [0, 1])."""
        return self._log_e(y, fail=True), self._log_e(y, fail=False)

    def update(self, score: float) -> None:
        if self.decision is not None or not math.isfinite(score):
            return
        s = self.summary
        y = min(max((score - s.lo) / (s.hi - s.lo), 0.0), 1.0)
        self.n += 1
        self._logs_fail += np.log1p(self.bets_fail * (self.m_lo - y))
        self._logs_pass += np.log1p(self.bets_pass * (y - self.centre_pass))
        self.log_fail = float(_log_mix(self._logs_fail, self.log_w_fail))
        self.log_pass = float(_log_mix(self._logs_pass, self.log_w_pass))
        if self.log_fail >= self.h_fail:
            self.decision = Verdict.FAIL
        elif self.log_pass >= self.h_pass:
            self.decision = Verdict.PASS

    def simulate(self, draw: NDArray[np.float64]) -> tuple[NDArray[np.int8], NDArray[np.int64]]:
        """The decisions of replicates (rows of ``draw``, scores in the evaluator's units):
        +1 Fail, -1 Pass, 0 undecided after all columns; and the scores each spent."""
        s = self.summary
        lf, lp = self._paths(np.clip((draw - s.lo) / (s.hi - s.lo), 0.0, 1.0))
        cols = draw.shape[1]
        first_f = np.where((lf >= self.h_fail).any(1), (lf >= self.h_fail).argmax(1), cols)
        first_p = np.where((lp >= self.h_pass).any(1), (lp >= self.h_pass).argmax(1), cols)
        out = np.zeros(draw.shape[0], dtype=np.int8)
        out[(first_f <= first_p) & (first_f < cols)] = 1
        out[(first_p < first_f)] = -1
        n = np.minimum(np.minimum(first_f, first_p) + 1, cols).astype(np.int64)
        return out, n


# -- the best any test can do -----------------------------------------------------------------
def kl_inf(values: NDArray[np.float64], weights: NDArray[np.float64], mean: float, *,
           lo: float = 0.0, hi: float = 1.0, below: bool = True) -> float:
    """The least Kullback-Leibler divergence KL(P || Q) from the law ``P`` (``values``
    with probabilities ``weights``) to any law ``Q`` on [lo, hi] whose mean is at most
    ``mean`` (``below``; at least, else). Dual form (Honda and Takemura's K_inf):
    ``max over 0 <= l <= 1 / (mean - lo) of E_P log(1 + l (X - mean))`` (below), with
    ``1 - l (X - mean)`` and ``l <= 1 / (hi - mean)`` above; 0 when ``P`` is already
    there. It is the best growth rate a betting test can reach against all such ``Q``.
    """
    from scipy.optimize import minimize_scalar

    x = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float) / float(np.sum(weights))
    mu = float(w @ x)
    if (below and mu <= mean) or (not below and mu >= mean):
        return 0.0
    sign, room = (1.0, mean - lo) if below else (-1.0, hi - mean)
    if room <= 0:
        return math.inf
    top = (1.0 - 1e-12) / room

    def neg_growth(lam: float) -> float:
        return -float(w @ np.log1p(sign * lam * (x - mean)))

    res = minimize_scalar(neg_growth, bounds=(0.0, top), method="bounded",
                          options={"xatol": 1e-12 * max(top, 1.0)})
    return max(-float(res.fun), 0.0)


def min_expected_n(kl: float, right: float, wrong: float) -> float:
    """Wald's lower bound on the expected sample size, under ``P``, of any sequential test
    that decides one way with probability ``right`` under ``P`` and at most ``wrong``
    under every law ``Q`` of the other hypothesis, when ``kl`` is the least
    KL(P || Q) over them (:func:`kl_inf`): ``(r log(r / w) + (1 - r) log((1 - r) / (1 -
    w))) / kl``."""
    r, q = right, wrong
    info = r * math.log(r / q) + (1 - r) * math.log((1 - r) / (1 - q))
    return info / kl if kl > 0 else math.inf
