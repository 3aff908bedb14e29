"""How the fingerprint's thresholds share the budget among charts (``bootstrap.py``, step 1
and 2 of the module docstring), on hand-made increment laws: a chart the bootstrap
baselines know well, and one that drifts upwards in control under some of them."""

from __future__ import annotations

import math

import numpy as np

from assaywatch.analyzers.detectors import bootstrap as bs
from assaywatch.analyzers.detectors.siegmund import cusum_arl

B = 200  # bootstrap baselines (rows 1:), row 0 the plug-in law
CONF = 0.95


def _laws(drifting: int, theta_b: float = -0.1, mu_b: float = 0.05
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two charts; chart 0 has the exact LR law of a unit Gaussian shift (theta 1, mean
    -1/2, sd 1) under every baseline; chart 1 has it at the plug-in law and in all but
    ``drifting`` bootstrap baselines, in which its increments have adjustment coefficient
    ``theta_b`` and mean ``mu_b`` (by default theta < 0: it drifts upwards in control, its
    ARL grows only linearly in h)."""
    theta = np.ones((B + 1, 2))
    mu = np.full((B + 1, 2), -0.5)
    sd = np.ones((B + 1, 2))
    theta[1:drifting + 1, 1] = theta_b
    mu[1:drifting + 1, 1] = mu_b
    return theta, mu, sd, np.full(2, 3.0)


def _alone(level: float) -> float:
    """Chart 0's threshold for ARL e^level, calibrated without chart 1."""
    return float(bs._chart_h(np.array([level]), np.ones(1), np.full(1, -0.5), np.ones(1),
                             np.full(1, 3.0))[0])


def test_a_chart_the_baseline_cannot_calibrate_is_switched_off() -> None:
    # in 10% of the baselines chart 1 drifts upwards: its 95% quantile rate stays ~0.05/h
    theta, mu, sd, h_min = _laws(drifting=B // 10)
    target = np.full(2, math.log(20_000.0))
    own = bs._chart_levels(theta, mu, sd, h_min, target, CONF)
    assert math.isinf(own[1])
    # chart 0 is known exactly: its own level is its target
    assert own[0] == target[0]
    levels = bs._group_levels(theta, mu, sd, h_min, own, target - 3.0, 2 / 20_000.0, CONF)
    h = bs._thresholds(levels, theta[0], mu[0], sd[0], h_min)
    assert h[1] == bs._OFF_H
    # chart 0 keeps what it would get alone with the whole rate 2/20,000: ARL 10,000
    assert h[0] == np.float64(h[0])
    assert abs(h[0] - _alone(math.log(10_000.0))) < 0.01 * h[0]
    arl = float(cusum_arl(np.array([h[0]]), np.ones(1), np.full(1, -0.5), np.ones(1))[0])
    assert 9_900 < arl < 10_100


def test_a_noisy_chart_does_not_raise_a_well_known_one() -> None:
    # in 10% of the baselines chart 1 is closer to drifting (theta 0.5, mean -0.1): it
    # needs a higher threshold than its plug-in law says; chart 0 does not
    theta, mu, sd, h_min = _laws(drifting=B // 10, theta_b=0.5, mu_b=-0.1)
    target = np.full(2, math.log(20_000.0))
    own = bs._chart_levels(theta, mu, sd, h_min, target, CONF)
    assert own[0] == target[0] and math.isfinite(own[1]) and own[1] > target[1] + 1.0
    levels = bs._group_levels(theta, mu, sd, h_min, own, target - 3.0, 2 / 20_000.0, CONF)
    h = bs._thresholds(levels, theta[0], mu[0], sd[0], h_min)
    # each chart holds its half of the rate at the 95% quantile: chart 0 runs at ARL
    # 20,000, as it would beside a companion that never drifts
    assert abs(h[0] - _alone(math.log(20_000.0))) < 0.01 * h[0]
    assert h[1] > h[0] + 1.0


def test_small_baselines_draw_more_bootstrap_baselines() -> None:
    # reps from 2,000 runs up; below, reps x 2,000 / runs, at most five times reps
    assert bs.fingerprint_reps(40, 10_000) == 40
    assert bs.fingerprint_reps(40, 2_000) == 40
    assert bs.fingerprint_reps(40, 1_000) == 80
    assert bs.fingerprint_reps(40, 500) == 160
    assert bs.fingerprint_reps(40, 200) == 200
    assert bs.fingerprint_reps(40, 30) == 200
    assert bs.fingerprint_reps(10, 200) == 50
