"""The gate's tests on graded evaluation scores (analyzers/score_tests.py) and the offline
gate deciding on them (monitor/offline/gate.py).

Error rates are measured on realistic score distributions, with the baseline re-drawn for
every repetition (learned baselines averaged over their sampling distribution):

* ``lumpy``: a judge's 0-1 helpfulness, 40% exactly 1.0, the rest uniform on [0.4, 1);
* ``rubric``: a 1-5 rubric, probabilities (0.05, 0.10, 0.20, 0.35, 0.30);
* ``beta``: a smooth Beta(8, 2) score, the Gaussian-like second case.

A regression of "the configured minimum" lowers the mean by 0.1 of the scale: in the
lumpy score a quarter of the answers at 1.0 and 2/9 of the others fall to the bottom
level 0.4 (-0.06 - 0.04); the rubric's probabilities become (0.05, 0.20, 0.30, 0.25,
0.20) (mean 3.75 -> 3.35, -0.4 of the 4-point scale); the Beta score is shifted down by
0.1 and clipped at 0 (a hair less than 0.1 at the clip).

Monte Carlo error: with 1,000 repetitions a rate of 0.05 has a standard error of 0.007; the
assertions allow three of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from assaywatch.analyzers.baseline import build_baseline
from assaywatch.analyzers.detectors.score import ScoreSummary
from assaywatch.analyzers.model import Outcome
from assaywatch.analyzers.score_tests import SequentialScoreTest, score_verdict
from assaywatch.monitor.offline.gate import GatePolicy, decide
from tests.analyzers.simagent import simulate_runs

Draw = Callable[[np.random.Generator, tuple[int, ...], bool], np.ndarray]


def lumpy(rng: np.random.Generator, shape: tuple[int, ...], regressed: bool) -> np.ndarray:
    top = rng.random(shape) < 0.4
    x = np.where(top, 1.0, 0.4 + 0.6 * rng.random(shape))
    if regressed:  # answers judged worse fall to the bottom level 0.4: mean -0.1
        x = np.where(top & (rng.random(shape) < 0.25), 0.4, x)  # 0.1 of all, -0.6: -0.06
        x = np.where(~top & (rng.random(shape) < 2 / 9), 0.4, x)  # 0.6 * 2/9, -0.3: -0.04
    return x


RUBRIC_P = np.array([0.05, 0.10, 0.20, 0.35, 0.30])
RUBRIC_REG = np.array([0.05, 0.20, 0.30, 0.25, 0.20])  # mean 3.75 -> 3.35: -0.4 = -0.1 of 4


def rubric(rng: np.random.Generator, shape: tuple[int, ...], regressed: bool) -> np.ndarray:
    p = RUBRIC_REG if regressed else RUBRIC_P
    return rng.choice(np.arange(1.0, 6.0), size=shape, p=p)


def beta(rng: np.random.Generator, shape: tuple[int, ...], regressed: bool) -> np.ndarray:
    x = rng.beta(8.0, 2.0, shape)
    return np.clip(x - 0.1, 0.0, 1.0) if regressed else x


DISTS: dict[str, Draw] = {"lumpy": lumpy, "rubric": rubric, "beta": beta}


def test_the_regressions_are_a_drop_of_a_tenth_of_the_scale() -> None:
    rng = np.random.default_rng(1)
    for name, draw, scale in (("lumpy", lumpy, 1.0), ("rubric", rubric, 4.0),
                              ("beta", beta, 1.0)):
        before = draw(rng, (200_000,), False).mean()
        after = draw(rng, (200_000,), True).mean()
        assert 0.098 <= (before - after) / scale <= 0.102, name


@pytest.mark.parametrize("name", sorted(DISTS))
def test_fixed_n_errors_hold_on_realistic_scores(name: str) -> None:
    """alpha = 0.05, beta = 0.1, drop 0.1: an unchanged candidate is found worse in <= 5%
    of repetitions; a regressed one passes non-inferiority in <= 10%."""
    draw = DISTS[name]
    rng = np.random.default_rng(20261202)
    reps, n_b, n_c = 1_000, 300, 150
    false_drop = wrong_pass = 0
    for _ in range(reps):
        base = ScoreSummary.from_scores(draw(rng, (n_b,), False),
                                        (1.0, 5.0) if name == "rubric" else (0.0, 1.0))
        same = score_verdict("e", base, draw(rng, (n_c,), False), 0.1)
        false_drop += same.p_value < 0.05
        worse = score_verdict("e", base, draw(rng, (n_c,), True), 0.1)
        wrong_pass += worse.ni_p_value < 0.1
    assert false_drop / reps <= 0.05 + 3 * 0.007
    assert wrong_pass / reps <= 0.10 + 3 * 0.0095


@pytest.mark.parametrize("calibrated", [False, True], ids=["anytime", "calibrated"])
@pytest.mark.parametrize("name", sorted(DISTS))
def test_sequential_errors_hold_and_it_decides_early(name: str, calibrated: bool) -> None:
    """Over 400 candidate scores, anytime-valid and calibrated to the 400-score horizon:
    an unchanged candidate fails in <= alpha, a regressed one passes in <= beta, baselines
    of 300 scores re-drawn 40 times (25 candidates each); both decide in most repetitions,
    in well under 400 scores."""
    draw = DISTS[name]
    rng = np.random.default_rng(7)
    fails = passes_regressed = 0
    spent: list[float] = []
    undecided = 0
    reps = 0
    for i in range(40):
        base = ScoreSummary.from_scores(draw(rng, (300,), False),
                                        (1.0, 5.0) if name == "rubric" else (0.0, 1.0))
        test = SequentialScoreTest("e", base, alpha=0.05, beta=0.1, drop=0.1)
        if calibrated:
            test.calibrate(400, reps=1_000, boots=50, seed=i)
        out, n = test.simulate(draw(rng, (25, 400), False))
        fails += int((out == 1).sum())
        undecided += int((out == 0).sum())
        spent.extend(n.tolist())
        out_r, _ = test.simulate(draw(rng, (25, 400), True))
        passes_regressed += int((out_r == -1).sum())
        reps += 25
    assert fails / reps <= 0.05 + 3 * 0.007
    assert passes_regressed / reps <= 0.10 + 3 * 0.0095
    assert undecided / reps < 0.05
    assert float(np.median(spent)) < 150


def test_sequential_update_matches_its_vectorised_simulation() -> None:
    rng = np.random.default_rng(3)
    base = ScoreSummary.from_scores(lumpy(rng, (300,), False))
    draws = lumpy(rng, (20, 300), True)
    out, n = SequentialScoreTest("e", base).simulate(draws)
    for row, o, k in zip(draws, out, n, strict=True):
        t = SequentialScoreTest("e", base)
        for x in row:
            t.update(float(x))
        assert t.n == k
        assert {1: "fail", -1: "pass", 0: None}[int(o)] == (t.decision.value if t.decision
                                                            else None)


def _runs(rng: np.random.Generator, n: int, regressed: bool) -> list:
    runs = simulate_runs(n, rng, pass_rate=0.9)
    for r, s in zip(runs, lumpy(rng, (n,), regressed), strict=True):
        r.scores = {"helpfulness": float(s)}
    return runs


def test_gate_deploys_an_unchanged_candidate_and_blocks_a_score_drop() -> None:
    rng = np.random.default_rng(11)
    base_runs = _runs(rng, 500, False)
    base = build_baseline(base_runs)
    assert base.evaluators["helpfulness"].n == 500
    policy = GatePolicy()
    same = decide([base], _runs(rng, 300, False), policy)
    (sr,) = same.streams
    ev = next(t for t in sr.tests if t.name == "evaluation:helpfulness")
    assert ev.verdict == "pass", ev.message
    assert same.decision == "deploy", same.reason
    worse_runs = _runs(rng, 300, True)
    assert sum(r.outcome is Outcome.PASS for r in worse_runs) / 300 > 0.85  # pass rate kept
    worse = decide([base], worse_runs, policy)
    assert worse.decision == "block" and worse.exit_code == 1
    assert worse.reason == "evaluation score regression in support-agent/refund (helpfulness)"
    (sr,) = worse.streams
    assert next(t for t in sr.tests if t.name == "pass_rate").verdict != "fail"


def test_kl_inf_of_a_two_point_law_is_the_bernoulli_divergence() -> None:
    """For a law on {0, 1} the closest law on [0, 1] with another mean is the Bernoulli
    with that mean: KL(Ber(0.9) || Ber(0.8)) = 0.9 ln(9/8) + 0.1 ln(1/2) = 0.036690 and
    KL(Ber(0.8) || Ber(0.9)) = 0.8 ln(8/9) + 0.2 ln 2 = -0.094226 + 0.138629 = 0.044403."""
    from assaywatch.analyzers.score_tests import kl_inf

    x = np.array([0.0, 1.0])
    assert kl_inf(x, np.array([0.1, 0.9]), 0.8) == pytest.approx(0.036690, abs=2e-6)
    assert kl_inf(x, np.array([0.2, 0.8]), 0.9, below=False) == pytest.approx(0.044403,
                                                                              abs=2e-6)
    assert kl_inf(x, np.array([0.1, 0.9]), 0.95) == 0.0  # already below


def test_the_rubric_scale_bottom_bounds_how_far_a_law_can_move() -> None:
    """On a 1-5 scale, a law at 5 moved to mean 4.6 can at best put 0.1 of its mass at 1
    (0.1 * 4 = 0.4): KL(delta_5 || 0.9 delta_5 + 0.1 delta_1) = ln(1 / 0.9) = 0.105361."""
    from assaywatch.analyzers.score_tests import kl_inf

    got = kl_inf(np.array([5.0]), np.array([1.0]), 4.6, lo=1.0, hi=5.0)
    assert got == pytest.approx(math.log(1 / 0.9), abs=2e-6)


def test_walds_bound_for_the_pass_rate_sprt() -> None:
    """Any test passing p = 0.9 with probability 0.95 while passing p = 0.8 at most 10% of
    the time needs on average (0.95 ln 9.5 + 0.05 ln(0.05 / 0.9)) / 0.036690 = 54.35
    runs at p = 0.9; README's SPRT spends 56.9 there (bench_sprt)."""
    from assaywatch.analyzers.score_tests import kl_inf, min_expected_n

    kl = kl_inf(np.array([0.0, 1.0]), np.array([0.1, 0.9]), 0.8)
    assert min_expected_n(kl, 0.95, 0.10) == pytest.approx(54.35, abs=0.05)
