"""Two-sample Hotelling T^2 on projected fingerprints (paper Theorem 7.1, SPEC.md).

The test
--------
With baseline mean m_b (n_b runs) and candidate mean m_c (n_c runs), n = n_b + n_c,

    S_pooled = ((n_b - 1) S_b + (n_c - 1) S_c) / (n - 2)
    T^2      = (n_b n_c / n) (m_c - m_b)' S_pooled^-1 (m_c - m_b)
    F        = (n - d - 1) / ((n - 2) d) T^2  ~  F(d, n - d - 1)  under H0: mu_b = mu_c

(Gaussian rows, common covariance). The baseline enters only through its sufficient
statistics (mean, unbiased covariance, n), so a frozen :class:`Baseline` suffices.

The projection
--------------
Fingerprints are rank-deficient by construction: action shares sum to at most 1, the
``tool:`` columns sum to ``frac_tool``, and many streams never retrieve or delegate
(constant columns). Inverting S_pooled there is impossible and a pseudo-inverse with the
nominal d degrees of freedom wastes power: the statistic has only rank(S) dimensions of
signal, but the critical value is that of d. So:

1. Features with zero pooled variance are set aside (see "constant features" below).
2. The rest are standardised by their pooled standard deviation. Fingerprint features mix
   units (log token counts, shares, depth counts); principal components of the raw
   covariance would be chosen by the units, those of the correlation matrix are not.
   Hotelling's T^2 itself is invariant to this rescaling when no component is dropped.
3. The eigen-decomposition of the pooled correlation matrix is taken; components with an
   eigenvalue below ``1e-9`` of the largest are null directions (exact collinearity up to
   rounding) and are removed.
4. Of the remaining components, the top d_eff explaining >= ``threshold`` of their total
   variance (paper Eq. 28) are kept, and T^2 is computed on them with df = (d_eff,
   n - d_eff - 1). ``threshold=1.0`` keeps every non-null component (the exact
   rank-restricted test).

Default threshold: 1.0, not the paper's 0.95. Dropping the low-variance components
throws away exactly the directions where a small shift is most significant. Fingerprint
duration is strongly tied to the step count, so a pure latency change moves the fingerprint
along a low-variance residual direction: measured (tests/benchmarks/bench_hotelling.py,
simulated agent, 200 replicates) latency x1.5 is detected 22% of the time at 50 runs per
side and 84% at 200 with the 95% truncation, 100% at every size with all non-null
components. The truncation gains only modestly where shifts lie along high-variance
directions (tool-mix swap at 50 per side: 49% vs 36%; output length x1.2 at 200: 72% vs
68%). ``threshold=0.95`` remains available.

The pooled within-group covariance is independent of the group means for Gaussian data, so
choosing the subspace from it does not bias the test under H0 (measured Type I at
alpha = 0.05 on rank-deficient simulated fingerprints: see tests/analyzers/test_hotelling.py).

Calibration (``calibration="auto"``, what the gate uses)
---------------------------------------------------------
The F reference assumes Gaussian rows. Fingerprints are counts, shares and capped
latencies with rare events (an error, a handoff); the mean of a *small* candidate is then
far from Gaussian, and with a big baseline nothing averages it out: measured on
tests/realworld (18 features, alpha = 0.001), 1,000 baseline vs 30 candidate runs reject
10x the nominal rate, 2,000 vs 50 7x, 2,000 vs 200 1.8x, while balanced samples keep it
(232 vs 232: 0.25x, 480 vs 480: 2x within Monte Carlo error of 1x). With equal sizes the
skewness of the two means cancels in their difference; with unequal sizes it does not.

Switch rule: the F reference is used when the samples are balanced and large,
max(n_b, n_c) <= ``BALANCE_RATIO`` (4) x min(n_b, n_c) and min(n_b, n_c) >= ``MIN_PER_DIM``
(10) x (d_eff + 1); otherwise, up to ``RESAMPLE_MAX_N`` candidate runs, the p-value comes
from ``resamples`` (1,999, seeded) resamples of the same projected statistic:

* **permutation** when the baseline's rows are given (``X_b``): rows are pooled, the metric
  is the *label-free* total covariance of the pooled rows (so the statistic is a function of
  the pooled data and the labels only, and the test is exact in finite samples for any
  distribution), and random relabellings give the null distribution;
* **bootstrap** when only the baseline's sufficient statistics are known (a frozen
  baseline): the candidate's rows, re-centred on their own mean (H0 imposed), are resampled
  with replacement, plus a Gaussian term for the baseline mean's own sampling
  (covariance S_b / n_b in the projected space). A candidate that happened to draw rare runs
  carries their spread into its resamples, so this is conservative where the F reference is
  most anti-conservative: measured 0.024 at alpha = 0.05 and 0 at 0.01 for 1,000 vs 30,
  0.052 and 0.008 for 2,000 vs 200.

p = (1 + #{resampled >= observed}) / (resamples + 1), at least 1/2,000: enough for Holm
over 40 tests at alpha = 0.05 (first step 0.00125). ``calibration="f"`` (the default, and
what the monitor's windowed test uses) keeps the F reference; ``"resample"`` forces
resampling. Cost: about 5 ms for 50 candidate runs, 0.3 s for a permutation with 10,000
pooled rows.

Constant features. A feature with zero variance in both samples but different means (every
baseline run had depth 1, every candidate run depth 2) is a change no noise can explain; it
is reported with an infinite shift in ``constant_shifts`` and forces ``reject`` with
``p_value = 0``. Equal constants are simply dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import special, stats

#: Eigenvalues below this fraction of the largest are treated as exact zeros.
NULL_EIGEN_RTOL = 1e-9
#: Default variance share of the test's projection (every non-null component; see above).
DEFAULT_THRESHOLD = 1.0
#: Calibration switch (module docstring): F only when max/min sample size <= this ...
BALANCE_RATIO = 4.0
#: ... and the smaller sample has at least this many runs per projected dimension (+1).
MIN_PER_DIM = 10
#: Resamples of the permutation or bootstrap calibration.
RESAMPLES = 1_999
#: Largest candidate (bootstrap) or pooled sample (permutation) that is resampled; beyond
#: it the F reference is used (the candidate mean is then close to Gaussian).
RESAMPLE_MAX_N = 20_000
#: Rows per chunk of resampled index matrices (bounds memory).
_CHUNK_CELLS = 2_000_000
Calibration = Literal["f", "auto", "resample"]

#: Pooled standard deviations below this (relative to max(1, largest sd)) mean "constant".
CONSTANT_SD_RTOL = 1e-12


def _null_mask(eigvals: NDArray[np.float64]) -> NDArray[np.bool_]:
    top = float(eigvals.max()) if eigvals.size else 0.0
    return eigvals > NULL_EIGEN_RTOL * top if top > 0 else np.zeros(eigvals.shape, bool)


def _deff_from_eigvals(eigvals_desc: NDArray[np.float64], threshold: float) -> int:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    total = float(eigvals_desc.sum())
    if eigvals_desc.size == 0 or total <= 0:
        return 0
    if threshold >= 1.0:
        return int(eigvals_desc.size)
    frac = np.cumsum(eigvals_desc) / total
    # tiny tolerance so that an exact 0.95 share is not lost to rounding
    return int(np.searchsorted(frac, threshold - 1e-12) + 1)


def effective_dimension(
    cov: NDArray[np.float64], threshold: float = 0.95, *, standardize: bool = False
) -> int:
    """Fewest principal components explaining >= ``threshold`` of the variance (Eq. 28).

    Parameters
    ----------
    cov:
        A covariance matrix (d x d).
    threshold:
        Share of the total variance to explain, in (0, 1].
    standardize:
        Use the correlation matrix (drop constant features) instead of ``cov``.

    Returns
    -------
    int
        d_eff, 0 for an all-zero covariance. Null (collinear) components never count.

    Examples
    --------
    >>> effective_dimension(np.diag([10.0, 1.0, 0.0]), 0.9)
    1
    >>> effective_dimension(np.diag([10.0, 1.0, 0.0]), 0.95)
    2
    """
    c = np.asarray(cov, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"cov must be a square matrix, got shape {c.shape}")
    if standardize:
        sd = np.sqrt(np.clip(np.diag(c), 0.0, None))
        keep = sd > CONSTANT_SD_RTOL * max(1.0, float(sd.max(initial=0.0)))
        c = c[np.ix_(keep, keep)] / np.outer(sd[keep], sd[keep])
    ev = np.asarray(np.linalg.eigvalsh((c + c.T) / 2.0)[::-1], dtype=np.float64)
    return _deff_from_eigvals(ev[_null_mask(ev)], threshold)


@dataclass(frozen=True, slots=True)
class Projection:
    """Standardise-and-rotate map onto the top principal components of a covariance.

    ``scores(x) = V' ((x - center)[keep] / sd[keep]) / sqrt(eigvals)``: whitened component
    scores, identity covariance when x follows ``cov``. Useful for windowed T^2 / MEWMA.
    """

    center: NDArray[np.float64]
    keep: NDArray[np.bool_]
    sd: NDArray[np.float64]
    eigvals: NDArray[np.float64]
    eigvecs: NDArray[np.float64]
    rank: int

    @property
    def d_eff(self) -> int:
        return int(self.eigvals.size)

    @classmethod
    def fit(
        cls, center: NDArray[np.float64], cov: NDArray[np.float64],
        threshold: float = DEFAULT_THRESHOLD,
    ) -> Projection:
        """Fit on a mean and covariance (see the module docstring, steps 1-4)."""
        c = np.asarray(cov, dtype=np.float64)
        c = (c + c.T) / 2.0
        sd = np.sqrt(np.clip(np.diag(c), 0.0, None))
        keep = sd > CONSTANT_SD_RTOL * max(1.0, float(sd.max(initial=0.0)))
        s = sd[keep]
        r = c[np.ix_(keep, keep)] / np.outer(s, s)
        ev, vec = np.linalg.eigh(r)
        ev, vec = ev[::-1], vec[:, ::-1]
        nn = _null_mask(ev)
        ev, vec = ev[nn], vec[:, nn]
        k = _deff_from_eigvals(ev, threshold)
        return cls(np.asarray(center, dtype=np.float64), keep, sd, ev[:k], vec[:, :k],
                   int(nn.sum()))

    def scores(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Whitened scores of one vector (d,) or of rows (n, d)."""
        z = (np.asarray(x, dtype=np.float64) - self.center)[..., self.keep] / self.sd[self.keep]
        out: NDArray[np.float64] = (z @ self.eigvecs) / np.sqrt(self.eigvals)
        return out


