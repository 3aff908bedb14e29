"""The graded-score e-CUSUM (``analyzers/detectors/score.py``) on realistic score data.

Four score worlds, none built for the detector: (a) lumpy bounded scores, a point mass at
1.0 plus a Beta on [0, 1] (an LLM judge giving many perfect marks), (b) an ordinal 1-5
rubric, (c) near-binary {0, 0.5, 1} and (d) a smooth Gaussian-like Beta(20, 5), the
second case. Each drop lowers the mean by 0.1 of the scale the way such scores move
(probability leaves the top levels; for (a) perfect marks become partial ones *and* the
partial ones get worse), not by subtraction. Every repetition learns its own baseline of
``n_b`` scores (200 or 1,000) and builds the real detector from it
(``ScoreDropCUSUM(ScoreSummary.from_scores(...), shift=0.1, arl0=500)``); the run-time
recursion is vectorised across repetitions with the detector's own ``lam``, ``m0`` and
``h`` (:func:`test_vectorised_recursion_is_the_detector` checks it against ``update``).

Two thresholds are measured on the same worlds: Lorden's ``log(arl0)`` (``h=None``, the
distribution-free variant) and the **calibrated** one the monitor runs,
``bootstrap.score_threshold(summary, 0.1, arl0, confidence, 40, rng)`` computed per
baseline with its own seeded rng and passed as ``h``.

How each claim is measured (``arl0 = 500``, the production 10,000 would take 20x longer):

* The baseline's bound, ``m0 <= true mean`` (the theorem's hypothesis): over 20,000
  baselines its failure rate is at most ``1 - confidence`` (binomial 0.999 quantile as the
  Monte Carlo margin, here and below).
* In control (Lorden): 400 baselines, 5 streams each of ``HORIZON = 10 arl0`` scores
  from a fresh start, restarted at every alarm.
  - Lorden, given the hypothesis: over the baselines satisfying it, the count of alarm
    onsets is at most the 0.995 Poisson quantile of ``exposure / arl0`` (the renewal
    estimate of the ARL0 is exposure / onsets);
  - the claim at the stated confidence, over all baselines: the share of baselines whose
    own renewal ARL0 (25,000 scores each, ~50 alarms at ARL0 = 500) is below arl0 is at
    most ``1 - confidence``;
  - Ville plus a union bound over start times: ``P(T <= t) <= P(m0 > mean) + t / arl0``
    for the first alarm T of a stream, checked at ``t = arl0 / 10``.
  The first-alarm figure of the benchmark is the censored-exponential estimate (exposure
  until the first alarm or the horizon, over first alarms; with none, its one-sided 95 %
  lower bound).
* In control (calibrated): 200 baselines at n_b = 200 and 300 at n_b = 1,000 per world.
  Its ARL0 is near the target (median 1-3x), where a simulated per-baseline ARL0 is too
  noisy to say which side of the target it falls; the ARL0 of each baseline's detector is
  computed exactly instead (:func:`exact_arl`: the CUSUM's Markov chain on a 500-point
  lattice, mean-preserving split of the increments, Richardson extrapolation; within
  1 % of long simulations, and checked here against one simulated stream per baseline).
  The claim: the share of baselines whose ARL0 is below arl0 is at most
  ``1 - confidence``, per world and pooled over the four worlds per n_b (binomial 0.999
  quantile as the margin: at 300 baselines a share up to 0.093, pooled over 1,200 up to
  0.071, passes).
* Delays, from time 0 and in steady state (change after ``PREFIX = 200`` in-control
  scores; repetitions alarmed in the prefix are dropped and counted), against the oracle:
  Page's CUSUM on the exact log-likelihood ratio of the post- against the pre-change
  distribution (categorical LLR for (b), (c); point mass and Beta densities for (a), (d)),
  threshold calibrated by simulation (``measure.lr_cusum_threshold``) to the **target**
  arl0 = 500, not to the e-CUSUM's achieved ARL0 (far above it, often not measurable in
  the horizon): the ratio charges the e-CUSUM for its conservatism. Target: <= 2x the
  oracle. A ratio counts as met when the measured ratio minus 3 Monte Carlo standard
  errors is at most 2; the cases that do not meet it are xfail with the measured figure.
  The calibrated delays use two repetitions per calibrated baseline (400 or 600).

``python -m tests.benchmarks scores`` prints the same figures with more repetitions and a
pass/fail Bernoulli CUSUM on the thresholded score beside them, and splits the delay.

Measured figures (this seed) are in the xfail reasons below. The eight cases run in two
processes (``measure.default_workers``): about 90 s of CPU, half of it the 2,000
calibrations (~0.05 s each), and 60 s on two cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import linalg, special, stats

from assaywatch.analyzers.detectors.bootstrap import score_threshold
from assaywatch.analyzers.detectors.score import ScoreDropCUSUM, ScoreSummary
from tests.realworld.measure import _map, default_workers, lr_cusum_threshold

pytestmark = pytest.mark.slow  # seeded Monte Carlo, tens of seconds

F64 = NDArray[np.float64]
ARL0 = 500.0
HORIZON = int(10 * ARL0)
SHIFT = 0.1
CONFIDENCE = 0.95
PREFIX = 200
MAX_DELAY = 20_000
SIZES = (200, 1_000)
SEED = 20261220
CHUNK = 250
#: bootstrap baselines per calibrated threshold (the monitor's ``detectors.bootstrap_reps``)
CAL_REPS = 40
#: lattice points of the exact ARL computation
LATTICE = 500


# -- the worlds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Categorical:
    """Scores on a few levels (raw units) with pre- and post-change probabilities."""

    name: str
    levels: tuple[float, ...]
    p0: tuple[float, ...]
    p1: tuple[float, ...]
    scale: tuple[float, float]

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...],
               changed: bool = False) -> F64:
        p = np.array(self.p1 if changed else self.p0)
        idx = np.searchsorted(np.cumsum(p), rng.random(shape) * p.sum(), side="right")
        levels = np.asarray(self.levels, dtype=float)
        return np.asarray(levels[np.minimum(idx, len(self.levels) - 1)], dtype=float)

    def llr(self, x: F64) -> F64:
        table = np.log(np.array(self.p1)) - np.log(np.array(self.p0))
        idx = np.searchsorted(np.asarray(self.levels, dtype=float), x)
        return np.asarray(table[idx], dtype=float)

    def mean(self, changed: bool = False) -> float:
        return float(np.dot(self.levels, self.p1 if changed else self.p0))

    def pass_rate(self, changed: bool = False) -> float:
        """P(score >= the middle of the scale)."""
        mid = (self.scale[0] + self.scale[1]) / 2
        p = self.p1 if changed else self.p0
        return float(sum(q for v, q in zip(self.levels, p, strict=True) if v >= mid))

    def law(self, changed: bool = False) -> tuple[F64, F64]:
        """(normalised levels, probabilities): the exact law of y = (x - lo) / (hi - lo)."""
        lo, hi = self.scale
        return ((np.asarray(self.levels, dtype=float) - lo) / (hi - lo),
                np.asarray(self.p1 if changed else self.p0, dtype=float))


@dataclass(frozen=True)
class MassBeta:
    """A point mass ``w`` at 1.0 plus ``(1 - w)`` Beta(a, b) on [0, 1]; pre and post."""

    name: str
    w0: float
    ab0: tuple[float, float]
    w1: float
    ab1: tuple[float, float]
    scale: tuple[float, float] = (0.0, 1.0)

    def _params(self, changed: bool) -> tuple[float, tuple[float, float]]:
        return (self.w1, self.ab1) if changed else (self.w0, self.ab0)

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...],
               changed: bool = False) -> F64:
        w, (a, b) = self._params(changed)
        x = rng.beta(a, b, size=shape)
        if w > 0:
            x = np.where(rng.random(shape) < w, 1.0, x)
        return np.asarray(x, dtype=float)

    def _logpdf(self, x: F64, changed: bool) -> F64:
        w, (a, b) = self._params(changed)
        top = x >= 1.0
        dens = np.log1p(-w) + stats.beta.logpdf(np.where(top, 0.5, x), a, b)
        return np.asarray(np.where(top, math.log(w) if w > 0 else -np.inf, dens), dtype=float)

    def llr(self, x: F64) -> F64:
        return self._logpdf(x, True) - self._logpdf(x, False)

    def mean(self, changed: bool = False) -> float:
        w, (a, b) = self._params(changed)
        return w + (1 - w) * a / (a + b)

    def pass_rate(self, changed: bool = False) -> float:
        w, (a, b) = self._params(changed)
        return float(w + (1 - w) * stats.beta.sf(0.5, a, b))

    def law(self, changed: bool = False, grid: int = 4_000) -> tuple[F64, F64]:
        """(values, probabilities) on [0, 1]: the atom at 1.0 and the Beta at the midpoints
        of ``grid`` equal-probability cells (a discretisation fine enough for the lattice
        ARL below: its increments are split between lattice points anyway)."""
        w, (a, b) = self._params(changed)
        u = (np.arange(grid) + 0.5) / grid
        return (np.concatenate([special.betaincinv(a, b, u), [1.0]]),
                np.concatenate([np.full(grid, (1 - w) / grid), [w]]))


World = Categorical | MassBeta


def _beta_with_mean(mean: float, concentration: float) -> tuple[float, float]:
    return mean * concentration, (1 - mean) * concentration


# (a) half perfect marks, partial ones Beta(4, 2) (mean 0.667): mean 0.833. After the drop
# 15 points of perfect marks become partial and the partial ones fall to mean 0.590
# (same concentration): 0.35 + 0.65 * 0.590 = 0.733.
LUMPY = MassBeta("lumpy: 50% at 1.0 + Beta", 0.5, (4.0, 2.0), 0.35,
                 _beta_with_mean((0.8333333333 - 0.1 - 0.35) / 0.65, 6.0))
# (b) mean 4.02; 0.15 moves from 5 to 3 and 0.05 from 4 to 2: mean 3.62 (0.1 of 1-5).
ORDINAL = Categorical("ordinal 1-5 rubric", (1.0, 2.0, 3.0, 4.0, 5.0),
                      (0.03, 0.07, 0.15, 0.35, 0.40), (0.03, 0.12, 0.30, 0.30, 0.25),
                      (1.0, 5.0))
# (c) mean 0.80 -> 0.70: full marks become partial or wrong.
BINARY = Categorical("near-binary {0, .5, 1}", (0.0, 0.5, 1.0), (0.15, 0.10, 0.75),
                     (0.22, 0.16, 0.62), (0.0, 1.0))
# (d) the second case: a smooth unimodal score, mean 0.8 -> 0.7 at the same concentration.
SMOOTH = MassBeta("Gaussian-like Beta(20,5)", 0.0, (20.0, 5.0), 0.0, (17.5, 7.5))
WORLDS: dict[str, World] = {"lumpy": LUMPY, "ordinal": ORDINAL, "binary": BINARY,
                            "smooth": SMOOTH}


def normalised_drop(world: World) -> float:
    lo, hi = world.scale
    return (world.mean() - world.mean(True)) / (hi - lo)


# -- learned detectors, vectorised ----------------------------------------------------------
@dataclass
class Learned:
    """One detector per column, each from its own baseline of ``n_b`` scores (the real
    ``ScoreDropCUSUM``'s ``lam``, ``m0`` and ``h``: one Lorden threshold for all, or one
    calibrated threshold per column)."""

    lam: F64
    m0: F64
    h: float | F64
    lo: float
    hi: float
    true_mean: float  # normalised
    passes: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    summaries: list[ScoreSummary] = field(default_factory=list)

    @property
    def covered(self) -> NDArray[np.bool_]:
        """Baselines meeting the theorem's hypothesis m0 <= true mean."""
        return np.asarray(self.m0 <= self.true_mean)

    def repeat(self, k: int) -> Learned:
        """Each detector ``k`` times in a row (``k`` streams per baseline)."""
        h = self.h if np.isscalar(self.h) else np.repeat(self.h, k)
        return Learned(np.repeat(self.lam, k), np.repeat(self.m0, k), h, self.lo,
                       self.hi, self.true_mean, np.repeat(self.passes, k))

    def increments(self, x: F64) -> F64:
        """log(1 + lam (m0 - y)) for scores ``x`` of shape (steps, columns)."""
        y = np.clip((x - self.lo) / (self.hi - self.lo), 0.0, 1.0)
        return np.asarray(np.log1p(self.lam * (self.m0 - y)), dtype=float)


