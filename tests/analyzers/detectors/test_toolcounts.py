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
    ratio_logs,
    ratio_weights,
    run_swap_llr,
    run_swap_terms,
    share_ratios,
    swap_llr,
    swap_ratios,
    swap_terms,
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
    det = MultichartCUSUM(mean, cov, h=th.fingerprint, feature_names=NAMES, tool_counts=True,
                          swap_ratios=th.swap_ratios)
    # the charts' ratios of call shares are lower bounds: below the baseline's estimate
    # (the ratio of its summed calls), each pair in both directions
    assert th.swap_ratios is not None and th.swap_ratios.shape == (2, 3)
    est = swap_ratios(tool_counts(base, 0, np.array([2, 3, 4])), np.full(2_000, 1 / 2_000),
                      np.array([0, 0, 1]), np.array([1, 2, 2]), 2_000, 0.0)
    assert np.all(th.swap_ratios < est) and np.all(th.swap_ratios > 0.8 * est)
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


A2, B2 = np.array([0]), np.array([1])


def test_swap_ratios_by_hand() -> None:
    # two runs: (2, 1, 0) and (0, 3, 1) calls of a, b, c; pi = a's share of a and b's
    # calls = 2 / 6, so at z = 0 the ratios are a / b = 2 / 4 and b / a = 2
    counts = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    half = np.array([0.5, 0.5])
    assert swap_ratios(counts, half, A2, B2, 2, 0.0)[:, 0] == pytest.approx([0.5, 2.0])
    # runs as clusters: residuals n_a - pi m = +1 and -1, var = mean(resid^2) / (n m-bar^2)
    # with m-bar = 3: 1 / (2 * 9); on the log odds se / (pi (1 - pi)) = se / (2 / 9); at
    # z = 1 both ratios shrink by e^-that
    shrink = math.exp(-math.sqrt(1 / 18) / (2 / 9))
    assert swap_ratios(counts, half, A2, B2, 2, 1.0)[:, 0] == pytest.approx(
        [0.5 * shrink, 2.0 * shrink])
    # rows of bootstrap weights (B, n) give one pair of ratios per row, (B, 2, pairs)
    rows = np.array([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    out = swap_ratios(counts, rows, A2, B2, 2, 0.0)
    assert out.shape == (3, 2, 1)
    assert out[0, :, 0] == pytest.approx([0.5, 2.0])
    # a row holding only the second run: no call of a, the share floored (never 0)
    assert out[2, 0, 0] > 0 and out[1, 0, 0] == pytest.approx(2.0)


def _dirichlet_runs(n: int, rng: np.random.Generator, concentration: float | None
                    ) -> np.ndarray:
    """Call counts (n, 3): over-dispersed lengths, per-run preferences Dirichlet around P
    (``concentration`` x P) or fixed (None: multinomial calls)."""
    calls = rng.poisson(rng.gamma(2.0, 2.0, size=n)) + 1
    pref = (np.tile(P, (n, 1)) if concentration is None
            else rng.dirichlet(concentration * P, size=n))
    return np.array([rng.multinomial(k, q) for k, q in zip(calls, pref, strict=True)],
                    dtype=float)


@pytest.mark.parametrize("concentration", [None, 1.0, 0.3])
def test_swap_ratio_bounds_cover_the_true_ratios(concentration: float | None) -> None:
    """At z = 1.645 each bound is below its true ratio in 95% of 200-run baselines, calls
    multinomial or correlated within runs (Dirichlet preferences of concentration 1 and
    0.3: tool c, at a tenth of the calls, is then absent from most runs and heaps in a
    few)."""
    rng = np.random.default_rng({None: 5, 1.0: 6, 0.3: 7}[concentration])
    a, b = np.array([0, 0, 1]), np.array([1, 2, 2])
    true = share_ratios(P, a, b)  # (2, 3)
    reps, n = 400, 200
    below = np.zeros((2, 3))
    for _ in range(reps):
        counts = _dirichlet_runs(n, rng, concentration)
        below += swap_ratios(counts, np.full(n, 1 / n), a, b, n, 1.645) <= true
    cover = below / reps
    # 95% coverage, binomial sd at 400 baselines 0.011: within 0.915-0.985 (3 sd)
    assert np.all(cover >= 0.915) and np.all(cover <= 0.985), cover


@pytest.mark.parametrize("length", [1, 4, 12])
def test_swapped_run_lr_has_expectation_at_most_one_below_the_true_ratio(
        length: int) -> None:
    """The exact in-control expectation of a run's LR (all multinomial outcomes of
    ``length`` calls) under the ratio rho used in place of p_a / p_b = 2: per call
    1 - r p_a + r p_b rho, whole run (1 - s) + s (1 - p_a + p_b rho)^L; 1 at the true
    ratio, below it under, above it over."""
    from scipy.stats import multinomial
    outcomes = np.array([(i, j, length - i - j) for i in range(length + 1)
                         for j in range(length + 1 - i)], dtype=float)
    pmf = multinomial.pmf(outcomes, length, P)
    r, s = 0.2, 0.2
    for rho in (1.0, 2.0, 2.4):
        ratios = np.array([[rho], [0.5]])
        up, _ = swap_terms(outcomes[:, A2], outcomes[:, B2], ratio_weights(ratios, r))
        per_call = float(pmf @ np.exp(up[:, 0]))
        assert per_call == pytest.approx((1 - r * 0.6 + r * 0.3 * rho) ** length)
        run_up, _ = run_swap_terms(outcomes[:, A2], outcomes[:, B2], ratio_logs(ratios), s)
        whole = float(pmf @ np.exp(run_up[:, 0]))
        assert whole == pytest.approx(1 - s + s * (1 - 0.6 + 0.3 * rho) ** length)
        if rho < 2.0:
            assert per_call < 1.0 and whole < 1.0
        elif rho == 2.0:
            assert per_call == pytest.approx(1.0) and whole == pytest.approx(1.0)
        else:
            assert per_call > 1.0 and whole > 1.0


def test_the_chart_runs_on_the_ratios_it_is_given() -> None:
    rng = np.random.default_rng(14)
    base = _runs(500, rng)
    mean, cov = base.mean(axis=0), np.cov(base, rowvar=False)
    given = np.array([[1.5, 4.0, 2.5], [0.4, 0.2, 0.3]])
    det = MultichartCUSUM(mean, cov, feature_names=NAMES, tool_counts=True,
                          swap_ratios=given)
    # a run of 4 calls: none of a, 2 of b, 2 of c (steps 8)
    x = np.array([math.log1p(8), 0.0, 0.0, 2 / 8, 2 / 8])
    up, down = det._increments(x)
    j = det.labels.index("swap:a>b")
    assert up[j] == pytest.approx(2 * math.log(1 + 0.2 * 1.5))
    # whole-run a>b: no a, 2 of b: 0.8 + 0.2 (1 + 1.5)^2
    k = det.labels.index("runswap:a>b")
    assert up[k] == pytest.approx(math.log(0.8 + 0.2 * 2.5 ** 2))
    # b>c down (c to b): 2 of b at 1 + 0.2 * 0.3 per call, 2 of c at 0.8
    i = det.labels.index("swap:b>c")
    assert down[i] == pytest.approx(2 * math.log(1.06) + 2 * math.log(0.8))
    with pytest.raises(ValueError, match="swap_ratios"):
        MultichartCUSUM(mean, cov, feature_names=NAMES, tool_counts=True,
                        swap_ratios=np.ones((2, 2)))
    with pytest.raises(ValueError, match="swap_ratios"):
        MultichartCUSUM(mean, cov, feature_names=NAMES, tool_counts=True,
                        swap_ratios=-given)
