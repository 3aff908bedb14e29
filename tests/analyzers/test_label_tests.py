"""The gate's label test (analyzers/label_tests.py): its table, its exact conditional
p-value, its false-alarm rate on unchanged candidates and its power against a shift.

Error rates are measured with the baseline re-drawn for every repetition. Monte Carlo
bound: a rejection rate of an unchanged candidate must stay below
``alpha + 3 sqrt(alpha (1 - alpha) / reps)`` (0.083 at alpha = 0.05 and 0.025 at 0.01
with 400 repetitions): a valid test exceeds it with probability about 0.1 %.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.detectors.label import MAX_LABELS, OTHER, LabelSummary
from assaywatch.analyzers.label_tests import (
    MAX_DRAWS,
    MAX_NEW_LABELS,
    MIN_DRAWS,
    draws_for,
    label_table,
    label_test,
)

NAMES = [f"c{i:02d}" for i in range(32)]
WORLDS = {
    # a judge's correct / partial / incorrect
    "three": np.array([0.7, 0.2, 0.1]),
    # eight categories, two rare ones at 2% and 1%
    "eight": np.array([0.35, 0.25, 0.15, 0.10, 0.07, 0.05, 0.02, 0.01]),
    # safe / unsafe
    "two": np.array([0.95, 0.05]),
    # three common and thirteen rare (0.77%) labels: a 200-label baseline misses some
    # of them, which the candidate then shows as new labels
    "sixteen": np.array([0.5, 0.3, 0.1] + [0.1 / 13] * 13),
}
REPS = 400


def _summary(counts: np.ndarray) -> LabelSummary:
    return LabelSummary({NAMES[i]: int(v) for i, v in enumerate(counts)})


def _labels(rng: np.random.Generator, p: np.ndarray, n: int) -> list[str]:
    return [NAMES[i] for i in rng.choice(p.size, size=n, p=p)]


def _bound(alpha: float, reps: int) -> float:
    return alpha + 3.0 * math.sqrt(alpha * (1.0 - alpha) / reps)


@pytest.mark.parametrize(("world", "n_b", "n_c"),
                         [(w, b, c) for w, b, c in product(["three", "eight", "two"],
                                                           [200, 2_000], [50, 300])]
                         + [("sixteen", 200, 300), ("sixteen", 2_000, 300)])
def test_an_unchanged_candidate_is_flagged_at_most_alpha(world: str, n_b: int,
                                                         n_c: int) -> None:
    p = WORLDS[world]
    rng = np.random.default_rng(1_000 * n_b + n_c + len(p))
    ps = np.array([label_test("judge", _summary(rng.multinomial(n_b, p)),
                              _labels(rng, p, n_c)).p_value for _ in range(REPS)])
    for alpha in (0.05, 0.01):
        assert (ps <= alpha).mean() <= _bound(alpha, REPS), (alpha, (ps <= alpha).mean())
    # and not a test that never rejects: the p-values are spread over (0, 1]
    assert 0.3 < np.median(ps) < 0.8


def test_a_folded_baseline_is_flagged_at_most_alpha() -> None:
    """Twenty labels (17 rare, 1.8 % each): the baseline summary keeps 15 and folds the
    rest into "other"; the kept ones near the cut are merged back (FOLDED_MARGIN)."""
    p = np.array([0.4, 0.2, 0.1] + [0.3 / 17] * 17)
    rng = np.random.default_rng(20)
    ps, folded = [], 0
    for _ in range(REPS):
        s = _summary(rng.multinomial(200, p))
        r = label_test("judge", s, _labels(rng, p, 300))
        ps.append(r.p_value)
        folded += r.baseline_folded
    assert folded > 0.9 * REPS  # the case under test
    assert (np.array(ps) <= 0.05).mean() <= _bound(0.05, REPS)


def _shifted(p: np.ndarray, j: int, d: float) -> np.ndarray:
    """``d`` of probability moved onto category j, the others losing it in proportion."""
    q = p * (1.0 - (p[j] + d)) / (1.0 - p[j])
    q[j] = p[j] + d
    return q


def _noncentral_power(p: np.ndarray, q: np.ndarray, n_b: int, n_c: int,
                      alpha: float) -> float:
    """The chi-square test's power by the noncentral chi-square approximation:
    lambda = n_b n_c / N * sum (q - p)^2 / pbar, K - 1 degrees of freedom."""
    pbar = (n_b * p + n_c * q) / (n_b + n_c)
    lam = n_b * n_c / (n_b + n_c) * float(np.sum((q - p) ** 2 / pbar))
    df = p.size - 1
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam))


@pytest.mark.parametrize(("world", "j"), [("three", 2), ("eight", 7), ("two", 1)])
def test_a_shift_of_015_into_one_category_is_flagged(world: str, j: int) -> None:
    """1,000 baseline and 300 candidate labels, 0.15 of probability moved onto one
    category, judged at alpha / 3 (a gate of pass rate, fingerprint and labels): the
    noncentral approximation puts the power above 0.999 in each world (lambda 45, 160
    and 48); we ask for 80 %."""
    p, alpha = WORLDS[world], 0.05 / 3
    q = _shifted(p, j, 0.15)
    assert _noncentral_power(p, q, 1_000, 300, alpha) > 0.999
    rng = np.random.default_rng(7 + j)
    reps, hits = 100, 0
    for _ in range(reps):
        r = label_test("judge", _summary(rng.multinomial(1_000, p)), _labels(rng, q, 300),
                       level=alpha)
        hits += r.p_value < alpha
        assert r.gained[0] == NAMES[j] or r.p_value >= alpha
    assert hits >= 0.8 * reps, hits


@pytest.mark.parametrize(("world", "j", "d"), [("three", 2, 0.05), ("eight", 7, 0.03)])
def test_power_at_a_small_shift_matches_the_noncentral_approximation(world: str, j: int,
                                                                     d: float) -> None:
    """Where the power is neither 0 nor 1 (0.57 and 0.73 by the approximation), the
    measured one agrees within 3 Monte Carlo standard errors (0.075 at 400 repetitions)
    plus 0.05 for the approximation (asymptotic, and rough for a 1 % category)."""
    p = WORLDS[world]
    q = _shifted(p, j, d)
    expected = _noncentral_power(p, q, 1_000, 300, 0.05)
    rng = np.random.default_rng(31 + j)
    hits = sum(label_test("judge", _summary(rng.multinomial(1_000, p)),
                          _labels(rng, q, 300)).p_value < 0.05 for _ in range(REPS))
    assert abs(hits / REPS - expected) <= 3 * math.sqrt(expected * (1 - expected) / REPS) + 0.05


def _exact_p(b: list[int], c: list[int]) -> float:
    """The exact conditional p-value of Pearson's chi-square by enumerating every table
    with the same margins (2 x 3 at most)."""
    t = np.array(b) + np.array(c)
    n_c, n = sum(c), int(t.sum())

    def chi(x: np.ndarray) -> float:
        e = n_c * t / n
        return float(((x - e) ** 2 / t).sum())

    obs, total = chi(np.array(c, dtype=float)), 0.0
    for x0 in range(min(t[0], n_c) + 1):
        rest = n_c - x0
        for x1 in range(min(t[1], rest) + 1):
            x2 = rest - x1
            if len(t) == 2 and x2 != 0 or len(t) == 3 and not 0 <= x2 <= t[2]:
                continue
            x = np.array([x0, x1, x2][:len(t)], dtype=float)
            pmf = math.prod(math.comb(int(t[k]), int(x[k])) for k in range(len(t)))
            if chi(x) >= obs * (1 - 1e-9):
                total += pmf / math.comb(n, n_c)
    return total


@pytest.mark.parametrize(("b", "c"), [([180, 20], [36, 14]),      # 2 categories
                                      ([140, 40, 20], [20, 10, 10]),
                                      ([95, 4, 1], [40, 5, 5])])   # lumpy, rare cells
def test_the_monte_carlo_p_value_matches_the_exact_conditional_one(b: list[int],
                                                                   c: list[int]) -> None:
    names = NAMES[:len(b)]
    s = LabelSummary(dict(zip(names, b, strict=True)))
    cand = [k for k, v in zip(names, c, strict=True) for _ in range(v)]
    r = label_test("judge", s, cand, draws=200_000)
    exact = _exact_p(b, c)
    assert 1e-4 < exact < 0.5
    # Besag-Clifford stops after 50 exceedances: relative error about 1 / sqrt(50) = 0.14;
    # 4 of those, or 4 binomial standard errors when all draws were used
    sd = exact / math.sqrt(50) if r.draws < 200_000 else math.sqrt(exact / 200_000)
    assert abs(r.p_value - exact) <= 4 * sd, (r.p_value, exact, r.draws)


def test_the_table_keeps_new_labels_apart_and_folds_only_past_the_cap() -> None:
    s = LabelSummary({"correct": 70, "partial": 20, "incorrect": 10})
    cols, b, c, folded, baseline_folded = label_table(
        s, ["correct"] * 5 + ["refused"] * 3 + ["other"] * 2 + [None])
    assert cols == ("correct", "incorrect", "partial", OTHER, "refused")
    assert b == [70, 10, 20, 0, 0] and c == [5, 0, 0, 2, 3]
    assert folded == 0 and not baseline_folded
    many = [f"new{i:02d}" for i in range(MAX_NEW_LABELS + 3)]
    cols, b, c, folded, _ = label_table(s, many + many[:MAX_NEW_LABELS])
    assert len(cols) == 4 + MAX_NEW_LABELS and folded == 3  # the 3 least frequent
    assert c[cols.index(OTHER)] == 3 and sum(c) == len(many) + MAX_NEW_LABELS


def test_a_folded_baseline_sends_unknown_labels_to_other() -> None:
    counts = {f"l{i:02d}": 100 - 2 * i for i in range(MAX_LABELS + 4)}  # 20 named labels
    s = LabelSummary(counts)
    assert len(s.counts) == MAX_LABELS and s.counts[OTHER] > 0
    cols, b, c, folded, baseline_folded = label_table(s, ["l00", "l19", "brand-new"])
    assert baseline_folded and "brand-new" not in cols and "l19" not in cols
    # kept labels with counts below 2 x 72 + 10 are merged: none of 100..72 remain named
    assert cols == (OTHER,) and b == [s.n] and c == [3] and folded == 3


def test_gained_names_the_category_that_rose_most() -> None:
    s = LabelSummary({"correct": 140, "partial": 40, "incorrect": 20})
    r = label_test("correctness", s, ["correct"] * 30 + ["partial"] * 10 + ["refused"] * 20)
    assert r.gained == ("refused", 0.0, 1 / 3)
    assert r.new_labels == ("refused",) and r.n_b == 200 and r.n_c == 60
    assert r.p_value < 0.001
    # seeded from the data: the same inputs give the same p-value and draws
    again = label_test("correctness", s, ["correct"] * 30 + ["partial"] * 10
                       + ["refused"] * 20)
    assert (again.p_value, again.draws) == (r.p_value, r.draws)


def test_an_identical_candidate_has_p_one_and_stops_early() -> None:
    s = LabelSummary({"a": 60, "b": 30, "c": 10})
    r = label_test("e", s, ["a"] * 6 + ["b"] * 3 + ["c"])
    assert r.statistic == pytest.approx(0.0, abs=1e-12)
    assert r.p_value == pytest.approx(1.0, abs=0.05) and r.draws < 100
    only = label_test("e", LabelSummary({"a": 5}), ["a"] * 10)
    assert only.p_value == 1.0 and only.draws == 0


def test_bad_input_is_a_clear_error() -> None:
    s = LabelSummary({"a": 5, "b": 5})
    with pytest.raises(ValueError, match="candidate has no labels"):
        label_test("judge", s, [None])
    with pytest.raises(ValueError, match="baseline has no labels"):
        label_test("judge", LabelSummary({}), ["a"])
    with pytest.raises(ValueError, match="level"):
        draws_for(0.0)
    with pytest.raises(ValueError, match="draws"):
        label_test("judge", s, ["a"], draws=0)


def test_draws_follow_the_level() -> None:
    assert draws_for(0.05) == MIN_DRAWS == 3_999
    assert draws_for(0.05 / 10) == 39_999
    assert draws_for(1e-6) == MAX_DRAWS