def learn(world: World, n_b: int, reps: int, rng: np.random.Generator,
          arl0: float = ARL0) -> Learned:
    base = world.sample(rng, (reps, n_b))
    sums = [ScoreSummary.from_scores(row) for row in base]  # scale inferred from the scores
    dets = [ScoreDropCUSUM(s, shift=SHIFT, arl0=arl0, confidence=CONFIDENCE) for s in sums]
    assert {(s.lo, s.hi) for s in sums} == {world.scale}
    lo, hi = world.scale
    return Learned(np.array([d.lam for d in dets]), np.array([d.m0 for d in dets]),
                   dets[0].h, lo, hi, (world.mean() - lo) / (hi - lo),
                   (base >= (lo + hi) / 2).sum(axis=1).astype(np.int64), sums)


def learn_calibrated(world: World, n_b: int, reps: int, rng: np.random.Generator,
                     seed: int, arl0: float = ARL0) -> Learned:
    """As :func:`learn`, with the threshold the monitor now runs: per baseline,
    ``bootstrap.score_threshold`` (``CAL_REPS`` bootstrap baselines, the same confidence
    for ``m0`` and for the quantile, its own rng seeded by ``[seed, i]``) passed to the
    detector as ``h``."""
    base = world.sample(rng, (reps, n_b))
    sums = [ScoreSummary.from_scores(row) for row in base]
    dets = [ScoreDropCUSUM(s, shift=SHIFT, arl0=arl0, confidence=CONFIDENCE,
                           h=score_threshold(s, SHIFT, arl0, CONFIDENCE, CAL_REPS,
                                             np.random.default_rng([seed, i])))
            for i, s in enumerate(sums)]
    lo, hi = world.scale
    return Learned(np.array([d.lam for d in dets]), np.array([d.m0 for d in dets]),
                   np.array([d.h for d in dets]), lo, hi, (world.mean() - lo) / (hi - lo),
                   (base >= (lo + hi) / 2).sum(axis=1).astype(np.int64), sums)


