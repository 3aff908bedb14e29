"""The fingerprint charts' thresholds (analyzers/detectors/bootstrap.py, issue 12): the
budget split per family of charts (``family_split``), thresholds from the rate averaged
over the bootstrap baselines (``bootstrap_h``), charts no threshold can hold switched off
(``switch_off``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from assaywatch.analyzers.detectors.bootstrap import (
    OFF_H,
    BaselineData,
    CalibrationSettings,
    _chart_h,
    _chart_h_mean,
    _chart_shares,
    calibrate,
)
from assaywatch.analyzers.detectors.multichart import MultichartCUSUM
from assaywatch.analyzers.detectors.siegmund import _adjustment, cusum_arl

NAMES = ["steps", "duration", "any_error", "max_depth", "tool:a", "tool:b", "tool:c"]
P = np.array([0.6, 0.3, 0.1])


def _runs(n: int, rng: np.random.Generator, p: np.ndarray = P) -> np.ndarray:
    """Fingerprint-like rows: steps = log1p(L), duration, an error flag, a depth and the
    tool shares = calls / L, L = 2 x calls (an llm step per call), calls over-dispersed."""
    calls = rng.poisson(rng.gamma(2.0, 2.0, size=n)) + 1
    c = np.array([rng.multinomial(k, p) for k in calls], dtype=float)
    steps = 2.0 * calls
    dur = np.log1p(steps) + 0.3 * rng.standard_normal(n)
    err = (rng.random(n) < 0.1).astype(float)
    depth = 1.0 + rng.poisson(0.5, size=n)
    return np.column_stack([np.log1p(steps), dur, err, depth, c / steps[:, None]])


@pytest.fixture(scope="module")
def base() -> np.ndarray:
    return _runs(2_000, np.random.default_rng(21))


def _det(base: np.ndarray, counts: bool = True) -> MultichartCUSUM:
    return MultichartCUSUM(base.mean(axis=0), np.cov(base, rowvar=False),
                           feature_names=NAMES, tool_counts=counts)


def test_budget_per_family_by_hand(base: np.ndarray) -> None:
    """Charts: volume {steps, duration}, structure {any_error, max_depth, 3 tool shares},
    swaps {a>b, a>c, b>c}: each family a third of the budget, halved between the up and
    the down side, then split equally over the family's charts."""
    det = _det(base)
    assert det.labels == ["steps", "duration", "any_error", "max_depth", "tool:a",
                          "tool:b", "tool:c", "swap:a>b", "swap:a>c", "swap:b>c"]
    shares = _chart_shares(det, by_family=True)
    assert shares[:10].tolist() == pytest.approx([1 / 12] * 2 + [1 / 30] * 5 + [1 / 18] * 3)
    assert shares[10:].tolist() == shares[:10].tolist()
    assert shares.sum() == pytest.approx(1.0)
    assert _chart_shares(det, by_family=False).tolist() == pytest.approx([1 / 20] * 20)
    # Gaussian swap charts (no counts) are the swap family too
    gauss = _det(base, counts=False)
    assert [lab for lab in gauss.labels if lab.startswith("swap:")] == [
        "swap:a>b", "swap:a>c", "swap:b>c"]
    assert _chart_shares(gauss, True)[:10].tolist() == pytest.approx(shares[:10].tolist())


def test_a_family_without_charts_leaves_its_share_to_the_others(base: np.ndarray) -> None:
    det = MultichartCUSUM(base[:, :4].mean(axis=0), np.cov(base[:, :4], rowvar=False),
                          feature_names=NAMES[:4], tool_counts=True)
    assert det.labels == ["steps", "duration", "any_error", "max_depth"]
    assert _chart_shares(det, True)[:4].tolist() == pytest.approx([1 / 8] * 4)


def test_calibrated_thresholds_spend_the_budget_by_family(base: np.ndarray) -> None:
    """Under the plug-in law (``bootstrap_h=False``: thresholds from the baseline's own
    runs), each chart's ARL is e^level over its share times 2m; so a volume chart's ARL
    is 30/12 = 2.5 times smaller than a structure chart's, and the thresholds shrink
    where the share grows: the volume charts' are below the uniform split's."""
    mean, cov = base.mean(axis=0), np.cov(base, rowvar=False)
    data = BaselineData(mean, cov, 2_000, 0, 0, base, NAMES)

    def settings(**kw: bool) -> CalibrationSettings:
        return CalibrationSettings(arl0=500.0, shares={"cusum_fingerprint": 1.0},
                                   tool_counts=True, bootstrap_h=False, switch_off=False,
                                   **kw)

    fam = calibrate(data, settings(), seed=4)
    uni = calibrate(data, settings(family_split=False), seed=4)
    assert fam.fingerprint is not None and uni.fingerprint is not None
    assert fam.fingerprint.shape == uni.fingerprint.shape == (2, 10)
    assert np.all(fam.fingerprint[:, :2] < uni.fingerprint[:, :2])
    assert np.all(fam.fingerprint[:, 2:7] > uni.fingerprint[:, 2:7])
    # the ARL of the up chart of duration and of max_depth under the plug-in law
    det = MultichartCUSUM(mean, cov, h=fam.fingerprint, feature_names=NAMES,
                          tool_counts=True)
    y = np.clip((base - mean) @ det.projections[[1, 3]].T, -det.clip, det.clip) - det.k
    theta, mu, sd = _adjustment(y.T, np.full(y.T.shape, 1.0 / len(base)))
    arl = cusum_arl(fam.fingerprint[0, [1, 3]], theta, mu, sd)
    assert math.log(arl[0]) == pytest.approx(fam.level - math.log(20 / 12), abs=0.05)
    assert math.log(arl[1]) == pytest.approx(fam.level - math.log(20 / 30), abs=0.05)


