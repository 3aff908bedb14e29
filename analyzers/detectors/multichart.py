r"""Multichart CUSUM over whitened shift directions of the fingerprint.

What it computes
----------------
The baseline's covariance :math:`\Sigma` (features scaled by their sd, floored at
``min_sd``; eigen-directions carrying less than ``eig_tol`` of the largest eigenvalue
dropped, so constant and collinear features such as the tool shares that sum to
``frac_tool`` cost nothing) gives the pseudo-inverse :math:`P = \Sigma^{+}`. For a set of
shift directions :math:`e_1, \dots, e_m` in feature space the log-likelihood ratio of a
Gaussian shift along :math:`e_j` is linear in the **projection**

.. math::

    y_j = \mathrm{clip}\Big(\frac{e_j^\top P (x - \mu)}{\sqrt{e_j^\top P e_j}}, -c, c\Big),
    \qquad \mathrm{Var}(y_j) = 1 \text{ in control},

so each direction gets Page's two-sided CUSUM with reference k (half the Mahalanobis
shift it is tuned for):
:math:`U_j \leftarrow \max(0, U_j + y_j - k)`, :math:`D_j \leftarrow \max(0, D_j - y_j - k)`,
alarm when any :math:`U_j \ge h^{+}_j` or :math:`D_j \ge h^{-}_j`. ``statistic`` is the
largest :math:`U_j / h^{+}_j, D_j / h^{-}_j` (the alarm fires at 1, ``threshold`` is 1).

The directions (:func:`shift_directions`): every non-constant feature alone (the
projection is then Hawkins' regression-adjusted variable: the feature's residual given all
the others, which is the optimal statistic for a shift of that feature and is what
"uses the correlation" buys: a latency change moves ``duration`` against what the step
count and tokens predict), and every swap between two of the ``max_swap_tools`` most used
tools (share moves from tool a to tool b with the step counts unchanged, the behaviour
change the fingerprint's tool columns exist for; SPEC.md 7.1).

With ``tool_counts`` (the engine's choice when the thresholds are calibrated on real
runs' fingerprints) the swaps are instead likelihood-ratio CUSUMs on each run's **call
counts** (``toolcounts.py``: ``up`` moves a fifth of tool a's calls to b, ``down`` the
reverse; no reference value, each run's LR clipped at ``count_clip`` nats), for every pair
of the ``max_swap_tools`` tools with the largest call shares, rare tools included. On the
realistic world (tests/realworld) this cut the steady-state delay of the tool swap by 41%
with 2,000-run learned baselines at the same in-control ARL0: the Gaussian chart on the
shares weighs a run of 5 calls like one of 50 and drops tools whose share has sd < min_sd.

Each pair also gets a chart on **whole-run swaps** (``runswap:a>b``,
``toolcounts.run_swap_llr``): in a fifth of the runs every call of a goes to b, as when a
model update changes the tool an agent picks for some kinds of task. A swapped run has no
call of a and more of b, which the per-call chart, built for a share of every run's
calls, weighs little; on the realistic world the whole-run chart's mean per-run LR after
such a swap is 96-100% of the exact oracle's unclipped, its clip of ``RUN_CLIP`` = 8 nats
keeps 55-99% of it, and the steady-state delay went from 4.8x to 2.5-3.1x the oracle's
with 2,000-run learned baselines. Its least threshold is ``count_clip``, as the per-call
charts' (one run alone alarms only with an LR of at least e^count_clip).

With ``latency`` (the engine's choice for a baseline learned from its runs) one more
chart, ``latency``, is the likelihood ratio of every call's latency times
``latency_factor`` (``latency.py``): its input is each run's per-kind latency sums,
appended to the fingerprint (:attr:`input_size`). It brought the steady-state delay of a
x1.3 slowdown from 3.8x to 1.3-1.5x the oracle's with 2,000-run learned baselines.

Choices and why
---------------
* A multichart CUSUM (one LR CUSUM per candidate change, the first to cross alarms) is
  asymptotically optimal for a finite set of post-change laws (Tartakovsky, Nikiforov &
  Basseville 2014, ch. 9): its delay is the oracle's for the true direction plus the
  price of the multiplicity, log(number of charts), in the threshold. An omnibus
  chi-square chart (MEWMA, Crosier's MCUSUM) pays about d/2 log n instead, which in the
  ~20 dimensions of a fingerprint is several times more for a shift along one direction.
* Thresholds are per chart (``h`` of shape (2, m)) because skewed, discrete features
  (``any_error``, counts) need different ones for the same false-alarm rate: they come
  from the baseline's own runs by bootstrap (``bootstrap.calibrate``); without them the
  Gaussian threshold for an ARL0 of ``arl0 * 2m`` per chart is used (Bonferroni in time).
* The frozen baseline is the reference: a running mean would chase the very shift we want
  to detect. Winsorising at ``clip`` bounds what one odd run can add.

Parameters
----------
mean, cov:
    Baseline mean (d) and covariance (d, d) of the fingerprints.
k:
    Reference value, in Mahalanobis units along a direction (half the shift), > 0.
h:
    Thresholds: None (Gaussian, from ``arl0``), a scalar, or an array (2, m) (up, down).
arl0:
    Target in-control ARL of the whole chart set when ``h`` is None.
feature_names:
    Names of the d features (``tool:<name>`` columns are the tool shares).
min_sd, clip, eig_tol, max_swap_tools:
    sd floor, winsorising bound, relative eigenvalue floor, tools paired for swaps.
swap_runs:
    Share of runs the whole-run swap charts are designed for.
swap_ratios:
    Per tool pair, the ratios of call shares the swap charts use, (2, pairs): p_a / p_b
    (``up``) and p_b / p_a (``down``), positive; None: the baseline mean's. The
    calibration passes lower confidence bounds (``toolcounts.swap_ratios``,
    ``Thresholds.swap_ratios``), under which a chart's LR keeps in-control
    expectation <= 1.
tool_counts, tool_shift, count_clip:
    Swap charts on the call counts (needs ``steps`` and ``tool:`` columns of real
    fingerprints), the fraction of a tool's calls they are designed for, the clip (nats)
    of one run's LR, which is also the least threshold of those charts (and of the
    whole-run swap charts and the latency chart).
latency, latency_factor:
    The latency chart's call kinds and model ((a, b, sigma^2) per kind,
    ``latency.fit``), or None for no latency chart; the factor of every call's latency
    it is designed for (its ``down`` side: the inverse).

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(3)
>>> cov = np.array([[1.0, 0.8, 0.0], [0.8, 1.0, 0.0], [0.0, 0.0, 1.0]])
>>> det = MultichartCUSUM(np.zeros(3), cov, feature_names=["steps", "duration", "tokens"])
>>> xs = rng.multivariate_normal(np.zeros(3), cov, size=400)
>>> for x in xs:
...     det.update(x)
>>> det.n_alarms
0
>>> for x in rng.multivariate_normal([0.0, 0.6, 0.0], cov, size=400):
...     det.update(x)
...     if det.drift_detected:
...         break
>>> det.charts_alarmed
['duration:up']

References
----------
Page, E. S. (1954). Continuous inspection schemes. Biometrika 41, 100-115.
Hawkins, D. M. (1991). Multivariate quality control based on regression-adjusted
variables. Technometrics 33, 61-75.
Tartakovsky, A. G., Nikiforov, I. V. & Basseville, M. (2014). Sequential Analysis:
Hypothesis Testing and Changepoint Detection. CRC Press.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from assaywatch.analyzers.detectors.base import Detector, feature_labels, split_arl0
from assaywatch.analyzers.detectors.calibration import gaussian_cusum_threshold
from assaywatch.analyzers.detectors.latency import N_STATS
from assaywatch.analyzers.detectors.latency import sides as latency_sides
from assaywatch.analyzers.detectors.toolcounts import (
    call_shares,
    ratio_logs,
    ratio_weights,
    run_swap_logs,
    run_swap_terms,
    share_ratios,
    swap_terms,
)
from assaywatch.analyzers.detectors.toolcounts import tool_counts as _counts

__all__ = ["MultichartCUSUM", "projection", "shift_directions"]

F64 = NDArray[np.float64]
TOOL_PREFIX = "tool:"
#: clip (nats) of one run's LR on the whole-run swap charts (their least threshold is
#: ``count_clip``): a swapped run's LR grows with its calls of the tool swapped to
RUN_CLIP = 8.0
_NONE = np.zeros(0, dtype=np.int64)

try:  # the recursion over a primed batch, compiled (native/src/cusum.rs)
    from assaywatch_native import cusum_path as _cusum_path
except ImportError:  # pragma: no cover - the pure-Python install
    _cusum_path = None


def _pinv(cov: F64, sd: F64, eig_tol: float) -> F64:
    """Pseudo-inverse of ``cov`` on the directions carrying variance (scaled by ``sd``)."""
    corr = cov / np.outer(sd, sd)
    lam, vec = np.linalg.eigh((corr + corr.T) / 2.0)
    keep = lam > eig_tol * max(float(lam.max()), 1e-12)
    v = vec[:, keep] / sd[:, None]
    # einsum, not BLAS, for these small products: a threaded BLAS on a busy machine spends
    # more time waking its threads than computing (the bootstrap calls this 40 times)
    out: F64 = np.einsum("ik,k,jk->ij", v, 1.0 / lam[keep], v)
    return out


def shift_directions(names: Sequence[str], mean: F64, sd: F64, min_sd: float = 0.05,
                     max_swap_tools: int = 8) -> tuple[list[str], F64]:
    """Labels and raw-space vectors (m, d) of the candidate shifts: each non-constant
    feature, then each swap ``swap:a>b`` between two of the most used tools."""
    d = len(names)
    labels, vecs = [], []
    for j in range(d):
        if sd[j] >= min_sd:
            e = np.zeros(d)
            e[j] = 1.0
            labels.append(names[j])
            vecs.append(e)
    tools = [j for j in range(d) if names[j].startswith(TOOL_PREFIX) and sd[j] >= min_sd]
    tools = sorted(tools, key=lambda j: -mean[j])[:max_swap_tools]
    for a_i, a in enumerate(tools):
        for b in tools[a_i + 1:]:
            e = np.zeros(d)
            e[a], e[b] = -1.0, 1.0
            labels.append(f"swap:{names[a][len(TOOL_PREFIX):]}>{names[b][len(TOOL_PREFIX):]}")
            vecs.append(e)
    return labels, np.array(vecs).reshape(len(vecs), d)


def projection(cov: F64, directions: F64, min_sd: float = 0.05,
               eig_tol: float = 1e-3) -> tuple[F64, NDArray[np.bool_]]:
    """Rows a_j = P e_j / sqrt(e_j' P e_j) (so y = a_j'(x - mu) has unit variance) and the
    mask of directions that carry variance (the others get a zero row)."""
    sd = np.maximum(np.sqrt(np.clip(np.diag(cov), 0.0, None)), min_sd)
    pe = np.einsum("md,de->me", directions, _pinv(cov, sd, eig_tol))
    norm2 = np.einsum("ij,ij->i", pe, directions)
    ok = norm2 > 1e-9 * np.einsum("ij,ij->i", directions / sd, directions / sd)
    rows: F64 = np.where(ok[:, None], pe / np.sqrt(np.where(ok, norm2, 1.0))[:, None], 0.0)
    return rows, ok


class MultichartCUSUM(Detector):  # type: ignore[misc,unused-ignore]
    """Two-sided CUSUM per whitened shift direction (module docstring)."""

    _state_fields = ("_up", "_down")

    def __init__(
        self,
        mean: ArrayLike,
        cov: ArrayLike,
        k: float = 0.25,
        h: ArrayLike | None = None,
        arl0: float = 10_000,
        feature_names: Sequence[str] | None = None,
        min_sd: float = 0.05,
        clip: float = 3.0,
        eig_tol: float = 1e-3,
        max_swap_tools: int = 8,
        tool_counts: bool = False,
        tool_shift: float = 0.2,
        count_clip: float = 5.0,
        latency: tuple[Sequence[str], ArrayLike] | None = None,
        latency_factor: float = 1.25,
        swap_runs: float = 0.2,
        swap_ratios: ArrayLike | None = None,
    ) -> None:
        self.mean = mean
        self.cov = cov
        self.k = k
        self.h = h
        self.arl0 = arl0
        self.feature_names = feature_names
        self.min_sd = min_sd
        self.clip = clip
        self.eig_tol = eig_tol
        self.max_swap_tools = max_swap_tools
        self.tool_counts = tool_counts
        self.tool_shift = tool_shift
        self.count_clip = count_clip
        self.latency = latency
        self.latency_factor = latency_factor
        self.swap_runs = swap_runs
        self.swap_ratios = swap_ratios
        self._mean = np.asarray(mean, dtype=np.float64)
        cov_arr = np.asarray(cov, dtype=np.float64)
        d = self._mean.size
        if self._mean.ndim != 1 or d == 0 or cov_arr.shape != (d, d) or not (
                np.all(np.isfinite(self._mean)) and np.all(np.isfinite(cov_arr))):
            raise ValueError(f"mean must be d finite numbers and cov a finite (d, d) matrix, "
                             f"got {self._mean.shape} and {cov_arr.shape}")
        if not (k > 0 and math.isfinite(k)):
            raise ValueError(f"k={k!r} must be a positive reference value (shift / 2)")
        if not (min_sd > 0 and clip > k and 0 < eig_tol < 1):
            raise ValueError("need min_sd > 0, clip > k and 0 < eig_tol < 1")
        names = feature_labels(feature_names, d)
        sd = np.sqrt(np.clip(np.diag(cov_arr), 0.0, None))
        labels, vecs = shift_directions(names, self._mean, sd, min_sd, max_swap_tools)
        rows, ok = projection(cov_arr, vecs, min_sd, eig_tol)
        self._labels = [lab for lab, keep in zip(labels, ok, strict=True) if keep]
        self._rows = rows[ok]
        self._n_features = sum(1 for lab in self._labels if lab in set(names))
        if not (count_clip > 0 and math.isfinite(count_clip)):
            raise ValueError(f"count_clip={count_clip!r} must be a positive number of nats")
        counted = tool_counts and "steps" in names
        if counted:  # the swaps become charts on the call counts (toolcounts.py)
            keep = [j for j, lab in enumerate(self._labels) if not lab.startswith("swap:")]
            self._labels = [self._labels[j] for j in keep]
            self._rows = self._rows[keep]
        self._count_charts(names, counted, tool_shift)
        self._latency_chart(latency, latency_factor)
        m = len(self._labels)
        if h is None:
            h = gaussian_cusum_threshold(k, split_arl0(arl0, max(1, 2 * m)), clip)
        h_arr = np.broadcast_to(np.asarray(h, dtype=np.float64), (2, m)).copy()
        if not (np.all(h_arr > 0) and np.all(np.isfinite(h_arr))):
            raise ValueError("h must be positive finite thresholds, a scalar or shape (2, m)")
        self._h = h_arr
        self._reset()

    def _count_charts(self, names: list[str], on: bool, r: float) -> None:
        """When ``on``, append a swap chart on the call counts' LR (``toolcounts.py``) for
        each pair of the ``max_swap_tools`` tools with the largest call shares (any tool the
        baseline called, however rare: the LR needs no variance floor) and keep their chart
        indices, the tool columns, each pair's (a, b) among them and the weights."""
        cols = [j for j, n in enumerate(names) if on and n.startswith(TOOL_PREFIX)]
        self._steps_col = names.index("steps") if on else 0
        self._tool_cols = np.array(cols, dtype=np.int64)
        p = call_shares(self._mean, self._tool_cols) if cols else np.ones(0)
        seen = [i for i in np.argsort(-p, kind="stable") if self._mean[cols[i]] > 0]
        top = [int(i) for i in seen[:self.max_swap_tools]]
        pairs = [(a, b) for n_a, a in enumerate(top) for b in top[n_a + 1:]]
        start = len(self._labels)
        self._labels += [f"swap:{names[cols[a]][len(TOOL_PREFIX):]}>"
                         f"{names[cols[b]][len(TOOL_PREFIX):]}" for a, b in pairs]
        self._rows = np.vstack([self._rows, np.zeros((len(pairs), self._mean.size))])
        self._swap = np.arange(start, start + len(pairs), dtype=np.int64)
        self._pa = np.array([a for a, _ in pairs], dtype=np.int64)
        self._pb = np.array([b for _, b in pairs], dtype=np.int64)
        ratios = share_ratios(p, self._pa, self._pb) if pairs else np.zeros((2, 0))
        if pairs and self.swap_ratios is not None:
            given = np.asarray(self.swap_ratios, dtype=np.float64)
            if given.shape != ratios.shape or not np.all((given > 0) & np.isfinite(given)):
                raise ValueError(f"swap_ratios must be positive (2, {len(pairs)}), one up "
                                 f"and one down ratio per pair, got shape {given.shape}")
            ratios = given
        self._share_ratios = ratios
        self._w = ratio_weights(ratios, r) if pairs else np.zeros((2, 0, 2))
        # the same pairs swapped in whole runs (toolcounts.run_swap_llr), on the same ratios
        start = len(self._labels)
        self._labels += ["run" + self._labels[int(j)] for j in self._swap]
        self._rows = np.vstack([self._rows, np.zeros((len(pairs), self._mean.size))])
        self._runswap = np.arange(start, start + len(pairs), dtype=np.int64)
        if pairs and not 0.0 < self.swap_runs < 1.0:
            raise ValueError(f"swap_runs={self.swap_runs!r} must be a share of runs in (0, 1)")

    def _latency_chart(self, latency: tuple[Sequence[str], ArrayLike] | None,
                       factor: float) -> None:
        """With a latency model (kinds and their (a, b, sigma^2), ``latency.py``), append
        the chart ``latency`` on the per-run LR of every call's latency times ``factor``;
        its input is the run's per-kind sums after the fingerprint (:attr:`input_size`)."""
        self._lat_kinds: tuple[str, ...] = ()
        self._lat_params = np.zeros((0, 3))
        self._lat_chart = -1
        if latency is None or not len(latency[0]):
            return
        if not (factor > 0 and factor != 1.0 and math.isfinite(factor)):
            raise ValueError(f"latency_factor={factor!r} must be a positive factor other "
                             f"than 1")
        kinds = tuple(str(k) for k in latency[0])
        params = np.asarray(latency[1], dtype=np.float64)
        if params.shape != (len(kinds), 3) or not (np.all(np.isfinite(params))
                                                   and np.all(params[:, 2] > 0)):
            raise ValueError(f"latency model must be (a, b, sigma^2 > 0) for each of the "
                             f"{len(kinds)} kinds, got shape {params.shape}")
        self._lat_kinds, self._lat_params = kinds, params
        self._lat_chart = len(self._labels)
        self._labels.append("latency")
        self._rows = np.vstack([self._rows, np.zeros((1, self._mean.size))])

    @property
    def latency_kinds(self) -> tuple[str, ...]:
        """The call kinds of the latency chart (empty without one)."""
        return tuple(getattr(self, "_lat_kinds", ()))

    @property
    def input_size(self) -> int:
        """Length of one run's input to :meth:`update`: the fingerprint, then the per-kind
        sums of ``latency.stats_vector`` when there is a latency chart."""
        size: int = self._mean.size + N_STATS * len(self.latency_kinds)
        return size

    def _layout(self) -> tuple[int, F64, F64, F64, F64, F64]:
        """What every run's increments need, built once (a chart restored from an older
        checkpoint builds it on first use). The charts are in blocks: projections (the
        features, and the Gaussian swaps without counts), then the swaps on the counts,
        the whole-run swaps, the latency chart. Returns the number of projections, their
        rows transposed, each chart's interval of one run's increment (the same for up
        and down: a projection's ``[-clip - k, clip - k]``, y clipped to ``[-clip, clip]``
        before the reference value; a count or latency chart's
        ``[-count_clip, count_clip]``; a whole-run swap's ``[-RUN_CLIP, RUN_CLIP]``) as
        lo and hi, and each pair's log(1 + p_a / p_b) and log(1 + p_b / p_a)."""
        cached = getattr(self, "_layout_cache", None)
        if cached is None:
            m = len(self._labels)
            n_proj = int(self._swap[0]) if self._swap.size else (
                self._lat_chart if self.latency_kinds else m)
            hi = np.full(m, self.count_clip)
            hi[:n_proj] = self.clip - self.k
            lo = -hi
            lo[:n_proj] = -self.clip - self.k
            runs = getattr(self, "_runswap", _NONE)
            hi[runs], lo[runs] = RUN_CLIP, -RUN_CLIP
            # a chart from before the ratios (2026-12-06) kept its call shares instead, one
            # from before the whole-run swaps neither: no pairs
            p, ratios = getattr(self, "_p", None), getattr(self, "_share_ratios", None)
            logs = (ratio_logs(ratios) if ratios is not None
                    else run_swap_logs(p, self._pa, self._pb) if p is not None
                    else (np.zeros(0), np.zeros(0)))
            cached = (n_proj, np.ascontiguousarray(self._rows[:n_proj].T), lo, hi, *logs)
            self._layout_cache = cached
        return cached

    def _project(self, fp: F64) -> F64:
        """The projections y of fingerprints ``fp`` (..., d), unclipped."""
        y: F64 = (fp - self._mean) @ self._layout()[1]
        return y

    def _increments(self, x: F64, y: F64 | None = None) -> tuple[F64, F64]:
        """Up and down increments of every chart for the inputs ``x`` (..., input_size):
        each block's per-run values (:meth:`_layout`), then one clip to each chart's
        interval. ``y``: the projections (..., n_proj), when already computed."""
        d = self._mean.size
        fp = x[..., :d]
        _, _, lo, hi, lr_up, lr_down = self._layout()
        if y is None:
            y = self._project(fp)
        ups, downs = [y - self.k], [-y - self.k]
        if self._swap.size:
            counts = _counts(fp, self._steps_col, self._tool_cols)
            na, nb = counts[..., self._pa], counts[..., self._pb]
            up_s, down_s = swap_terms(na, nb, self._w)
            ups.append(up_s)
            downs.append(down_s)
            if getattr(self, "_runswap", _NONE).size:
                up_r, down_r = run_swap_terms(na, nb, (lr_up, lr_down), self.swap_runs)
                ups.append(up_r)
                downs.append(down_r)
        if self.latency_kinds:
            up_l, down_l = latency_sides(x[..., d:], self._lat_params,
                                         math.log(self.latency_factor))
            ups.append(up_l[..., None])
            downs.append(down_l[..., None])
        up = np.concatenate(ups, axis=-1) if len(ups) > 1 else ups[0]
        down = np.concatenate(downs, axis=-1) if len(downs) > 1 else downs[0]
        return np.minimum(np.maximum(up, lo), hi), np.minimum(np.maximum(down, lo), hi)

    @property
    def count_labels(self) -> list[str]:
        """Labels of the charts on the call counts' LR (``toolcounts.py``): the swaps of a
        share of every run's calls (``swap:a>b``), then of whole runs (``runswap:a>b``)."""
        runs = getattr(self, "_runswap", _NONE)
        return [self._labels[int(j)] for j in np.concatenate([self._swap, runs])]

    @property
    def feature_labels(self) -> list[str]:
        """Names of the d features."""
        names: list[str] = feature_labels(self.feature_names, self._mean.size)
        return names

    @property
    def labels(self) -> list[str]:
        """Direction labels: feature names, then ``swap:a>b``."""
        return list(self._labels)

    @property
    def projections(self) -> F64:
        """The (m, d) rows a_j: y_j = clip(a_j'(x - mean))."""
        return self._rows.copy()

    @property
    def thresholds(self) -> F64:
        """Per-chart thresholds, shape (2, m): up, down."""
        return self._h.copy()

    def _reset(self) -> None:
        self._reset_common()
        self._up = np.zeros(len(self._labels))
        self._down = np.zeros(len(self._labels))

    def _restart(self) -> None:
        self._up[:] = 0.0
        self._down[:] = 0.0

    def prime(self, xs: Sequence[F64]) -> None:
        """Compute the increments of the coming inputs ``xs`` (arrays, each as
        :meth:`update` takes it) in one vectorised pass; :meth:`update` called with one
        of these very arrays uses them. Inputs that are not all valid are left to
        :meth:`update`. What is primed is never checkpointed; :meth:`unprime` drops it."""
        if not xs:
            return
        mat = np.stack(xs)
        if mat.dtype != np.float64 or mat.shape[1:] != (self.input_size,) or not np.all(
                np.isfinite(mat)):
            return
        # the projections run by run, as update() computes them: a matrix product over
        # the batch may round differently in the last bit, and the charts must not
        # depend on how the runs were batched; the rest is elementwise
        d = self._mean.size
        y = np.stack([self._project(x[:d]) for x in xs])
        up, down = self._increments(mat, y)
        primed = self.__dict__.setdefault("_primed", {})
        if _cusum_path is None or os.environ.get("ASSAYWATCH_NATIVE", "1") == "0":
            for x, u, v in zip(xs, up, down, strict=True):
                primed[id(x)] = (x, u, v)
            return
        # The states after each input, should the inputs come in this order from the
        # present state: update() takes the state of an input whose predecessor's state
        # (this very array object) is the chart's, else adds its increments as usual.
        path_up, path_down, fired = _cusum_path(
            np.ascontiguousarray(up), np.ascontiguousarray(down), self._h[0], self._h[1],
            np.ascontiguousarray(self._up), np.ascontiguousarray(self._down), self._drift)
        m = self._up.size
        ups = list(np.frombuffer(path_up, dtype=np.float64).reshape(len(xs), m))
        downs = list(np.frombuffer(path_down, dtype=np.float64).reshape(len(xs), m))
        prev_up, prev_down = self._up, self._down
        for x, u, v, su, sd, f in zip(xs, up, down, ups, downs, fired, strict=True):
            primed[id(x)] = (x, u, v, prev_up, prev_down, su, sd, f)
            prev_up, prev_down = su, sd

    def unprime(self) -> None:
        """Forget the increments :meth:`prime` computed and :meth:`update` did not use."""
        self.__dict__.pop("_primed", None)

    def update(self, x: ArrayLike) -> None:
        """Add one run's fingerprint (length d, finite), followed by its per-kind latency
        sums when the chart has a latency chart (:attr:`input_size`)."""
        primed = self.__dict__.get("_primed")
        hit = primed.pop(id(x), None) if primed else None
        if hit is not None and hit[0] is x:
            if len(hit) > 3 and hit[3] is self._up and hit[4] is self._down:
                # the primed path from this very state (a restart after an alarm included)
                self._drift = False
                self._n += 1
                self._up, self._down = hit[5], hit[6]
                self._alarm(hit[7])
                return
            self._begin_update()
            inc_up, inc_down = hit[1], hit[2]
        else:
            arr = np.asarray(x, dtype=np.float64)
            if arr.shape != (self.input_size,) or not np.all(np.isfinite(arr)):
                raise ValueError(f"fingerprint must be {self.input_size} finite numbers, "
                                 f"got shape {arr.shape}")
            self._begin_update()
            inc_up, inc_down = self._increments(arr)
        self._up = np.maximum(0.0, self._up + inc_up)
        self._down = np.maximum(0.0, self._down + inc_down)
        self._alarm(bool(self.statistic >= 1.0))

    def _ratios(self) -> F64:
        r: F64 = np.maximum(self._up / self._h[0], self._down / self._h[1])
        return r

    @property
    def statistic(self) -> float:
        """Largest chart value in units of its own threshold (alarm at 1)."""
        return float(self._ratios().max()) if self._labels else 0.0

    @property
    def threshold(self) -> float:
        return 1.0

    @property
    def feature_statistics(self) -> dict[str, float]:
        """Per feature, its chart's value in units of its threshold (the gauge of what
        moved; 1 is the alarm), and ``latency``, the latency chart's, when there is one."""
        r = self._ratios()
        out = {lab: float(v) for lab, v in zip(self._labels[:self._n_features],
                                                r[:self._n_features], strict=True)}
        if self.latency_kinds:
            out["latency"] = float(r[self._lat_chart])
        return out

    @property
    def charts_alarmed(self) -> list[str]:
        """``label:up`` / ``label:down`` for every chart at or above its threshold."""
        out = [f"{lab}:up" for lab, u, h in zip(self._labels, self._up, self._h[0],
                                                 strict=True) if u >= h]
        return out + [f"{lab}:down" for lab, v, h in zip(self._labels, self._down, self._h[1],
                                                          strict=True) if v >= h]

    def evidence(self) -> dict[str, float | int | str]:
        r = self._ratios()
        top = np.argsort(-r)[:5]
        ev: dict[str, float | int | str] = {
            "detector": "cusum_fingerprint", "statistic": self.statistic, "threshold": 1.0,
            "arl0_target": float(self.arl0), "k": float(self.k), "n_charts": 2 * len(self._labels),
            "charts_alarmed": ",".join(self.charts_alarmed), "n": self._n,
            "n_alarms": self._n_alarms}
        for j in top:
            if r[j] > 0:
                ev[f"ratio[{self._labels[j]}]"] = float(r[j])
        return ev

    # -- vectorised kernel for simulation over replicates (see simulation.py) --
    def _batch_init(self, n_replicates: int) -> tuple[F64, F64]:
        shape = (n_replicates, len(self._labels))
        return np.zeros(shape), np.zeros(shape)

    def _batch_step(self, state: tuple[F64, F64], x: F64) -> NDArray[np.bool_]:
        up, down = state
        inc_up, inc_down = self._increments(x)
        np.maximum(0.0, up + inc_up, out=up)
        np.maximum(0.0, down + inc_down, out=down)
        fired: NDArray[np.bool_] = np.maximum(up / self._h[0], down / self._h[1]).max(
            axis=1) >= 1.0
        up[fired] = 0.0
        down[fired] = 0.0
        return fired
