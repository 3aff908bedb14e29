r"""river's drift detectors behind the monitor's detector interface.

``RiverDetector(kind, **params)`` wraps ``river.drift.ADWIN`` (``"adwin"``),
``river.drift.KSWIN`` (``"kswin"``) or ``river.drift.PageHinkley`` (``"page_hinkley"``),
with ``params`` passed unchanged to the river constructor. They are distribution-free
alternatives to the CUSUMs for a scalar stream (pass/fail as 0/1, or one fingerprint
feature), but their in-control ARL cannot be set to a target: it is measured in the
benchmark (``tests/benchmarks/bench_detectors.py``).

statistic / threshold
---------------------
* ``page_hinkley``: river's test statistics, the distance of the cumulative deviation
  :math:`\sum (x_t - \bar x_t \mp \delta)` (faded by ``alpha``) from its running
  extreme, for increases and decreases; ``statistic`` is the larger one the ``mode``
  watches, ``threshold`` river's ``threshold`` (alarm at ``>``, after ``min_instances``).
  river 0.26's ``mode`` defaults to ``"both"``; other packages' Page-Hinkley only
  detects increases, and both directions are tested.
* ``kswin``: ``statistic`` = -log10 of the last Kolmogorov-Smirnov p-value between the
  newest ``stat_size`` values and a random sample of the older window, ``threshold`` =
  -log10(``alpha``); river also requires a KS distance > 0.1. 0 while the window fills.
  ``seed`` defaults to 0 here (river's default None is irreproducible).
* ``adwin``: ADWIN's cut test compares every split of its adaptive window and exposes no
  single statistic: both are NaN (documented); evidence carries the window width and
  mean.

The running mean and variance of the stream since the last alarm are kept with river's
online ``stats.Mean`` / ``stats.Var`` for the evidence. After an alarm river itself
restarts the detector on the next update, which matches ``base``'s convention.

State: ``get_state`` is JSON-safe without pickle: Page-Hinkley and KSWIN state is their
numbers (KSWIN's window and random-generator state included); ADWIN's Rust helper
serialises itself to bytes, stored base64.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(5)
>>> det = RiverDetector("page_hinkley")
>>> for x in np.concatenate([rng.normal(0, 1, 500), rng.normal(-2, 1, 200)]):
...     det.update(float(x))
...     if det.drift_detected:
...         break
>>> det.n - 500  # a decrease is detected (mode="both"), after this many runs
22

References
----------
Page, E. S. (1954). Continuous inspection schemes. Biometrika 41, 100-115.
Bifet, A. & Gavalda, R. (2007). Learning from time-changing data with adaptive
windowing. SIAM SDM, 443-448.
Raab, C., Heusinger, M. & Schleif, F.-M. (2020). Reactive soft prototype computing for
concept drift streams (KSWIN). Neurocomputing 416, 340-351.
"""

from __future__ import annotations

import base64
import math
import random
from typing import Any

from river import drift, stats

from assaywatch.analyzers.detectors.base import Detector, JSONValue

__all__ = ["RiverDetector", "RIVER_KINDS"]

RIVER_KINDS: dict[str, type[Any]] = {
    "adwin": drift.ADWIN,
    "kswin": drift.KSWIN,
    "page_hinkley": drift.PageHinkley,
}


