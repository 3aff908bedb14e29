"""Graded-score e-CUSUM (``score.py``): scale inference, the baseline summary, the bound
on the baseline mean, the bet and the recursion, on hand-derivable values.

The in-control ARL0 and the delays on realistic score data are measured in
``tests/realworld/test_score_rates.py``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from assaywatch.analyzers.detectors.score import (
    HIST_LEVELS,
    ScoreDropCUSUM,
    ScoreSummary,
    best_lambda,
    infer_scale,
)

Z95 = float(norm.ppf(0.95))  # 1.6449


# -- infer_scale ---------------------------------------------------------------------------
@pytest.mark.parametrize("values, scale", [
    ([0.2, 1.0, 0.7], (0.0, 1.0)),
    ([0, 1, 1, 0], (0.0, 1.0)),  # pass/fail bits: the unit scale comes first
    ([1, 4, 5, 3], (1.0, 5.0)),
    ([2, 3], (1.0, 5.0)),  # integers inside 1-5 (above 1) are a rubric
    ([1.5, 4.0], (0.0, 10.0)),  # not integers: not the rubric
    ([0, 3, 5], (0.0, 10.0)),  # a 0 is not on a 1-5 rubric
    ([3.5, 7.0], (0.0, 10.0)),
    ([20, 85, 100], (0.0, 100.0)),
    ([150.0, 250.0], (150.0, 250.0)),  # no known scale: the observed range
    ([-1.0, 0.5], (-1.0, 0.5)),
    ([150.0], (149.5, 150.5)),  # a single value: +- 0.5
    ([], (0.0, 1.0)),
    ([float("nan"), float("inf"), 0.5], (0.0, 1.0)),  # non-finite values ignored
])
def test_infer_scale(values: list[float], scale: tuple[float, float]) -> None:
    assert infer_scale(values) == scale


# -- ScoreSummary --------------------------------------------------------------------------
def test_summary_of_a_small_rubric_by_hand() -> None:
    s = ScoreSummary.from_scores([1, 2, 2, 5])
    # mean 2.5; deviations -1.5, -0.5, -0.5, 2.5: sum of squares 9, / (n - 1) = 3
    assert (s.n, s.mean, s.var, s.lo, s.hi) == (4, 2.5, 3.0, 1.0, 5.0)
    # levels (x - 1) / 4 * 100
    assert s.hist == {0: 1, 25: 2, 100: 1}
    assert s.normalised() == pytest.approx((0.375, 3.0 / 16.0))
    ys, ps = s.levels()
    assert ys.tolist() == [0.0, 0.25, 1.0] and ps.tolist() == [0.25, 0.5, 0.25]


def test_summary_round_trips_through_json() -> None:
    rng = np.random.default_rng(3)
    for s in (ScoreSummary.from_scores(rng.beta(5, 2, 300)),
              ScoreSummary.from_scores(rng.integers(1, 6, 50)),
              ScoreSummary.from_scores([7.0, 12.5, 99.0], scale=(0.0, 100.0)),
              ScoreSummary.from_scores([])):
        d = json.loads(json.dumps(s.to_dict()))
        back = ScoreSummary.from_dict(d)
        if s.n:
            assert back == s
        else:  # nan != nan: compare the fields
            assert (back.n, back.lo, back.hi, back.hist) == (0, s.lo, s.hi, {})
            assert math.isnan(back.mean) and math.isnan(back.var)
        assert back.to_dict() == s.to_dict() or not s.n


def test_summary_clips_to_the_scale_and_drops_non_finite_scores() -> None:
    s = ScoreSummary.from_scores([-1.0, 0.5, 2.0, float("nan")], scale=(0.0, 1.0))
    assert s.n == 3 and s.mean == pytest.approx(0.5)  # [0, 0.5, 1]
    assert s.hist == {0: 1, 50: 1, 100: 1}
    assert sum(s.hist.values()) == s.n and max(s.hist) <= HIST_LEVELS


def test_empty_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        ScoreSummary.from_scores([1.0, 2.0], scale=(3.0, 3.0))


# -- the lower bound of the baseline mean --------------------------------------------------
def test_mean_lower_is_the_normal_bound_for_a_large_baseline() -> None:
    n = 10_000
    s = ScoreSummary.from_scores([0.0, 1.0] * (n // 2))
    # mean 0.5, sd 0.5: 0.5 - 1.645 * 0.5 / 100 = 0.491776
    assert s.mean_lower(0.95) == pytest.approx(0.5 - Z95 * 0.5 / math.sqrt(n), rel=1e-5)
    assert s.mean_lower(0.95) == pytest.approx(0.491776, abs=1e-5)


@pytest.mark.parametrize("scores", [[0.2, 0.9, 0.7, 0.8], [1, 3, 4, 5, 5, 2],
                                    [0.9] * 30, [1.0] * 500])
def test_mean_lower_is_below_the_mean(scores: list[float]) -> None:
    s = ScoreSummary.from_scores(scores)
    m, v = s.normalised()
    lower = s.mean_lower(0.95)
    assert lower < m
    # the pseudo-observation of variance 1/4: (n v + 1/4) / (n + 1)
    v_eff = (s.n * v + 0.25) / (s.n + 1)
    assert lower == pytest.approx(max(0.0, m - Z95 * math.sqrt(v_eff / s.n)), abs=1e-12)
    assert s.mean_lower(0.99) < lower < s.mean_lower(0.8)


def test_all_perfect_baseline_does_not_claim_certainty() -> None:
    s = ScoreSummary.from_scores([1.0, 1.0])
    # v = 0: v_eff = 0.25 / 3, bound 1 - 1.645 * sqrt(0.25 / 3 / 2) = 0.6642
    assert s.mean_lower(0.95) == pytest.approx(1 - Z95 * math.sqrt(0.25 / 6), abs=1e-12)
    assert s.mean_lower(0.95) == pytest.approx(0.6642, abs=1e-4)


# -- the bet -------------------------------------------------------------------------------
def test_best_lambda_two_point_baseline_by_hand() -> None:
    """Baseline {0: 1 - p, 1: p}. Its two drop shapes of 0.1: shifted and clipped,
    {0: 1 - p, 0.9: p}; collapsed, q = 0.1 / 0.8 of the mass to 0: {0: 0.3, 1: 0.7}. With
    a = m0 the growth under a two-point law {0: w, c: 1 - w} is
    w log(1 + lam a) + (1 - w) log(1 + lam (m0 - c)), maximal at
    lam* = -(w a + (1 - w) b) / (a b), b = m0 - c: 0.641 for the shift, 0.466 for the
    collapse. The bet maximising the worse of the two lies between, where they cross."""
    from scipy.optimize import brentq

    p = 0.8
    s = ScoreSummary.from_scores([0.0] * 20 + [1.0] * 80)
    m0 = 0.78

    def star(w: float, c: float) -> float:
        a, b = m0, m0 - c
        return -(w * a + (1 - w) * b) / (a * b)

    def growth(lam: float, w: float, c: float) -> float:
        return w * math.log1p(lam * m0) + (1 - w) * math.log1p(lam * (m0 - c))

    shift_star, collapse_star = star(1 - p, 0.9), star(0.3, 1.0)
    assert shift_star == pytest.approx(0.641, abs=1e-3)
    assert collapse_star == pytest.approx(0.466, abs=1e-3)
    cross = brentq(lambda lam: growth(lam, 1 - p, 0.9) - growth(lam, 0.3, 1.0),
                   collapse_star, shift_star)
    top = 0.99 / (1 - m0)
    assert best_lambda(s, m0, 0.1) == pytest.approx(cross, abs=top / 400)


def test_best_lambda_at_the_edges_of_its_grid() -> None:
    s = ScoreSummary.from_scores([0.5] * 10)  # one level, 0.4 under the alternative
    m0 = 0.45
    top = 0.99 / (1 - m0)
    # alternative below m0 for sure: the growth increases to the top of the grid
    assert best_lambda(s, m0, 0.1) == pytest.approx(top)
    # alternative above m0: no positive growth, the smallest bet on the grid
    assert best_lambda(s, 0.35, 0.01, grid=400) == pytest.approx(0.99 / 0.65 / 400)


@pytest.mark.parametrize("scores", [
    [1.0] * 200,  # m0 close to 1: the largest bets
    [0.0, 1.0] * 50,
    list(np.random.default_rng(1).beta(20, 5, 300)),
    [1, 2, 3, 4, 5, 5, 5, 4],
    [0.05, 0.1, 0.0, 0.02, 0.3] * 40,  # a low baseline (mean 0.094)
])
def test_every_factor_is_positive_on_the_scale(scores: list[float]) -> None:
    det = ScoreDropCUSUM(ScoreSummary.from_scores(scores), shift=0.1)
    assert 0 < det.lam < 1 / (1 - det.m0)
    ys = np.linspace(0.0, 1.0, 1001)
    factors = 1 + det.lam * (det.m0 - ys)
    assert factors.min() > 0
    # the worst factor is at the top of the scale: 1 - lam (1 - m0) >= 0.01 on the grid
    assert factors.min() == pytest.approx(1 - det.lam * (1 - det.m0))
    assert factors.min() >= 0.01 - 1e-12


# -- the recursion -------------------------------------------------------------------------
@pytest.mark.parametrize("scores", [
    [0.2, 0.9, 1.0, 0.7, 0.8, 0.95],
    [1, 3, 4, 4, 5, 2, 5],
    [3, 4, 4, 3],  # a rubric whose top value 4 is below the scale's 5
    list(np.random.default_rng(2).beta(20, 5, 200)),
])
def test_the_baselines_top_value_never_raises_the_statistic(scores: list[float]) -> None:
    s = ScoreSummary.from_scores(scores)
    det = ScoreDropCUSUM(s, arl0=100.0)
    top = max(scores)
    for _ in range(2_000):
        det.update(top)
        assert det.statistic == 0.0 and not det.drift_detected
    assert det.n == 2_000


@pytest.mark.parametrize("scores, arl0, bottom", [
    ([0.2, 0.9, 1.0, 0.7, 0.8, 0.95], 1_000.0, 0.0),
    ([1, 3, 4, 4, 5, 2, 5], 10_000.0, 1),
    (list(np.random.default_rng(4).beta(20, 5, 500)), 500.0, 0.0),
    ([0.9] * 40 + [1.0] * 60, 10_000.0, 0.0),
])
def test_a_stream_at_the_bottom_alarms_after_exactly_h_over_the_step(
        scores: list[float], arl0: float, bottom: float) -> None:
    det = ScoreDropCUSUM(ScoreSummary.from_scores(scores), arl0=arl0)
    step = math.log1p(det.lam * det.m0)  # y = 0: log(1 + lam m0) per score
    assert det.h == pytest.approx(math.log(arl0))
    ratio = det.h / step
    assert abs(ratio - round(ratio)) > 1e-6  # not at an integer: float sums decide nothing
    expected = math.ceil(ratio)
    for i in range(1, expected + 1):
        det.update(bottom)
        assert det.statistic == pytest.approx(i * step, rel=1e-12)
        assert det.drift_detected == (i == expected), i
    det.reset()
    assert det.statistic == 0.0 and not det.drift_detected


def test_out_of_scale_scores_count_as_the_scale_ends() -> None:
    s = ScoreSummary.from_scores([1, 3, 4, 4, 5, 2, 5])  # 1-5 rubric
    a, b = ScoreDropCUSUM(s), ScoreDropCUSUM(s)
    for low, clipped in ((-7.0, 1), (0.0, 1), (2.0, 2), (9.0, 5), (5.5, 5), (-1e9, 1)):
        a.update(low)
        b.update(clipped)
        assert a.statistic == b.statistic
    a.update(0.0)
    assert a.statistic == pytest.approx(b.statistic + math.log1p(b.lam * b.m0))


def test_a_baseline_at_the_bottom_of_the_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="bottom of the scale"):
        ScoreDropCUSUM(ScoreSummary.from_scores([0.0] * 50))
    with pytest.raises(ValueError, match="bottom of the scale"):
        ScoreDropCUSUM(ScoreSummary.from_scores([1, 1, 1, 2], scale=(1.0, 5.0)))


@pytest.mark.parametrize("kwargs, match", [
    ({"shift": 0.0}, "shift"), ({"shift": 1.0}, "shift"), ({"arl0": 1.0}, "arl0")])
def test_bad_settings_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ScoreDropCUSUM(ScoreSummary.from_scores([0.5, 0.7, 0.9]), **kwargs)


def test_a_one_score_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ScoreDropCUSUM(ScoreSummary.from_scores([0.8]))


def test_evidence_reports_in_score_units() -> None:
    s = ScoreSummary.from_scores([1, 3, 4, 4, 5, 2, 5])
    det = ScoreDropCUSUM(s, shift=0.1, arl0=1_000.0)
    det.update(1)
    ev = json.loads(json.dumps(det.evidence()))
    assert ev["scale"] == [1.0, 5.0]
    assert ev["shift"] == pytest.approx(0.4)  # 0.1 of a 4-point scale
    assert ev["baseline_mean_lower"] == pytest.approx(1 + 4 * det.m0)
    assert ev["baseline_mean_lower"] < ev["baseline_mean"] == pytest.approx(24 / 7)
    assert ev["threshold"] == pytest.approx(math.log(1_000))
    assert ev["statistic"] == det.statistic > 0
