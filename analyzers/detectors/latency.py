r"""Latency charts: the likelihood ratio of a change of every call's latency by one factor.

What it computes
----------------
A run's fingerprint keeps only its total ``duration``, which the number of rounds, the
tools chosen and the gaps between steps dominate; a provider that became 30% slower moves
every call's latency, and the run's calls carry far more evidence of it than their sum.
Each call c of **kind** k (``llm``, ``retrieve``, ``tool:<name>``) has
:math:`x_c = \log \mathrm{latency}_c` and :math:`t_c = \log(1 + \mathrm{input\ tokens}_c)`;
the baseline fits, per kind, :math:`x = a_k + b_k t + \varepsilon`,
:math:`\varepsilon \sim N(0, \sigma_k^2)` (b = 0 where the kind's input tokens do not vary:
tools; a model is slower on longer prompts). A change of every latency by the factor
:math:`e^{\theta}` shifts every :math:`x_c` by :math:`\theta`; its log-likelihood ratio
for a run is

.. math::

    \ell_\theta = \sum_k \frac{\theta}{\sigma_k^2}
        \Big(\sum_{c \in k} x_c - n_k a_k - b_k \sum_{c \in k} t_c\Big)
        - n_k \frac{\theta^2}{2 \sigma_k^2},

linear in the run's per-kind sums. ``MultichartCUSUM(latency=...)`` runs it as one chart,
``latency``: ``up`` with :math:`\theta = \log f` (slower), ``down`` with
:math:`-\log f` (faster), each run's :math:`\ell` clipped to ``[-clip, clip]`` nats; no
reference value is needed (:math:`\mathrm{E}\,\ell < 0` in control). Its threshold comes,
with the other charts', from the bootstrap of the baseline's runs (``bootstrap.py``),
which refits the model on each bootstrap baseline, so the model's error, heavy tails,
timeouts and within-run correlation are in the calibration, not assumed away.

A run is summarised by :func:`run_stats` (per kind: calls, sum and sum of squares of x, of
t, and of x t) and, for a fixed list of kinds, by :func:`stats_vector` (6 numbers a kind);
:func:`fit` estimates the model from weighted sums of such vectors, :func:`llr` evaluates
:math:`\ell_\theta` for any number of runs and models at once.

Choices and why
---------------
* Per-kind sums, not a feature of the fingerprint: the fingerprint is a documented
  contract, and what the LR needs (each call's latency against its kind's law) is not a
  function of it. The sums are all the chart reads, so the calibration's reservoir keeps
  them beside each sampled fingerprint, as one array a run over the kinds in discovery
  order (48 bytes a kind and run), the way it keeps the tool columns.
* On the realistic world (tests/realworld) the mean per-run :math:`\ell` after a change
  x1.3 is 98-101% of the exact oracle's Kullback-Leibler divergence (0.47 vs 0.49, 0.76 vs
  0.75, 1.32 vs 1.33, 1.71 vs 1.73 nats for the four scenarios), against 62-96% for the
  best linear chart on the fingerprint with latency means added and 25-75% for its
  ``duration`` chart alone: the fingerprint averages away what the calls carry.
* ``f`` = 1.25 by default, a quarter slower: a change worth an alarm; the chart's delay
  varies little for true factors around it (a likelihood-ratio CUSUM's delay is flat near
  its design point).
* Kinds with fewer than ``MIN_CALLS`` calls in the baseline are left out (their law is
  unknown), and so are kinds whose typical call takes under 10 ms (``MIN_TYPICAL_S``:
  a local function's latency is the host's scheduling noise, which moves with the
  machine's load, not a regression of the agent); at most ``MAX_KINDS`` kinds are
  charted, llm and retrieve first, then the tools with the most calls; sigma is floored
  at ``MIN_SIGMA`` (5% in latency) so a tool of near-constant latency cannot dominate.
  Latencies below 0.1 ms count as 0.1 ms.

Examples
--------
>>> from assaywatch.analyzers.model import Action, Run, Step, StreamKey
>>> steps = [Step(Action.LLM, latency_s=2.0, input_tokens=100),
...          Step(Action.TOOL, tool="search", latency_s=0.5)]
>>> stats = run_stats(Run("t", "r", StreamKey("a", "1", "s"), steps))
>>> sorted(stats)
['llm', 'tool:search']
>>> [round(v, 3) for v in stats["tool:search"]]
[1.0, -0.693, 0.48, 0.0, 0.0, -0.0]
>>> kinds = ["llm", "tool:search"]
>>> params = np.array([[0.0, 0.0, 1.0], [math.log(0.5), 0.0, 0.25]])
>>> v = stats_vector(stats, kinds)
>>> round(float(llr(v, params, math.log(2.0))), 3)  # llm: 0.48 - 0.24; search: 0 - 0.96
-0.721
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.model import Action, Run

__all__ = ["MAX_KINDS", "MIN_CALLS", "N_STATS", "choose_kinds", "fit", "llr", "moments",
           "run_stats", "sides", "stats_vector"]

F64 = NDArray[np.float64]
#: numbers kept per kind and run: calls, sum x, sum x^2, sum t, sum t^2, sum x t
N_STATS = 6
#: fewest baseline calls of a kind for it to be charted
MIN_CALLS = 30
#: most kinds charted (llm and retrieve first, then the tools with the most calls)
MAX_KINDS = 16
#: floor of a kind's residual sd, in log latency
MIN_SIGMA = 0.05
#: least typical (geometric mean) latency of a charted kind, seconds: below it a call's
#: latency is mostly the host's scheduling, not the call's
MIN_TYPICAL_S = 0.01
_MIN_LATENCY_S = 1e-4
_ZERO = (0.0,) * 6


def run_stats(run: Run) -> dict[str, list[float]]:
    """Per kind of the run's timed calls (llm, retrieve and tool steps), the six sums
    (module docstring). Steps without a positive latency are left out."""
    out: dict[str, list[float]] = {}
    log, log1p = math.log, math.log1p
    llm, tool, retrieve = Action.LLM, Action.TOOL, Action.RETRIEVE
    for s in run.steps:
        a = s.action
        if a is tool:
            k = "tool:" + (s.tool or "")
        elif a is llm:
            k = "llm"
        elif a is retrieve:
            k = "retrieve"
        else:
            continue
        lat = s.latency_s
        if not lat > 0:
            continue
        x = log(lat if lat > _MIN_LATENCY_S else _MIN_LATENCY_S)
        t = log1p(s.input_tokens) if s.input_tokens > 0 else 0.0
        v = out.get(k)
        if v is None:
            out[k] = [1.0, x, x * x, t, t * t, x * t]
        else:
            v[0] += 1.0
            v[1] += x
            v[2] += x * x
            v[3] += t
            v[4] += t * t
            v[5] += x * t
    return out


def stats_vector(stats: Mapping[str, Sequence[float]], kinds: Sequence[str]) -> F64:
    """The sums of ``kinds`` in order, flattened (6 a kind; zeros for a kind not called)."""
    zero = _ZERO
    out: F64 = np.array([v for k in kinds for v in stats.get(k, zero)], dtype=np.float64)
    return out


def choose_kinds(kinds: Sequence[str], sample: F64) -> list[str]:
    """The kinds to chart for a baseline sample: rows of :func:`stats_vector` over
    ``kinds`` (module docstring)."""
    if not len(kinds):  # runs without a timed call
        return []
    v = np.asarray(sample, dtype=np.float64).reshape(-1, len(kinds), N_STATS)
    calls, logs = v[:, :, 0].sum(axis=0), v[:, :, 1].sum(axis=0)
    floor = math.log(MIN_TYPICAL_S)
    ok = [k for k, n, lx in zip(kinds, calls, logs, strict=True)
          if n >= MIN_CALLS and lx / n >= floor]
    first = [k for k in ("llm", "retrieve") if k in ok]
    total = dict(zip(kinds, calls, strict=True))
    tools = sorted((k for k in ok if k not in first), key=lambda k: (-total[k], k))
    return (first + tools)[:MAX_KINDS]


def fit(vectors: F64, weights: F64 | None = None) -> F64:
    """Per kind (a, b, sigma^2) from runs' :func:`stats_vector` rows ``vectors`` (n, 6K)
    weighted by ``weights`` ((..., n), default uniform): shape (..., K, 3)."""
    v = np.asarray(vectors, dtype=np.float64)
    n_runs = v.shape[0]
    w = np.full(n_runs, 1.0) if weights is None else np.asarray(weights, dtype=np.float64)
    s = np.einsum("...n,nj->...j", w, v).reshape(*w.shape[:-1], -1, N_STATS)
    calls = np.maximum(s[..., 0], 1e-12)
    mx, mxx, mt, mtt, mxt = (s[..., j] / calls for j in range(1, N_STATS))
    vt = mtt - mt * mt
    cxt = mxt - mx * mt
    vary = vt > 1e-6
    b = np.where(vary, cxt / np.where(vary, vt, 1.0), 0.0)
    a = mx - b * mt
    var = np.maximum(mxx - mx * mx - b * cxt, MIN_SIGMA ** 2)
    out: F64 = np.stack([a, b, var], axis=-1)
    return out


def moments(vectors: F64, params: F64) -> tuple[F64, F64]:
    r"""Per run, :math:`A = \sum_k (\sum_{c \in k} x_c - n_k a_k - b_k \sum_{c \in k} t_c)
    / \sigma_k^2` and :math:`B = \sum_k n_k / \sigma_k^2`, so that
    :math:`\ell_\theta = \theta A - \theta^2 B / 2` for every :math:`\theta`:
    ``vectors`` (..., 6K), ``params`` (K, 3) or broadcasting with the runs' axes."""
    v = np.asarray(vectors, dtype=np.float64)
    s = v.reshape(*v.shape[:-1], -1, N_STATS)
    a, b, var = params[..., 0], params[..., 1], params[..., 2]
    resid = s[..., 1] - s[..., 0] * a - b * s[..., 3]
    big_a: F64 = (resid / var).sum(axis=-1)
    big_b: F64 = (s[..., 0] / var).sum(axis=-1)
    return big_a, big_b


def sides(vectors: F64, params: F64, theta: float) -> tuple[F64, F64]:
    r"""Per run, the unclipped :math:`\ell_\theta` and :math:`\ell_{-\theta}` (a slower
    and a faster latency) from one pass over the sums (:func:`moments`)."""
    big_a, big_b = moments(vectors, params)
    half = theta * theta * big_b / 2.0
    return theta * big_a - half, -theta * big_a - half


def llr(vectors: F64, params: F64, theta: float, bound: float = math.inf) -> F64:
    r"""Per run, :math:`\ell_\theta` (module docstring), clipped to ``[-bound, bound]``:
    ``vectors`` (..., 6K), ``params`` (K, 3) or broadcasting with the runs' axes."""
    out: F64 = np.clip(sides(vectors, params, theta)[0], -bound, bound)
    return out