# -- exact run lengths ----------------------------------------------------------------------
def _lattice_arl(ys: F64, ps: F64, lam: float, m0: float, h: float, n: int) -> float:
    """Zero-start ARL of ``W = max(0, W + log(1 + lam (m0 - y)))``, alarm at ``W >= h``,
    for y ~ (ys, ps): the Markov chain on the lattice ``i h / n`` (i < n), each increment
    split between its two neighbouring lattice steps with the probabilities that keep its
    mean (no drift error; the error left is O(1/n), removed by :func:`exact_arl`'s
    extrapolation). The transition matrix is Toeplitz but for its first column (the
    reflection at 0): two Levinson solves and a Sherman-Morrison correction."""
    width = h / n
    x = np.log1p(lam * (m0 - ys)) / width
    f = np.clip(np.floor(x), -n - 1, n)
    r = np.clip(x - f, 0.0, 1.0)
    g = np.zeros(2 * n + 3)  # g[d + n + 1] = P(step = d), d in -n-1 .. n+1
    idx = f.astype(np.int64) + n + 1
    np.add.at(g, idx, ps * (1 - r))
    np.add.at(g, idx + 1, ps * r)
    i = np.arange(n)
    col = -g[n + 1 - i]  # (I - T)[i, 0] = -P(step = -i)
    row = -g[n + 1 + i]  # (I - T)[0, j] = -P(step = j)
    col[0] += 1.0
    row[0] += 1.0
    below = np.cumsum(g)[n - i]  # P(step < -i): the mass the reflection adds to column 0
    one = linalg.solve_toeplitz((col, row), np.ones(n))
    u = linalg.solve_toeplitz((col, row), below)
    return float(one[0] + u[0] * one[0] / (1.0 - u[0]))