class RiverDetector(Detector):  # type: ignore[misc,unused-ignore]
    """A river drift detector with the monitor's interface (see the module docstring)."""

    _state_fields = ("_river_state", "_stats_state")

    def __init__(self, kind: str, **params: Any) -> None:
        self.kind = kind
        self.params = params
        if kind not in RIVER_KINDS:
            raise ValueError(f"kind={kind!r} is not one of {sorted(RIVER_KINDS)}")
        self._effective = dict(params)
        if kind == "kswin":
            self._effective.setdefault("seed", 0)
        try:
            RIVER_KINDS[kind](**self._effective)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid parameters for river {kind} ({kind!r}): {exc}") from exc
        self._reset()

    def _reset(self) -> None:
        self._reset_common()
        self._river = RIVER_KINDS[self.kind](**self._effective)
        self._var = stats.Var()

    def _restart(self) -> None:
        # river resets its own state on the update after a drift; restart our stats too
        self._var = stats.Var()

    def update(self, x: float) -> None:
        """Add one observation (a finite number; pass/fail as 1/0)."""
        value = float(x)
        if not math.isfinite(value):
            raise ValueError(f"x={x!r} must be a finite number")
        self._begin_update()
        self._river.update(value)
        self._var.update(value)
        self._alarm(bool(self._river.drift_detected))

    @property
    def statistic(self) -> float:
        r = self._river
        if self.kind == "page_hinkley":
            if r._x_mean.n == 0:
                return 0.0
            up = r._sum_increase - r._min_increase
            down = r._max_decrease - r._sum_decrease
            return float({"up": up, "down": down}.get(r.mode, max(up, down)))
        if self.kind == "kswin":
            if len(r.window) < r.window_size and not r.drift_detected:
                return 0.0
            return -math.log10(r.p_value) if r.p_value > 0 else math.inf
        return math.nan

    @property
    def threshold(self) -> float:
        r = self._river
        if self.kind == "page_hinkley":
            return float(r.threshold)
        if self.kind == "kswin":
            return -math.log10(r.alpha)
        return math.nan

    def evidence(self) -> dict[str, float | int | str]:
        ev: dict[str, float | int | str] = {
            "detector": f"river_{self.kind}",
            "statistic": self.statistic,
            "threshold": self.threshold,
            "arl0_target": "not settable",
            "params": ",".join(f"{k}={v}" for k, v in sorted(self._effective.items())),
            "window_mean": float(self._var.mean.get()),
            "window_var": float(self._var.get()),
            "window": int(self._var.mean.n),
            "n": self._n,
            "n_alarms": self._n_alarms,
        }
        if self.kind == "adwin":
            ev["adwin_width"] = int(self._river.width)
            ev["adwin_estimation"] = float(self._river.estimation)
        if self.kind == "kswin":
            ev["p_value"] = float(self._river.p_value)
        return ev

    # -- JSON-safe state of the wrapped river object (properties used by base) --
    @property
    def _stats_state(self) -> dict[str, JSONValue]:
        return {"n": self._var.mean.n, "mean": self._var.mean._mean, "S": self._var._S}

    @_stats_state.setter
    def _stats_state(self, value: dict[str, Any]) -> None:
        self._var = stats.Var()
        self._var.mean.n = float(value["n"])
        self._var.mean._mean = float(value["mean"])
        self._var._S = float(value["S"])

    @property
    def _river_state(self) -> dict[str, JSONValue]:
        r = self._river
        out: dict[str, JSONValue] = {"drift": bool(r._drift_detected)}
        if self.kind == "adwin":
            out["helper"] = base64.b64encode(r._helper.__getstate__()).decode("ascii")
        elif self.kind == "kswin":
            version, internal, gauss = r._rng.getstate()
            out.update(
                window=list(r.window), n=r.n, p_value=float(r.p_value),
                rng=[version, list(internal), gauss],
            )
        else:
            out.update(
                mean_n=r._x_mean.n, mean=r._x_mean._mean, sum_inc=r._sum_increase,
                sum_dec=r._sum_decrease, min_inc=r._min_increase, max_dec=r._max_decrease,
            )
        return out

    @_river_state.setter
    def _river_state(self, value: dict[str, Any]) -> None:
        r = RIVER_KINDS[self.kind](**self._effective)
        r._drift_detected = bool(value["drift"])
        if self.kind == "adwin":
            r._helper.__setstate__(base64.b64decode(value["helper"]))
        elif self.kind == "kswin":
            r.window.extend(value["window"])
            r.n = int(value["n"])
            r.p_value = float(value["p_value"])
            rng = random.Random()
            version, internal, gauss = value["rng"]
            rng.setstate((version, tuple(internal), gauss))
            r._rng = rng
        else:
            r._x_mean.n = float(value["mean_n"])
            r._x_mean._mean = float(value["mean"])
            r._sum_increase = float(value["sum_inc"])
            r._sum_decrease = float(value["sum_dec"])
            r._min_increase = float(value["min_inc"])
            r._max_decrease = float(value["max_dec"])
        self._river = r

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"RiverDetector({self.kind!r}{args})"
