r"""Bernoulli likelihood-ratio CUSUM on a stream's pass/fail outcomes.

What it computes
----------------
Page's (1954) CUSUM of the log-likelihood ratio of a drop of the pass rate from p0 to
p1 < p0. Per run with outcome x (1 = pass, 0 = fail)

.. math::

    \ell(x) = x \log\frac{p_1}{p_0} + (1 - x)\log\frac{1 - p_1}{1 - p_0}, \qquad
    S_t = \max(0, S_{t-1} + \ell(x_t)),

and the alarm fires at :math:`S_t \ge h`. Among all procedures with the same in-control
average run length ARL0 it minimises the worst-case detection delay for the change
p0 -> p1 (Lorden 1971; Moustakides 1986): it *is* the oracle when p0 and p1 are right.
Reynolds & Stoumbos (1999) study this chart for continuously inspected proportions.

The two llr values are scaled to integers on a lattice (``calibration.bernoulli_lattice``:
ratio matched within 0.2 %) and the state is an integer, so the Markov chain of
``calibration`` gives the detector's exact run-length law and the threshold h for an ARL0
target is exact, not simulated. ``statistic`` reports S in nats (units * lattice unit).

Threshold. ``h=None`` calibrates h to ``arl0``. With ``baseline_runs``/``baseline_passes``
(the baseline p0 was estimated from) h guarantees ARL0 >= ``arl0`` with posterior
probability ``confidence``: a plug-in p0 from 100 runs otherwise more than doubles the
false-alarm rate (SPEC.md). Larger baselines give smaller h and faster detection.
After an alarm the statistic restarts from zero on the next update (module ``base``).

Parameters
----------
p0:
    In-control pass rate (the baseline's plug-in estimate), strictly in (0, 1).
p1:
    Pass rate to detect; default ``p0 - delta``.
delta:
    Drop to detect when p1 is not given, in (0, p0).
h:
    Alarm threshold in nats; default from ``arl0``.
arl0:
    Target in-control average run length in runs (ignored when h is given).
baseline_runs, baseline_passes:
    Size and passes of the baseline, both or neither.
confidence:
    Posterior probability that the true ARL0 meets ``arl0`` (only with a baseline).
seed:
    Accepted for interface stability and ignored: the calibration is exact (monotone
    quantile argument in ``calibration``), so there is nothing random.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(7)
>>> det = BernoulliCUSUM(p0=0.9, delta=0.1, arl0=10_000)
>>> round(det.threshold, 2)
5.6
>>> stream = np.concatenate([rng.random(500) < 0.9, rng.random(500) < 0.8])
>>> alarms = []
>>> for t, passed in enumerate(stream):
...     det.update(bool(passed))
...     if det.drift_detected:
...         alarms.append(t)
>>> alarms[0] >= 500  # no false alarm before the change, then it fires
True

References
----------
Page, E. S. (1954). Continuous inspection schemes. Biometrika 41, 100-115.
Lorden, G. (1971). Procedures for reacting to a change in distribution. Ann. Math.
Statist. 42, 1897-1908.
Moustakides, G. V. (1986). Optimal stopping times for detecting changes in
distributions. Ann. Statist. 14, 1379-1387.
Reynolds, M. R. & Stoumbos, Z. G. (1999). A CUSUM chart for monitoring a proportion when
inspecting continuously. J. Quality Technology 31, 87-108.
Brook, D. & Evans, D. A. (1972). An approach to the probability distribution of CUSUM run
length. Biometrika 59, 539-549.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from assaywatch.analyzers.detectors.base import Detector
from assaywatch.analyzers.detectors.calibration import (
    bernoulli_cusum_threshold,
    bernoulli_lattice,
)

__all__ = ["BernoulliCUSUM"]


class BernoulliCUSUM(Detector):  # type: ignore[misc,unused-ignore]
    """Bernoulli LR CUSUM for a drop in pass rate (see the module docstring)."""

    _state_fields = ("_units",)

    def __init__(
        self,
        p0: float,
        p1: float | None = None,
        delta: float = 0.1,
        h: float | None = None,
        arl0: float = 10_000,
        baseline_runs: int | None = None,
        baseline_passes: int | None = None,
        confidence: float = 0.9,
        seed: int = 0,
    ) -> None:
        self.p0 = p0
        self.p1 = p1
        self.delta = delta
        self.h = h
        self.arl0 = arl0
        self.baseline_runs = baseline_runs
        self.baseline_passes = baseline_passes
        self.confidence = confidence
        self.seed = seed
        if not (0.0 < p0 < 1.0):
            raise ValueError(
                f"p0={p0!r} must lie strictly in (0, 1); for an all-pass baseline use "
                "BernoulliCUSUM.from_baseline (Jeffreys estimate)"
            )
        design_p1 = p0 - delta if p1 is None else p1
        if p1 is None and not (0.0 < delta < p0):
            raise ValueError(f"delta={delta!r} must lie in (0, p0={p0!r})")
        if not (0.0 < design_p1 < p0):
            raise ValueError(f"p1={design_p1!r} must lie in (0, p0={p0!r})")
        if h is not None and not (h > 0 and math.isfinite(h)):
            raise ValueError(f"h={h!r} must be a positive finite threshold or None")
        self._p1 = design_p1
        self._unit, self._step_pass, self._step_fail = bernoulli_lattice(p0, design_p1)
        if h is None:
            h = bernoulli_cusum_threshold(
                p0, design_p1, arl0, baseline_runs, baseline_passes, confidence
            )
        self._h = float(h)
        # alarm when units * unit >= h, i.e. units >= ceil(h / unit)
        self._h_units = max(1, math.ceil(self._h / self._unit - 1e-9))
        self._reset()

    @classmethod
    def from_baseline(
        cls, runs: int, passes: int, delta: float = 0.1, **kwargs: Any
    ) -> BernoulliCUSUM:
        """Build from a baseline of ``passes`` out of ``runs``.

        p0 is the Jeffreys posterior mean (passes + 1/2) / (runs + 1), which stays inside
        (0, 1) for an all-pass or all-fail baseline, and the threshold accounts for the
        baseline's size (``confidence``, default 0.9).
        """
        if runs < 1 or not (0 <= passes <= runs):
            raise ValueError(f"passes={passes!r} must lie in [0, runs={runs!r}], runs >= 1")
        p0 = (passes + 0.5) / (runs + 1.0)
        return cls(p0, delta=delta, baseline_runs=runs, baseline_passes=passes, **kwargs)

    def _reset(self) -> None:
        self._reset_common()
        self._units = 0

    def _restart(self) -> None:
        self._units = 0

    def update(self, x: bool | int | float) -> None:
        """Add one run: 1/True = pass, 0/False = fail."""
        if x not in (0, 1):
            raise ValueError(f"x={x!r} must be 1/True (pass) or 0/False (fail)")
        self._begin_update()
        step = self._step_pass if x else self._step_fail
        self._units = max(0, self._units + step)
        self._alarm(self._units >= self._h_units)

    @property
    def statistic(self) -> float:
        """S in nats."""
        return float(self._units * self._unit)

    @property
    def threshold(self) -> float:
        return self._h

    @property
    def design_p1(self) -> float:
        """The pass rate the chart is tuned to detect."""
        return self._p1

    def evidence(self) -> dict[str, float | int | str]:
        ev: dict[str, float | int | str] = {
            "detector": "cusum_pass_rate",
            "statistic": self.statistic,
            "threshold": self._h,
            "arl0_target": float(self.arl0),
            "p0": float(self.p0),
            "p1": float(self._p1),
            "baseline_runs": -1 if self.baseline_runs is None else int(self.baseline_runs),
            "confidence": float(self.confidence),
            "n": self._n,
            "n_alarms": self._n_alarms,
        }
        return ev

    # -- vectorised kernel for simulation over replicates (see simulation.py) --
    def _batch_init(self, n_replicates: int) -> np.ndarray:
        return np.zeros(n_replicates, dtype=np.int64)

    def _batch_step(self, state: np.ndarray, x: np.ndarray) -> np.ndarray:
        state += np.where(x.astype(bool), self._step_pass, self._step_fail)
        np.maximum(state, 0, out=state)
        fired: np.ndarray = state >= self._h_units
        state[fired] = 0
        return fired
