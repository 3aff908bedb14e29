"""river adapters (both Page-Hinkley directions) and the per-stream ARL0 split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from assaywatch.analyzers.detectors import (
    MEWMA,
    BernoulliCUSUM,
    FingerprintCUSUM,
    RiverDetector,
    split_arl0,
)


def _first_alarm(det: RiverDetector, xs: np.ndarray) -> int | None:
    for t, x in enumerate(xs):
        det.update(float(x))
        if det.drift_detected:
            return t
    return None


@pytest.mark.parametrize("direction", [+1.0, -1.0])
def test_page_hinkley_default_mode_detects_increase_and_decrease(direction: float) -> None:
    rng = np.random.default_rng(60)
    hits = 0
    for _ in range(20):
        xs = np.concatenate([rng.normal(0, 1, 400), rng.normal(2 * direction, 1, 200)])
        t = _first_alarm(RiverDetector("page_hinkley"), xs)
        hits += t is not None and t >= 400
    assert hits >= 19  # a 2 sd shift is caught within 200 runs essentially always


def test_page_hinkley_up_mode_misses_decreases() -> None:
    """SPEC: "Page-Hinkley in some packages only detects increases": mode='up' is that."""
    rng = np.random.default_rng(61)
    xs = np.concatenate([rng.normal(0, 1, 400), rng.normal(-2, 1, 600)])
    assert _first_alarm(RiverDetector("page_hinkley", mode="up"), xs) is None
    assert _first_alarm(RiverDetector("page_hinkley", mode="down"), xs) is not None


def test_statistic_threshold_semantics_per_kind() -> None:
    rng = np.random.default_rng(62)
    ph, ks, ad = (RiverDetector("page_hinkley"), RiverDetector("kswin", alpha=1e-4),
                  RiverDetector("adwin"))
    xs = np.concatenate([rng.normal(0, 1, 300), rng.normal(3, 1, 200)])
    for det in (ph, ks):
        for x in xs:
            det.update(float(x))
            if det.drift_detected:
                assert det.statistic >= det.threshold
                break
        assert det.drift_detected
    assert ks.threshold == pytest.approx(4.0)
    ad.update(1.0)
    assert math.isnan(ad.statistic) and math.isnan(ad.threshold)
    assert ad.evidence()["adwin_width"] == 1


def test_invalid_kind_and_parameters_raise_value_error_naming_valid_values() -> None:
    with pytest.raises(ValueError, match="adwin"):
        RiverDetector("cusum")
    with pytest.raises(ValueError, match="page_hinkley.*up.*down.*both"):
        RiverDetector("page_hinkley", mode="sideways")
    with pytest.raises(ValueError, match="invalid parameters"):
        RiverDetector("adwin", window=3)


def test_split_arl0_is_bonferroni_in_time() -> None:
    assert split_arl0(10_000, 3) == 30_000
    with pytest.raises(ValueError):
        split_arl0(10_000, 0)


def test_union_of_a_streams_detectors_keeps_the_arl0_target() -> None:
    """Pass-rate CUSUM + fingerprint CUSUM + MEWMA, each at split_arl0(target, 3)."""
    target, d, reps, steps = 1_000, 5, 250, 16_000
    each = split_arl0(target, 3)
    cov = 0.6 * np.eye(d) + 0.4
    chol = np.linalg.cholesky(cov)
    dets = [BernoulliCUSUM(0.9, 0.8, arl0=each), FingerprintCUSUM(np.zeros(d), np.ones(d),
            arl0=each), MEWMA(np.zeros(d), cov, arl0=each)]
    states = [det._batch_init(reps) for det in dets]
    rng = np.random.default_rng(63)
    union = 0
    for _ in range(steps // 500):
        bits = rng.random((500, reps)) < 0.9
        fps = rng.standard_normal((500, reps, d)) @ chol.T
        for b, f in zip(bits, fps, strict=True):
            fired = dets[0]._batch_step(states[0], b)
            fired |= dets[1]._batch_step(states[1], f)
            fired |= dets[2]._batch_step(states[2], f)
            union += int(fired.sum())
    arl = reps * steps / union
    # ~4000 union alarms: SE ~ 1.6 %; Bonferroni is conservative, so >= target - 4 SE
    assert arl >= 0.94 * target
    assert arl <= 2.0 * target  # and not absurdly conservative