@dataclass(frozen=True, slots=True)
class FeatureShift:
    """Standardised mean shift of one original feature: (m_c - m_b) / sd_pooled."""

    name: str
    index: int
    shift: float
    mean_baseline: float
    mean_candidate: float


@dataclass(frozen=True, slots=True)
class HotellingResult:
    """Outcome of :func:`hotelling_two_sample`.

    ``mahalanobis`` is sqrt((m_c - m_b)' S^-1 (m_c - m_b)) in the projected space (the
    ``assaywatch_fingerprint_shift`` metric); ``shifts`` lists every feature by decreasing
    |shift|; ``rank`` is the number of non-null components before the 95% truncation.
    """

    t2: float
    f: float
    df1: int
    df2: int
    p_value: float
    d_eff: int
    rank: int
    reject: bool
    mahalanobis: float
    n_b: int
    n_c: int
    alpha: float
    shifts: tuple[FeatureShift, ...]
    constant_shifts: tuple[str, ...] = ()
    #: "F", "permutation" or "bootstrap": where ``p_value`` comes from.
    calibration: str = "F"
    #: The F reference's p-value (equal to ``p_value`` when calibration is "F").
    p_value_f: float = math.nan

    @property
    def feature_shifts(self) -> tuple[tuple[str, float], ...]:
        """``(name, standardised shift)`` pairs by decreasing |shift| (``dict()``-able)."""
        return tuple((s.name, s.shift) for s in self.shifts)