def test_threshold_of_a_mean_rate_by_hand() -> None:
    """Two bootstrap laws of one chart: the threshold found gives the mean of their rates
    1/ARL the target e^-level (and at least the floor)."""
    theta = np.array([[0.5], [0.3]])
    mu, sd = np.array([[-0.25], [-0.15]]), np.array([[1.0], [1.0]])
    h = _chart_h_mean(np.array([8.0]), theta, mu, sd, np.array([3.0]))
    rate = (1.0 / cusum_arl(h[None, :], theta, mu, sd)).mean()
    assert rate == pytest.approx(math.exp(-8.0), rel=1e-4)
    # between the thresholds each law alone needs for the rate e^-8 (the mean of two
    # rates is e^-8 only if one is above and the other below)
    alone = [_chart_h(8.0, theta[b], mu[b], sd[b], 3.0)[0] for b in (0, 1)]
    assert alone[0] < h[0] < alone[1]
    # a target any threshold meets: the floor
    assert _chart_h_mean(np.array([0.0]), theta, mu, sd, np.array([3.0]))[0] == pytest.approx(
        3.0, abs=1e-6)


ERR_NAMES = ["steps", "duration", "any_error", "recovery_rate"]


def _err_runs(n: int, rng: np.random.Generator) -> np.ndarray:
    """Runs with a rare error flag (6%) and its recovery rate (0 without an error)."""
    steps = np.log1p(rng.poisson(5, n) + 1.0)
    err = (rng.random(n) < 0.06).astype(float)
    rec = err * rng.choice([0.0, 0.5, 1.0], n)
    return np.column_stack([steps, steps + 0.3 * rng.standard_normal(n), err, rec])


def test_small_baseline_thresholds_from_the_bootstrap_mean() -> None:
    """On 200 runs with 13 errors the plug-in law gives the error flag's "down" chart
    (fewer errors) a threshold near the one-run floor, and only a high level for every
    chart keeps the union's quantile: the bootstrap mean raises that chart's threshold
    instead, and the others come down. The false-alarm rate holds: 3,000 in-control runs
    at ARL0 500, at most the Poisson(6) 0.995 quantile, 13."""
    rng = np.random.default_rng(1)
    x = _err_runs(200, rng)
    assert x[:, 2].sum() == 13
    data = BaselineData(x.mean(axis=0), np.cov(x, rowvar=False), 200, 0, 0, x, ERR_NAMES)
    s = CalibrationSettings(arl0=500.0, shares={"cusum_fingerprint": 1.0})
    plug = calibrate(data, CalibrationSettings(
        arl0=500.0, shares={"cusum_fingerprint": 1.0}, bootstrap_h=False), seed=1)
    boot = calibrate(data, s, seed=1)
    assert plug.fingerprint is not None and boot.fingerprint is not None
    assert boot.level < plug.level - 3.0
    assert boot.fingerprint[1, 2] > plug.fingerprint[1, 2]  # any_error:down
    assert np.all(boot.fingerprint[:, :2] < plug.fingerprint[:, :2] - 3.0)
    det = MultichartCUSUM(data.mean, data.cov, h=boot.fingerprint, feature_names=ERR_NAMES)
    for run in _err_runs(3_000, np.random.default_rng(2)):
        det.update(run)
    assert det.n_alarms <= 13, det.n_alarms


def test_chart_that_no_threshold_can_hold_is_switched_off(base: np.ndarray) -> None:
    """On 100 runs where tool c has 10% of the calls, "c called less" (the down side of
    a>c and b>c) drifts up in control under many bootstrap baselines: off (``OFF_H``),
    the chart never alarms; "c called more" stays on."""
    x = base[:100]
    data = BaselineData(x.mean(axis=0), np.cov(x, rowvar=False), 100, 0, 0, x, NAMES)
    s = CalibrationSettings(arl0=500.0, shares={"cusum_fingerprint": 1.0}, tool_counts=True)
    th = calibrate(data, s, seed=3)
    kept = calibrate(data, CalibrationSettings(
        arl0=500.0, shares={"cusum_fingerprint": 1.0}, tool_counts=True, switch_off=False),
        seed=3)
    assert th.fingerprint is not None and kept.fingerprint is not None
    off = th.fingerprint >= OFF_H
    assert not kept.fingerprint.max() >= OFF_H
    assert off.any() and not off[0].any(), off
    # every chart still on has a usable threshold, lower where the budget was freed
    assert np.all(th.fingerprint[~off] <= kept.fingerprint[~off] + 1e-9)


def test_family_split_keeps_the_false_alarm_rate_and_sees_a_swap(base: np.ndarray) -> None:
    rng = np.random.default_rng(22)
    mean, cov = base.mean(axis=0), np.cov(base, rowvar=False)
    s = CalibrationSettings(arl0=500.0, shares={"cusum_fingerprint": 1.0}, tool_counts=True)
    th = calibrate(BaselineData(mean, cov, 2_000, 0, 0, base, NAMES), s, seed=5)
    det = MultichartCUSUM(mean, cov, h=th.fingerprint, feature_names=NAMES, tool_counts=True)
    # 3,000 in-control runs at ARL0 500: a Poisson count of mean 6, 0.995 quantile 13
    for x in _runs(3_000, rng):
        det.update(x)
    assert det.n_alarms <= 13, det.n_alarms
    det.reset()
    for x in _runs(400, rng, np.array([0.3, 0.3, 0.4])):
        det.update(x)
        if det.drift_detected:
            break
    assert det.drift_detected and det.n < 200, det.n
    assert "swap:a>c:up" in det.charts_alarmed
