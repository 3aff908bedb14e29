"""Swap charts on the call counts' likelihood ratio (analyzers/detectors/toolcounts.py) and
their place in MultichartCUSUM and its bootstrap calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from assaywatch.analyzers.detectors.bootstrap import (
    BaselineData,
    CalibrationSettings,
    calibrate,
)
from assaywatch.analyzers.detectors.multichart import RUN_CLIP, MultichartCUSUM
from assaywatch.analyzers.detectors.toolcounts import (
    run_swap_llr,
    swap_llr,
    swap_weights,
    tool_counts,
)

NAMES = ["steps", "duration", "tool:a", "tool:b", "tool:c"]
P = np.array([0.6, 0.3, 0.1])


def _runs(n: int, rng: np.random.Generator, p: np.ndarray = P) -> np.ndarray:
    """Fingerprint-like rows: steps = log1p(L), tool shares = calls / L, L = 2 x calls
    (an llm step per call), calls over-dispersed (gamma-Poisson)."""
    calls = rng.poisson(rng.gamma(2.0, 2.0, size=n)) + 1
    c = np.array([rng.multinomial(k, p) for k in calls], dtype=float)
    steps = 2.0 * calls
    dur = np.log1p(steps) + 0.3 * rng.standard_normal(n)
    return np.column_stack([np.log1p(steps), dur, c / steps[:, None]])


def test_counts_are_recovered_exactly_from_the_fingerprint() -> None:
    x = np.array([[math.log1p(7), 0.0, 3 / 7, 0.0, 4 / 7]])
    assert tool_counts(x, 0, np.array([2, 3, 4])).tolist() == [[3.0, 0.0, 4.0]]


def test_llr_of_a_swap_by_hand() -> None:
    # p_a = 0.6, p_b = 0.3, r = 0.2: a to b multiplies a's share by 0.8, b's by 1.4
    w = swap_weights(P, np.array([0]), np.array([1]), 0.2)
    ll = swap_llr(np.array([2.0, 3.0, 0.0]), w, np.array([0]), np.array([1]), 10.0)
    assert ll[0, 0] == pytest.approx(2 * math.log(0.8) + 3 * math.log(1.4))
    # b to a: b's share times 0.8, a's times 1 + 0.2 * 0.3 / 0.6 = 1.1
    assert ll[1, 0] == pytest.approx(3 * math.log(0.8) + 2 * math.log(1.1))
    # one run never carries more than the clip
    assert swap_llr(np.array([0.0, 30.0, 0.0]), w, np.array([0]), np.array([1]),
                    5.0)[0, 0] == 5.0


def test_bad_shift_is_refused() -> None:
    with pytest.raises(ValueError, match="tool_shift"):
        swap_weights(P, np.array([0]), np.array([1]), 1.0)


def _first_alarm(det: MultichartCUSUM, rows: np.ndarray) -> int:
    """Feed ``rows`` until the chart alarms; the number of runs fed."""
    delay = 0
    for x in rows:
        det.update(x)
        delay += 1
        if det.drift_detected:
            break
    return delay


def test_counted_swaps_cover_rare_tools_and_detect_a_swap() -> None:
    rng = np.random.default_rng(11)
    base = _runs(2_000, rng)
    mean, cov = base.mean(axis=0), np.cov(base, rowvar=False)
    s = CalibrationSettings(arl0=500.0, shares={"cusum_fingerprint": 1.0}, tool_counts=True)
    th = calibrate(BaselineData(mean, cov, 2_000, 0, 0, base, NAMES), s, seed=3)
    assert th.tool_counts and th.fingerprint is not None
    det = MultichartCUSUM(mean, cov, h=th.fingerprint, feature_names=NAMES, tool_counts=True)
    # three tools: the three pairs, in order of call share, each a two-sided count chart
    # on a share of every run's calls, then on whole runs
    assert det.count_labels == ["swap:a>b", "swap:a>c", "swap:b>c",
                                "runswap:a>b", "runswap:a>c", "runswap:b>c"]
    assert det.labels[-6:] == det.count_labels
    assert not any("swap:" in lab for lab in det.labels[:-6])
    # one run alone alarms only past e^count_clip: every count-chart threshold, the
    # whole-run charts' included, is at least count_clip (whose LRs are clipped higher)
    j = len(det.labels) - 6
    assert np.all(th.fingerprint[:, j:] >= det.count_clip)
    assert det.count_clip < RUN_CLIP
    # in control: 3,000 runs at a configured ARL0 of 500, i.e. at most a Poisson count of
    # mean 6; above its 0.995 quantile (13) the calibration is broken
    for x in _runs(3_000, rng):
        det.update(x)
    assert det.n_alarms <= 13, det.n_alarms
    # half of a's calls go to c (c's share 0.1 -> 0.4): the a>c chart alarms
    det.reset()
    delay = _first_alarm(det, _runs(400, rng, np.array([0.3, 0.3, 0.4])))
    assert det.drift_detected and delay < 200, delay
    # the alarm names c as the tool gaining calls (from a, or in runs without b)
    assert any(c.endswith(">c:up") for c in det.charts_alarmed), det.charts_alarmed
    # a fifth of the runs stop calling b and call c instead (every call): the whole-run
    # chart b>c alarms
    det.reset()
    swapped = _runs(400, rng)
    pick = rng.random(400) < 0.2
    swapped[pick, 4] += swapped[pick, 3]
    swapped[pick, 3] = 0.0
    delay = _first_alarm(det, swapped)
    assert det.drift_detected and delay < 200, delay
    assert "runswap:b>c:up" in det.charts_alarmed, det.charts_alarmed


def test_llr_of_a_whole_run_swap_by_hand() -> None:
    a, b = np.array([0]), np.array([1])
    # p_a = 0.6, p_b = 0.3, s = 0.2; a run without a's calls and 2 of b's: 0.8 + 0.2 * 3^2
    ll = run_swap_llr(np.array([0.0, 2.0, 1.0]), P, a, b, 0.2, 50.0)
    assert ll[0, 0] == pytest.approx(math.log(0.8 + 0.2 * 3.0 ** 2))
    # down (b to a) needs no b calls: this run has two, so it cannot be a swapped run
    assert ll[1, 0] == pytest.approx(math.log(0.8))
    # a run calling neither is as likely either way
    assert run_swap_llr(np.array([0.0, 0.0, 4.0]), P, a, b, 0.2, 50.0)[:, 0] == (
        pytest.approx([0.0, 0.0]))
    # one run never carries more than the clip
    assert run_swap_llr(np.array([0.0, 30.0, 0.0]), P, a, b, 0.2, 8.0)[0, 0] == 8.0
    with pytest.raises(ValueError, match="swap_runs"):
        run_swap_llr(np.array([0.0, 1.0, 0.0]), P, a, b, 1.0, 8.0)


def test_without_counts_the_swaps_stay_gaussian_projections() -> None:
    rng = np.random.default_rng(12)
    base = _runs(500, rng)
    det = MultichartCUSUM(base.mean(axis=0), np.cov(base, rowvar=False), feature_names=NAMES)
    assert det.count_labels == []
    assert all(np.any(det.projections[j] != 0) for j in range(len(det.labels)))