def hotelling_two_sample(
    mean_b: NDArray[np.float64],
    cov_b: NDArray[np.float64],
    n_b: int,
    X_c: NDArray[np.float64],
    alpha: float = 0.05,
    threshold: float = DEFAULT_THRESHOLD,
    feature_names: Sequence[str] | None = None,
    *,
    X_b: NDArray[np.float64] | None = None,
    calibration: Calibration = "f",
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> HotellingResult:
    """Hotelling T^2 of a candidate sample against baseline sufficient statistics.

    Parameters
    ----------
    mean_b, cov_b, n_b:
        Baseline fingerprint mean (d,), unbiased covariance (d, d) and number of runs.
    X_c:
        Candidate fingerprints (n_c, d) with the same columns.
    alpha:
        Significance level of ``reject``.
    threshold:
        Variance share that selects d_eff (default 1.0: every non-null component; the
        paper's 0.95 loses power on low-variance shifts, see the module docstring).
    feature_names:
        Names for ``shifts`` (default ``f0``, ``f1``, ...).
    X_b:
        The baseline's rows, when known: the resampling calibration is then an exact
        permutation test instead of a bootstrap of the candidate.
    calibration:
        ``"f"`` (F reference), ``"auto"`` (the switch rule of the module docstring) or
        ``"resample"``.
    resamples, seed:
        Number of permutations or bootstrap resamples, and their seed (deterministic).

    Returns
    -------
    HotellingResult
    """
    mb = np.asarray(mean_b, dtype=np.float64)
    sb = np.asarray(cov_b, dtype=np.float64)
    xc = np.asarray(X_c, dtype=np.float64)
    d = mb.size
    if xc.ndim != 2 or xc.shape[1] != d or sb.shape != (d, d):
        raise ValueError(
            f"shape mismatch: baseline mean {mb.shape}, cov {sb.shape}, candidate {xc.shape}; "
            "the candidate must be fingerprinted with the baseline's tool inventory"
        )
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    n_c = xc.shape[0]
    if n_b < 2 or n_c < 2:
        raise ValueError(f"Hotelling T^2 needs >= 2 runs per side, got n_b={n_b}, n_c={n_c}")
    names = list(feature_names) if feature_names is not None else [f"f{i}" for i in range(d)]
    if len(names) != d:
        raise ValueError(f"{len(names)} feature names for {d} features")
    n = n_b + n_c
    mc = xc.mean(axis=0)
    sc = np.cov(xc, rowvar=False, ddof=1).reshape(d, d)
    pooled = ((n_b - 1) * sb + (n_c - 1) * sc) / (n - 2)
    proj = Projection.fit(mb, pooled, threshold)

    diff = mc - mb
    sd = proj.sd
    const_changed: list[str] = []
    shifts: list[FeatureShift] = []
    for i in range(d):
        if proj.keep[i]:
            sh = float(diff[i] / sd[i])
        else:
            changed = abs(diff[i]) > 1e-12 * max(1.0, abs(mb[i]))
            sh = math.copysign(math.inf, diff[i]) if changed else 0.0
            if changed:
                const_changed.append(names[i])
        shifts.append(FeatureShift(names[i], i, sh, float(mb[i]), float(mc[i])))
    shifts.sort(key=lambda s: -abs(s.shift))

    k = proj.d_eff
    if k == 0:
        t2 = f = 0.0
        p = 1.0
        df2 = n - 1
        maha = 0.0
    else:
        df2 = n - k - 1
        if df2 < 1:
            raise ValueError(
                f"too few runs for {k} components: n_b + n_c = {n} must exceed d_eff + 1; "
                "collect more candidate runs"
            )
        y = proj.scores(mc)  # whitened: (V' z)/sqrt(lambda)
        q = float(y @ y)
        maha = math.sqrt(q)
        t2 = n_b * n_c / n * q
        f = df2 / ((n - 2) * k) * t2
        # scipy.special.fdtrc is the F survival function stats.f.sf calls, without its
        # ~60 microseconds of argument handling (the monitor tests every 25 runs)
        p = float(special.fdtrc(k, df2, f))
    p_f, method = p, "F"
    if k > 0 and _resample(calibration, n_b, n_c, k, X_b):
        rng = np.random.default_rng(seed)
        if X_b is not None:
            p, method = _permutation_p(np.asarray(X_b, dtype=np.float64), xc, threshold,
                                       resamples, rng), "permutation"
        else:
            p, method = _bootstrap_p(proj, sb, n_b, xc, mb, resamples, rng), "bootstrap"
    if const_changed:
        p = 0.0
    return HotellingResult(
        t2=t2, f=f, df1=k, df2=df2, p_value=p, d_eff=k, rank=proj.rank,
        reject=p < alpha, mahalanobis=maha, n_b=n_b, n_c=n_c, alpha=alpha,
        shifts=tuple(shifts), constant_shifts=tuple(const_changed), calibration=method,
        p_value_f=p_f,
    )


def _resample(calibration: str, n_b: int, n_c: int, k: int,
              X_b: NDArray[np.float64] | None) -> bool:
    """The switch rule of the module docstring."""
    if calibration not in ("f", "auto", "resample"):
        raise ValueError(f"calibration must be 'f', 'auto' or 'resample', got {calibration!r}")
    if calibration == "f":
        return False
    size = n_c if X_b is None else n_b + n_c
    if size > RESAMPLE_MAX_N and calibration == "auto":
        return False
    small, big = min(n_b, n_c), max(n_b, n_c)
    return calibration == "resample" or big > BALANCE_RATIO * small or small < MIN_PER_DIM * (k + 1)


def _tail_p(stat: float, null: NDArray[np.float64]) -> float:
    # A relative tolerance so that a resample equal to the observation up to rounding counts.
    hits = int(np.count_nonzero(null >= stat * (1 - 1e-10)))
    return (1 + hits) / (null.size + 1)


def _permutation_p(xb: NDArray[np.float64], xc: NDArray[np.float64], threshold: float,
                   resamples: int, rng: np.random.Generator) -> float:
    """Exact permutation test of the mean difference in the metric of the pooled rows'
    total (label-free) covariance."""
    if xb.ndim != 2 or xb.shape[1] != xc.shape[1] or xb.shape[0] < 2:
        raise ValueError(f"X_b must be (n_b >= 2, {xc.shape[1]}), got shape {xb.shape}")
    y = np.vstack([xb, xc])
    n, small = y.shape[0], min(xb.shape[0], xc.shape[0])
    centre = y.mean(axis=0)
    total = np.cov(y, rowvar=False, ddof=1).reshape(y.shape[1], y.shape[1])
    z = Projection.fit(centre, total, threshold).scores(y)
    if z.shape[1] == 0:
        return 1.0
    tot = z.sum(axis=0)

    def stat(sums: NDArray[np.float64]) -> NDArray[np.float64]:
        d = sums / small - (tot - sums) / (n - small)
        out: NDArray[np.float64] = np.einsum("ij,ij->i", d, d)
        return out

    first = 0 if xb.shape[0] == small else xb.shape[0]  # rows of the smaller group
    observed = float(stat(z[first:first + small].sum(axis=0)[None, :])[0])
    null = np.empty(resamples)
    rows = max(1, _CHUNK_CELLS // max(n, small * z.shape[1]))
    for start in range(0, resamples, rows):
        m = min(rows, resamples - start)
        if 20 * small < n:  # a few rows out of many: Floyd's sampling, O(small) per draw
            pick = np.stack([rng.choice(n, small, replace=False, shuffle=False)
                             for _ in range(m)])
        else:
            pick = np.argpartition(rng.random((m, n)), small - 1, axis=1)[:, :small]
        null[start:start + m] = stat(z[pick].sum(axis=1))
    return _tail_p(observed, null)


def _bootstrap_p(proj: Projection, cov_b: NDArray[np.float64], n_b: int,
                 xc: NDArray[np.float64], mean_b: NDArray[np.float64], resamples: int,
                 rng: np.random.Generator) -> float:
    """Bootstrap under H0 from the candidate's rows (re-centred) plus the baseline mean's
    Gaussian sampling term, in the test's own projected metric."""
    yc = proj.scores(xc)
    n_c, k = yc.shape
    centre = yc.mean(axis=0)
    d = centre - proj.scores(mean_b)
    observed = float(d @ d)
    # Covariance of the baseline mean in score space: A S_b A' / n_b, A the projection's map.
    a = (proj.eigvecs / np.sqrt(proj.eigvals)).T / proj.sd[proj.keep]
    sb = np.asarray(cov_b, dtype=np.float64)[np.ix_(proj.keep, proj.keep)]
    w, v = np.linalg.eigh(a @ sb @ a.T / n_b)
    root = v * np.sqrt(np.clip(w, 0.0, None))
    null = np.empty(resamples)
    rows = max(1, _CHUNK_CELLS // (n_c * max(1, k)))
    for start in range(0, resamples, rows):
        m = min(rows, resamples - start)
        boot = yc[rng.integers(0, n_c, size=(m, n_c))].mean(axis=1) - centre
        boot += rng.standard_normal((m, k)) @ root.T
        null[start:start + m] = np.einsum("ij,ij->i", boot, boot)
    return _tail_p(observed, null)


def hotelling_from_samples(
    X_b: NDArray[np.float64],
    X_c: NDArray[np.float64],
    alpha: float = 0.05,
    threshold: float = DEFAULT_THRESHOLD,
    feature_names: Sequence[str] | None = None,
    *,
    calibration: Calibration = "f",
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> HotellingResult:
    """:func:`hotelling_two_sample` with the baseline given as raw fingerprints (n_b, d)
    (a resampling calibration is then a permutation test)."""
    xb = np.asarray(X_b, dtype=np.float64)
    if xb.ndim != 2 or xb.shape[0] < 2:
        raise ValueError(f"X_b must be (n_b >= 2, d), got shape {xb.shape}")
    cov = np.cov(xb, rowvar=False, ddof=1).reshape(xb.shape[1], xb.shape[1])
    return hotelling_two_sample(xb.mean(axis=0), cov, xb.shape[0], X_c, alpha, threshold,
                                feature_names, X_b=xb, calibration=calibration,
                                resamples=resamples, seed=seed)


def fingerprint_sample_size(alpha: float, beta: float, d_eff: int, delta_m: float) -> int:
    """Paper Eq. 30: ``ceil((d+1)(z_{1-a} + z_{1-b})^2 / Delta_M^2 + (d+1)/2)``.

    A heuristic from the paper; :func:`hotelling_power` gives the exact power of a design
    (non-central F), which is what a gate should check.
    """
    if not (0 < alpha < 1 and 0 < beta < 1):
        raise ValueError(f"alpha and beta must be in (0, 1), got {alpha}, {beta}")
    if d_eff < 1 or delta_m <= 0:
        raise ValueError(f"need d_eff >= 1 and delta_m > 0, got {d_eff}, {delta_m}")
    z = float(-special.ndtri(alpha) - special.ndtri(beta))  # z_{1-a} + z_{1-b}
    return math.ceil((d_eff + 1) * z * z / delta_m**2 + (d_eff + 1) / 2)


def hotelling_power(n_b: int, n_c: int, d_eff: int, delta_m: float, alpha: float = 0.05) -> float:
    """Exact power of the test (Eq. 32-33): P[F'(d, n-d-1; lambda) > F_{1-a}(d, n-d-1)],
    lambda = n_b n_c / n * Delta_M^2."""
    n = n_b + n_c
    df2 = n - d_eff - 1
    if d_eff < 1 or df2 < 1:
        raise ValueError(f"need d_eff >= 1 and n_b + n_c > d_eff + 1 (got {d_eff}, {n})")
    crit = stats.f.isf(alpha, d_eff, df2)
    lam = n_b * n_c / n * delta_m**2
    if lam <= 0:  # scipy's ncf.sf returns garbage (-0.95) for an exactly central F
        return float(stats.f.sf(crit, d_eff, df2))
    return float(stats.ncf.sf(crit, d_eff, df2, lam))
