"""Sequential change detectors of the monitor (SPEC.md "Continuous assay (10.3)").

Every detector implements :class:`~assaywatch.analyzers.detectors.base.Detector`:
``update(x)``, ``drift_detected``, ``statistic``/``threshold``, ``n``/``n_alarms``,
``reset()``, ``evidence()`` and JSON-safe ``get_state()``/``set_state()``.

* :class:`BernoulliCUSUM` -- pass/fail stream, exact Markov-chain threshold, finite-baseline
  aware (``calibration.bernoulli_cusum_threshold``).
* :class:`MultichartCUSUM` -- two-sided CUSUM per whitened shift direction of the
  fingerprint (each feature given the others, tool swaps); the monitor's fingerprint chart.
* :func:`calibrate` -- thresholds of a stream's alarming detectors from its baseline (one
  ARL0 budget; bootstrap with guaranteed conditional performance).
* :class:`FingerprintCUSUM` -- two-sided CUSUM per standardised fingerprint feature.
* :class:`MEWMA` -- multivariate EWMA on the whitened fingerprint (default multivariate chart).
* :class:`RiverDetector` -- river's ADWIN / KSWIN / Page-Hinkley behind the same interface.
* :func:`split_arl0` -- how a stream's ARL0 target is split across its detectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from assaywatch.analyzers.detectors.base import Detector, split_arl0
from assaywatch.analyzers.detectors.bernoulli_cusum import BernoulliCUSUM
from assaywatch.analyzers.detectors.bootstrap import (
    BaselineData,
    CalibrationSettings,
    Thresholds,
    calibrate,
)
from assaywatch.analyzers.detectors.calibration import (
    bernoulli_cusum_arl,
    bernoulli_cusum_threshold,
    bernoulli_lattice,
    gaussian_cusum_arl,
    gaussian_cusum_threshold,
)
from assaywatch.analyzers.detectors.fingerprint_cusum import FingerprintCUSUM
from assaywatch.analyzers.detectors.mewma import MEWMA, mewma_arl, mewma_threshold
from assaywatch.analyzers.detectors.multichart import MultichartCUSUM
from assaywatch.analyzers.detectors.simulation import alarm_rate_arl, first_alarm_times

if TYPE_CHECKING:
    from assaywatch.analyzers.detectors.river_adapters import RIVER_KINDS, RiverDetector

__all__ = [
    "BaselineData",
    "BernoulliCUSUM",
    "CalibrationSettings",
    "Detector",
    "FingerprintCUSUM",
    "MEWMA",
    "MultichartCUSUM",
    "RIVER_KINDS",
    "RiverDetector",
    "Thresholds",
    "alarm_rate_arl",
    "bernoulli_cusum_arl",
    "bernoulli_cusum_threshold",
    "bernoulli_lattice",
    "calibrate",
    "first_alarm_times",
    "gaussian_cusum_arl",
    "gaussian_cusum_threshold",
    "mewma_arl",
    "mewma_threshold",
    "split_arl0",
]


def __getattr__(name: str) -> Any:
    """Import the river adapters on first use: river costs ~10 MB of RSS and the monitor
    only needs it when a river detector is configured."""
    if name in ("RIVER_KINDS", "RiverDetector"):
        from assaywatch.analyzers.detectors import river_adapters

        return getattr(river_adapters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