def exact_arl(world: World, learned: Learned, changed: bool = False,
              n: int = LATTICE) -> F64:
    """Per column, the zero-start run length of its detector under the world's exact law
    (in control: the ARL0 with restarts; ``changed``: the zero-start delay): Richardson
    extrapolation of :func:`_lattice_arl` at ``n`` and ``n / 2`` (checked against
    simulation in :func:`test_exact_arl_is_the_simulated_one`)."""
    ys, ps = world.law(changed)
    hs = np.broadcast_to(np.asarray(learned.h, dtype=float), learned.lam.shape)
    out = np.empty(learned.lam.size)
    for k, (lam, m0, h) in enumerate(zip(learned.lam, learned.m0, hs, strict=True)):
        fine = _lattice_arl(ys, ps, lam, m0, h, n)
        out[k] = 2 * fine - _lattice_arl(ys, ps, lam, m0, h, n // 2)
    return out


def coverage_misses(world: World, n_b: int, reps: int, rng: np.random.Generator,
                    check: int = 20) -> int:
    """Baselines (of ``reps``) whose ``m0`` is above the true mean. ``mean_lower`` is
    vectorised here; its first ``check`` values are compared with the library's."""
    lo, hi = world.scale
    mu = (world.mean() - lo) / (hi - lo)
    z = stats.norm.ppf(CONFIDENCE)
    misses = 0
    for start in range(0, reps, 2_000):
        y = (world.sample(rng, (min(2_000, reps - start), n_b)) - lo) / (hi - lo)
        v_eff = (n_b * y.var(axis=1, ddof=1) + 0.25) / (n_b + 1)
        m0 = np.maximum(0.0, y.mean(axis=1) - z * np.sqrt(v_eff / n_b))
        if start == 0:
            for row, m in zip(y[:check], m0[:check], strict=True):
                lib = ScoreSummary.from_scores(row, scale=(0.0, 1.0)).mean_lower(CONFIDENCE)
                assert lib == pytest.approx(m, abs=1e-12)
        misses += int((m0 > mu).sum())
    return misses


Increments = Callable[[F64], F64]


@dataclass
class InControl:
    """``streams`` consecutive columns per baseline, each run ``horizon`` scores from a
    fresh start and restarted at its alarms."""

    horizon: int
    streams: int
    first: NDArray[np.int64]  # first alarm (1-based) per column, horizon + 1 when none
    onsets: NDArray[np.int64]  # alarms per column over the horizon

    def arl_first(self) -> float:
        """Censored-exponential estimate: exposure until the first alarm or the horizon,
        over first alarms (inf with none)."""
        hits = int((self.first <= self.horizon).sum())
        exposure = float(np.minimum(self.first, self.horizon).sum())
        return exposure / hits if hits else math.inf

    def arl_first_lower(self) -> float:
        """Its one-sided 95 % lower bound (exact Poisson on the count of first alarms)."""
        hits = int((self.first <= self.horizon).sum())
        exposure = float(np.minimum(self.first, self.horizon).sum())
        return exposure / float(stats.chi2.ppf(0.95, 2 * hits + 2) / 2)

    def arl_renewal(self, mask: NDArray[np.bool_] | None = None) -> float:
        """Scores watched per alarm onset (``mask``: per baseline)."""
        onsets = self.per_baseline_onsets()
        if mask is not None:
            onsets = onsets[mask]
        n = int(onsets.sum())
        return onsets.size * self.streams * self.horizon / n if n else math.inf

    def per_baseline_onsets(self) -> NDArray[np.int64]:
        return np.asarray(self.onsets.reshape(-1, self.streams).sum(axis=1))

    def share_below(self, arl0: float) -> float:
        """Share of baselines whose renewal estimate of their own ARL0 is below ``arl0``."""
        exposure = self.streams * self.horizon
        return float(np.mean(self.per_baseline_onsets() > exposure / arl0))

    def share_significantly_below(self, arl0: float, level: float = 0.99) -> float:
        """Share of baselines whose onset count is above the ``level`` Poisson quantile at
        ``arl0`` (their ARL0 is below ``arl0`` at that level)."""
        limit = stats.poisson.ppf(level, self.streams * self.horizon / arl0)
        return float(np.mean(self.per_baseline_onsets() > limit))

    def p_before(self, t: float) -> float:
        return float(np.mean(self.first <= t))


def run_incontrol(world: World, inc: Increments, h: float | F64, columns: int, horizon: int,
                  streams: int, rng: np.random.Generator) -> InControl:
    s = np.zeros(columns)
    first = np.full(columns, horizon + 1, dtype=np.int64)
    onsets = np.zeros(columns, dtype=np.int64)
    done = 0
    while done < horizon:
        size = min(CHUNK, horizon - done)
        for i, d in enumerate(inc(world.sample(rng, (size, columns)))):
            s += d
            np.maximum(s, 0.0, out=s)
            fired = s >= h
            if fired.any():
                onsets += fired
                first[fired & (first > horizon)] = done + i + 1
                s[fired] = 0.0
        done += size
    return InControl(horizon, streams, first, onsets)


@dataclass
class Delays:
    delays: NDArray[np.int64]  # kept repetitions; max_delay + 1 when censored
    dropped: int  # alarmed in the prefix
    max_delay: int

    @property
    def mean(self) -> float:
        return float(self.delays.mean())

    @property
    def se(self) -> float:
        return float(self.delays.std(ddof=1) / math.sqrt(self.delays.size))

    @property
    def censored(self) -> int:
        return int((self.delays > self.max_delay).sum())


def run_delays(world: World, inc: Increments, h: float | F64, reps: int, prefix: int,
               rng: np.random.Generator, max_delay: int = MAX_DELAY) -> Delays:
    """First alarm after a change at ``prefix`` (1 = the first changed score alarms);
    repetitions alarmed in the prefix are dropped."""
    s = np.zeros(reps)
    ok = np.ones(reps, dtype=bool)
    if prefix:
        for d in inc(world.sample(rng, (prefix, reps))):
            s = np.maximum(0.0, s + d)
            ok &= s < h
    delay = np.full(reps, max_delay + 1, dtype=np.int64)
    open_ = ok.copy()
    t = 0
    while t < max_delay and open_.any():
        size = min(CHUNK, max_delay - t)
        for d in inc(world.sample(rng, (size, reps), changed=True)):
            t += 1
            s = np.maximum(0.0, s + d)
            fired = open_ & (s >= h)
            delay[fired] = t
            open_ &= ~fired
            if not open_.any():
                break
    return Delays(delay[ok], int((~ok).sum()), max_delay)


@cache
def oracle_threshold(name: str, target: float, seed: int = SEED) -> float:
    """h of the LLR CUSUM with in-control ARL ``target`` (``measure.lr_cusum_threshold``:
    30 thresholds simulated together on a pool of exact in-control LLRs)."""
    world = WORLDS[name]
    rng = np.random.default_rng([seed, sum(map(ord, name)), int(target)])
    pool = world.llr(world.sample(rng, (200_000,)))
    return lr_cusum_threshold(pool, target, rng)


def oracle_delay(name: str, prefix: int, reps: int, rng: np.random.Generator,
                 target: float = ARL0) -> Delays:
    world = WORLDS[name]
    return run_delays(world, world.llr, oracle_threshold(name, target), reps, prefix, rng)


# -- measurements shared by the tests and the benchmark ------------------------------------
def _ratio(e: Delays, o: Delays) -> tuple[float, float]:
    """(mean delay of ``e`` / that of ``o``, its Monte Carlo standard error)."""
    r = e.mean / o.mean
    return r, r * math.hypot(e.se / e.mean, o.se / o.mean)


@dataclass(frozen=True)
class Sizes:
    coverage: int = 20_000  # baselines for the coverage of m0 (vectorised, no streams)
    baselines: int = 400  # in-control baselines ...
    streams: int = 5  # ... with this many streams of HORIZON scores each
    delays: int = 500  # delay repetitions, each with its own baseline
    oracle: int = 4_000
    #: calibrated baselines per n_b (each costs one score_threshold, ~0.05 s)
    calibrated: tuple[tuple[int, int], ...] = ((200, 200), (1_000, 300))
    #: delay repetitions (zero start and steady state) per calibrated baseline
    calibrated_delays: int = 2

    def n_calibrated(self, n_b: int) -> int:
        return dict(self.calibrated)[n_b]


@dataclass
class Calibrated:
    """The calibrated detector of one world and n_b: its baselines, their exact ARL0s, a
    simulated stream per baseline (the check of the exact figures) and the delays."""

    learned: Learned
    arl0: F64  # exact in-control ARL per baseline (exact_arl)
    incontrol: InControl  # one stream of HORIZON scores per baseline
    delay0: Delays
    steady: Delays

    @property
    def below(self) -> int:
        """Baselines whose ARL0 is below the target."""
        return int((self.arl0 < ARL0).sum())

    @property
    def share_below(self) -> float:
        return self.below / self.arl0.size

    def predicted_onsets(self) -> float:
        """Alarms the exact ARL0s predict in the simulated streams (renewal: horizon /
        ARL per stream)."""
        return float((self.incontrol.horizon / self.arl0).sum())


@dataclass
class Case:
    name: str
    n_b: int
    coverage_reps: int
    coverage_misses: int
    learned: Learned  # the in-control baselines
    incontrol: InControl
    delay_learned: Learned
    delay0: Delays
    steady: Delays
    oracle0: Delays
    oracle_steady: Delays
    cal: Calibrated | None = None

    @property
    def miss_rate(self) -> float:
        return self.coverage_misses / self.coverage_reps

    def ratio(self, steady: bool) -> tuple[float, float]:
        """(Lorden e-CUSUM / oracle mean delay, its Monte Carlo standard error)."""
        if steady:
            return _ratio(self.steady, self.oracle_steady)
        return _ratio(self.delay0, self.oracle0)

    def cal_ratio(self, steady: bool) -> tuple[float, float]:
        """The same for the calibrated e-CUSUM (same oracle, at the target arl0)."""
        assert self.cal is not None
        if steady:
            return _ratio(self.cal.steady, self.oracle_steady)
        return _ratio(self.cal.delay0, self.oracle0)


def measure_calibrated(world: World, n_b: int, baselines: int, delays: int,
                       rng: np.random.Generator, seed: int) -> Calibrated:
    det = learn_calibrated(world, n_b, baselines, rng, seed)
    arl = exact_arl(world, det)
    inc = run_incontrol(world, det.increments, det.h, baselines, HORIZON, 1, rng)
    cols = det.repeat(delays)
    delay0 = run_delays(world, cols.increments, cols.h, cols.lam.size, 0, rng)
    steady = run_delays(world, cols.increments, cols.h, cols.lam.size, PREFIX, rng)
    return Calibrated(det, arl, inc, delay0, steady)


def measure_case(name: str, n_b: int, sizes: Sizes = Sizes(), seed: int = SEED,
                 calibrated: bool = True) -> Case:
    world = WORLDS[name]
    rng = np.random.default_rng([seed, n_b, sum(map(ord, name))])
    misses = coverage_misses(world, n_b, sizes.coverage, rng)
    det = learn(world, n_b, sizes.baselines, rng)
    cols = det.repeat(sizes.streams)
    inc = run_incontrol(world, cols.increments, det.h, cols.lam.size, HORIZON, sizes.streams,
                        rng)
    d_det = learn(world, n_b, sizes.delays, rng)
    delay0 = run_delays(world, d_det.increments, d_det.h, sizes.delays, 0, rng)
    steady = run_delays(world, d_det.increments, d_det.h, sizes.delays, PREFIX, rng)
    cal = measure_calibrated(world, n_b, sizes.n_calibrated(n_b), sizes.calibrated_delays,
                             rng, seed + 1) if calibrated else None
    return Case(name, n_b, sizes.coverage, misses, det, inc, d_det, delay0, steady,
                oracle_delay(name, 0, sizes.oracle, rng),
                oracle_delay(name, PREFIX, sizes.oracle, rng), cal)


def _case_task(task: tuple[str, int, Sizes, int]) -> Case:
    return measure_case(*task)


def measure_cases(keys: list[tuple[str, int]], sizes: Sizes = Sizes(), seed: int = SEED,
                  workers: int | None = None) -> dict[tuple[str, int], Case]:
    """:func:`measure_case` for each key, spread over ``workers`` processes (fork; default
    :func:`measure.default_workers`, at most 2)."""
    tasks = [(name, n_b, sizes, seed) for name, n_b in keys]
    out = _map(_case_task, tasks, default_workers() if workers is None else workers)
    return dict(zip(keys, out, strict=True))


KEYS = [(name, n_b) for name in WORLDS for n_b in SIZES]


@pytest.fixture(scope="module")
def cases() -> dict[tuple[str, int], Case]:
    return measure_cases(KEYS)


# -- the worlds are what they claim ---------------------------------------------------------
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_world_drop_is_a_tenth_of_the_scale(name: str) -> None:
    world = WORLDS[name]
    assert normalised_drop(world) == pytest.approx(SHIFT, abs=1e-6)
    rng = np.random.default_rng(1)
    lo, hi = world.scale
    for changed in (False, True):
        x = world.sample(rng, (200_000,), changed)
        assert lo <= x.min() and x.max() <= hi
        assert x.mean() == pytest.approx(world.mean(changed), abs=4 * x.std() / 447)
    if isinstance(world, MassBeta) and world.w0 > 0:
        share = float(np.mean(world.sample(rng, (100_000,)) == 1.0))
        assert 0.4 <= share <= 0.6  # the lump at 1.0


def test_vectorised_recursion_is_the_detector() -> None:
    rng = np.random.default_rng(5)
    for world in WORLDS.values():
        summary = ScoreSummary.from_scores(world.sample(rng, (200,)))
        det = ScoreDropCUSUM(summary, shift=SHIFT, arl0=50.0, confidence=CONFIDENCE)
        vec = Learned(np.array([det.lam]), np.array([det.m0]), det.h, summary.lo, summary.hi,
                      0.0)
        xs = world.sample(rng, (2_000, 1), changed=True)
        s, alarms = 0.0, 0
        for x, d in zip(xs[:, 0], vec.increments(xs)[:, 0], strict=True):
            det.update(float(x))
            s = max(0.0, s + float(d))
            assert det.statistic == pytest.approx(s, abs=1e-9)
            assert det.drift_detected == (s >= det.h)
            if det.drift_detected:
                alarms += 1
                det.reset()
                s = 0.0
        assert alarms > 0


# -- in control ----------------------------------------------------------------------------
def _binom_limit(reps: int, p: float) -> float:
    """0.999 quantile of a binomial count: the Monte Carlo margin of a share."""
    return float(stats.binom.ppf(0.999, reps, p))


# Measured with this seed (20,000 baselines; the 0.999 binomial limit is 0.0548). The normal
# bound undercovers on negatively skewed scores (a high sample mean comes with a small sample
# variance); the ARL0 claim itself still holds (test_arl0_claim_at_the_stated_confidence:
# no baseline of 400 below arl0, the Ville slack absorbs it).
COVERAGE_XFAIL: dict[tuple[str, int], str] = {
    ("lumpy", 200): "P(m0 > true mean) measured 0.0559 (stated 0.05) at n_b = 200",
    ("lumpy", 1_000): "P(m0 > true mean) measured 0.0561 (stated 0.05) at n_b = 1,000",
    ("ordinal", 200): "P(m0 > true mean) measured 0.0596 (stated 0.05) at n_b = 200",
    ("binary", 200): "P(m0 > true mean) measured 0.0672 (stated 0.05) at n_b = 200",
}


@pytest.mark.parametrize("name, n_b", [
    pytest.param(*k, marks=[pytest.mark.xfail(reason=COVERAGE_XFAIL[k], strict=False)]
                 if k in COVERAGE_XFAIL else []) for k in KEYS])
def test_baseline_lower_bound_covers_the_true_mean(cases: dict[tuple[str, int], Case],
                                                   name: str, n_b: int) -> None:
    c = cases[(name, n_b)]
    limit = _binom_limit(c.coverage_reps, 1 - CONFIDENCE)
    assert c.coverage_misses <= limit, (c.miss_rate, limit / c.coverage_reps)


@pytest.mark.parametrize("name, n_b", KEYS)
def test_lorden_arl0_given_a_covering_baseline(cases: dict[tuple[str, int], Case],
                                               name: str, n_b: int) -> None:
    c = cases[(name, n_b)]
    cov = c.learned.covered
    onsets = c.incontrol.per_baseline_onsets()[cov]
    exposure = onsets.size * c.incontrol.streams * c.incontrol.horizon
    assert onsets.sum() <= stats.poisson.ppf(0.995, exposure / ARL0), (
        int(onsets.sum()), exposure / ARL0)


@pytest.mark.parametrize("name, n_b", KEYS)
def test_arl0_claim_at_the_stated_confidence(cases: dict[tuple[str, int], Case],
                                             name: str, n_b: int) -> None:
    """Share of baselines whose own ARL0 (renewal estimate over their streams) is below
    arl0: at most 1 - confidence (binomial margin)."""
    inc = cases[(name, n_b)].incontrol
    b = inc.per_baseline_onsets().size
    below = inc.share_below(ARL0)
    assert below * b <= _binom_limit(b, 1 - CONFIDENCE), below


@pytest.mark.parametrize("name, n_b", KEYS)
def test_ville_early_alarms(cases: dict[tuple[str, int], Case], name: str, n_b: int) -> None:
    """Ville and a union bound over start times: P(T <= t) <= P(m0 > mean) + t / arl0."""
    c = cases[(name, n_b)]
    streams = c.incontrol.first.size
    early = int((c.incontrol.first <= ARL0 / 10).sum())
    assert early <= _binom_limit(streams, c.miss_rate + 0.1), (early / streams, c.miss_rate)


# -- delays against the oracle -------------------------------------------------------------
RATIO_TARGET = 2.0
# Measured with this seed (e-CUSUM / oracle at the target arl0, +- 1 Monte Carlo se); the
# benchmark splits the gap: the Ville threshold log(arl0) against a calibrated one (the
# e-CUSUM's ARL0 is 13-230x the target), the lower bound m0 eating part of the drop, the
# linear bet against the LLR, and for the lumpy world a bet tuned to an alternative that
# moves the 1.0 lump to 0.9 (analyzers/detectors/score.py ``best_lambda``).
_MEASURED = {("lumpy", 200): ((4.93, 0.20), (5.22, 0.21)),
             ("lumpy", 1_000): ((3.18, 0.07), (3.25, 0.09)),
             ("ordinal", 200): ((9.70, 0.85), (9.59, 0.80)),
             ("ordinal", 1_000): ((4.50, 0.09), (4.83, 0.11)),
             ("binary", 200): ((35.7, 3.7), (40.4, 4.2)),
             ("binary", 1_000): ((5.47, 0.18), (5.83, 0.22)),
             ("smooth", 200): ((2.92, 0.04), (2.92, 0.05)),
             ("smooth", 1_000): ((2.63, 0.03), (2.60, 0.04))}
RATIO_XFAIL: dict[tuple[str, int, bool], str] = {
    (name, n_b, steady): f"delay measured {r:.2f} +- {se:.2f} x the oracle "
                         f"({'steady state' if steady else 'zero start'}, n_b = {n_b})"
    for (name, n_b), pair in _MEASURED.items()
    for steady, (r, se) in zip((False, True), pair, strict=True)}


def _delay_params() -> list[object]:
    out: list[object] = []
    for name, n_b in KEYS:
        for steady in (False, True):
            reason = RATIO_XFAIL.get((name, n_b, steady))
            out.append(pytest.param(
                name, n_b, steady,
                marks=[pytest.mark.xfail(reason=reason, strict=False)] if reason else [],
                id=f"{name}-{n_b}-{'steady' if steady else 'zero'}"))
    return out


@pytest.mark.parametrize("name, n_b, steady", _delay_params())
def test_delay_within_twice_the_oracle(cases: dict[tuple[str, int], Case], name: str,
                                       n_b: int, steady: bool) -> None:
    c = cases[(name, n_b)]
    r, se = c.ratio(steady)
    assert r - 3 * se <= RATIO_TARGET, (round(r, 2), round(se, 2))


UNDETECTED_XFAIL = {
    ("binary", 200): "23 (zero start) and 21 (steady state) of 500 repetitions without an "
    "alarm 20,000 scores after the drop: at n_b = 200 the bound m0 sits 0.043 below the "
    "baseline mean, and baselines that estimate low put m0 at or under the changed mean 0.70",
}


@pytest.mark.parametrize("name, n_b", [
    pytest.param(*k, marks=[pytest.mark.xfail(reason=UNDETECTED_XFAIL[k], strict=False)]
                 if k in UNDETECTED_XFAIL else []) for k in KEYS])
def test_every_drop_is_detected(cases: dict[tuple[str, int], Case], name: str,
                                n_b: int) -> None:
    c = cases[(name, n_b)]
    assert c.delay0.censored == 0 and c.steady.censored == 0, (c.delay0.censored,
                                                               c.steady.censored)


def test_steady_state_is_no_slower_than_a_fresh_start(
        cases: dict[tuple[str, int], Case]) -> None:
    """After 200 in-control scores the statistic is >= 0, the fresh start's value, and the
    recursion is monotone in its start: the steady-state delay is at most the zero-start one
    (within 4 Monte Carlo standard errors of the difference). Few repetitions alarm in the
    prefix: at most 200 / arl0 of them plus the coverage misses (Ville, union bound)."""
    for key, c in cases.items():
        diff = c.steady.mean - c.delay0.mean
        assert diff <= 4 * math.hypot(c.steady.se, c.delay0.se), (key, diff)
        n = c.steady.dropped + c.steady.delays.size
        assert c.steady.dropped <= _binom_limit(n, c.miss_rate + PREFIX / ARL0), key


# -- the calibrated threshold (what the monitor runs) ---------------------------------------
def test_lattice_arl_solves_the_chain() -> None:
    """The Toeplitz + Sherman-Morrison solve is the dense solve of the same chain."""
    rng = np.random.default_rng(3)
    ys, ps = rng.random(7), rng.dirichlet(np.ones(7))
    lam, m0, h, n = 1.7, float(ys @ ps) - 0.03, 1.3, 40
    width = h / n
    x = np.log1p(lam * (m0 - ys)) / width
    f = np.floor(x)
    q = np.zeros((n, n))
    for i in range(n):
        for d, p in [*zip(f, ps * (1 - (x - f)), strict=True),
                     *zip(f + 1, ps * (x - f), strict=True)]:
            j = i + int(d)
            if j < n:
                q[i, max(j, 0)] += p
    dense = float(np.linalg.solve(np.eye(n) - q, np.ones(n))[0])
    assert _lattice_arl(ys, ps, lam, m0, h, n) == pytest.approx(dense, rel=1e-9)


def _cal(cases: dict[tuple[str, int], Case], name: str, n_b: int) -> Calibrated:
    cal = cases[(name, n_b)].cal
    assert cal is not None
    return cal


@pytest.mark.parametrize("name, n_b", KEYS)
def test_calibrated_thresholds_are_below_lorden(cases: dict[tuple[str, int], Case],
                                                name: str, n_b: int) -> None:
    h = np.asarray(_cal(cases, name, n_b).learned.h)
    assert np.all(h <= math.log(ARL0)) and np.all(h > 0)


@pytest.mark.parametrize("name, n_b", KEYS)
def test_exact_arl_is_the_simulated_one(cases: dict[tuple[str, int], Case], name: str,
                                        n_b: int) -> None:
    """The exact ARL0s predict the alarms of one simulated stream per baseline (HORIZON
    scores, restarted at alarms): within 4 Poisson standard deviations of the total."""
    cal = _cal(cases, name, n_b)
    predicted, observed = cal.predicted_onsets(), int(cal.incontrol.onsets.sum())
    assert abs(observed - predicted) <= 4 * math.sqrt(predicted), (observed, predicted)


# Measured with this seed: baselines (of the case's) whose exact ARL0 is below the target.
CAL_CLAIM_XFAIL: dict[tuple[str, int], str] = {}


@pytest.mark.parametrize("name, n_b", [
    pytest.param(*k, marks=[pytest.mark.xfail(reason=CAL_CLAIM_XFAIL[k], strict=True)]
                 if k in CAL_CLAIM_XFAIL else []) for k in KEYS])
def test_calibrated_arl0_claim_at_the_stated_confidence(cases: dict[tuple[str, int], Case],
                                                        name: str, n_b: int) -> None:
    """The calibration's claim: P(ARL0 of the detector learned on a baseline < arl0) <=
    1 - confidence over the baseline's sampling; the exact ARL0 per baseline, binomial
    0.999 quantile as the Monte Carlo margin."""
    cal = _cal(cases, name, n_b)
    b = cal.arl0.size
    assert cal.below <= _binom_limit(b, 1 - CONFIDENCE), (cal.below, b,
                                                          _binom_limit(b, 1 - CONFIDENCE))


CAL_POOLED_XFAIL: dict[int, str] = {}


@pytest.mark.parametrize("n_b", [
    pytest.param(n, marks=[pytest.mark.xfail(reason=CAL_POOLED_XFAIL[n], strict=True)]
                 if n in CAL_POOLED_XFAIL else []) for n in SIZES])
def test_calibrated_arl0_claim_pooled_over_worlds(cases: dict[tuple[str, int], Case],
                                                  n_b: int) -> None:
    """The same claim, pooled over the four worlds (each share <= 1 - confidence implies
    their mean is): four times the baselines, the power to see a share of 0.08."""
    below = sum(_cal(cases, name, n_b).below for name in WORLDS)
    b = sum(_cal(cases, name, n_b).arl0.size for name in WORLDS)
    assert below <= _binom_limit(b, 1 - CONFIDENCE), (below, b,
                                                      _binom_limit(b, 1 - CONFIDENCE))


# Measured by the benchmark ``scores`` (600 calibrated baselines per case, the
# conservative order statistic of bootstrap.score_threshold): calibrated e-CUSUM delay /
# oracle at the target arl0, zero start and steady state; the cases at or above 2.
_CAL_MEASURED: dict[tuple[str, int], tuple[float, float]] = {
    ("lumpy", 200): (1.98, 2.03),
    ("ordinal", 200): (3.23, 3.39),
    ("binary", 200): (5.97, 7.43),
}
CAL_RATIO_XFAIL: dict[tuple[str, int, bool], str] = {
    (name, n_b, steady): f"calibrated: delay measured {r:.2f} x the oracle in the benchmark "
                         f"({'steady state' if steady else 'zero start'}, n_b = {n_b})"
    for (name, n_b), pair in _CAL_MEASURED.items()
    for steady, r in zip((False, True), pair, strict=True)}


def _cal_delay_params() -> list[object]:
    out: list[object] = []
    for name, n_b in KEYS:
        for steady in (False, True):
            reason = CAL_RATIO_XFAIL.get((name, n_b, steady))
            out.append(pytest.param(
                name, n_b, steady,
                marks=[pytest.mark.xfail(reason=reason, strict=False)] if reason else [],
                id=f"{name}-{n_b}-{'steady' if steady else 'zero'}"))
    return out


@pytest.mark.parametrize("name, n_b, steady", _cal_delay_params())
def test_calibrated_delay_within_twice_the_oracle(cases: dict[tuple[str, int], Case],
                                                  name: str, n_b: int, steady: bool) -> None:
    r, se = cases[(name, n_b)].cal_ratio(steady)
    assert r - 3 * se <= RATIO_TARGET, (round(r, 2), round(se, 2))


CAL_UNDETECTED_XFAIL: dict[tuple[str, int], str] = {
    ("binary", 200): "calibrated: in the benchmark 5 of 1,200 repetitions without an alarm "
    "20,000 scores after the drop (m0 at or under the changed mean 0.70)",
}


@pytest.mark.parametrize("name, n_b", [
    pytest.param(*k, marks=[pytest.mark.xfail(reason=CAL_UNDETECTED_XFAIL[k], strict=False)]
                 if k in CAL_UNDETECTED_XFAIL else []) for k in KEYS])
def test_calibrated_every_drop_is_detected(cases: dict[tuple[str, int], Case], name: str,
                                           n_b: int) -> None:
    cal = _cal(cases, name, n_b)
    assert cal.delay0.censored == 0 and cal.steady.censored == 0, (cal.delay0.censored,
                                                                   cal.steady.censored)


def test_calibrated_is_faster_than_lorden(cases: dict[tuple[str, int], Case]) -> None:
    """A lower threshold, the same bet: the calibrated detector's mean delay is below the
    Lorden one's in every world (beyond 3 Monte Carlo standard errors of the difference),
    and its steady state no slower than its fresh start (4 standard errors)."""
    for key, c in cases.items():
        assert c.cal is not None
        for e, lorden in ((c.cal.delay0, c.delay0), (c.cal.steady, c.steady)):
            assert lorden.mean - e.mean > 3 * math.hypot(e.se, lorden.se), key
        diff = c.cal.steady.mean - c.cal.delay0.mean
        assert diff <= 4 * math.hypot(c.cal.steady.se, c.cal.delay0.se), (key, diff)
