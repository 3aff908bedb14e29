"""The gate's tests on graded evaluation scores (analyzers/score_tests.py) and the offline
gate deciding on them (monitor/offline/gate.py).

Error rates are measured on realistic score distributions, with the baseline re-drawn for
every repetition (learned baselines averaged over their sampling distribution):

* ``lumpy``: a judge's 0-1 helpfulness, 40% exactly 1.0, the rest uniform on [0.4, 1);
* ``rubric``: a 1-5 rubric, probabilities (0.05, 0.10, 0.20, 0.35, 0.30);
* ``beta``: a smooth Beta(8, 2) score, the Gaussian-like second case;
* ``hq``: a high-quality agent's judge, 70% exactly 1.0, the rest uniform on [0.4, 1)
  (mean 0.91), whose regression is a collapse: 0.1 / (0.91 - 0.4) = 19.6% of all answers
  fall to the bottom level 0.4 (mean -0.1), the 1.0s that remain staying 1.0.

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


HQ_MEAN = 0.7 + 0.3 * 0.7


def hq(rng: np.random.Generator, shape: tuple[int, ...], regressed: bool) -> np.ndarray:
    x = np.where(rng.random(shape) < 0.7, 1.0, 0.4 + 0.6 * rng.random(shape))
    if regressed:  # a share of all answers collapses to the bottom level 0.4: mean -0.1
        x = np.where(rng.random(shape) < 0.1 / (HQ_MEAN - 0.4), 0.4, x)
    return x


DISTS: dict[str, Draw] = {"lumpy": lumpy, "rubric": rubric, "beta": beta}


def test_the_regressions_are_a_drop_of_a_tenth_of_the_scale() -> None:
    rng = np.random.default_rng(1)
    for name, draw, scale in (("lumpy", lumpy, 1.0), ("rubric", rubric, 4.0),
                              ("beta", beta, 1.0), ("hq", hq, 1.0)):
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


@pytest.mark.parametrize("name,calibrated", [("lumpy", False), ("hq", True)])
def test_sequential_update_matches_its_vectorised_simulation(name: str,
                                                             calibrated: bool) -> None:
    """Run by run (what gate --run does) and vectorised (what calibrate and the benchmark
    use): the same decision after the same number of scores, on every replicate."""
    draw = {"lumpy": lumpy, "hq": hq}[name]
    rng = np.random.default_rng(3)
    base = ScoreSummary.from_scores(draw(rng, (300,), False))
    draws = draw(rng, (20, 300), True)
    test = SequentialScoreTest("e", base)
    if calibrated:
        test.calibrate(300, reps=500, boots=25)
    out, n = test.simulate(draws)
    assert (out != 0).sum() >= 15  # the comparison is about decisions
    for row, o, k in zip(draws, out, n, strict=True):
        t = SequentialScoreTest("e", base)
        t.h_fail, t.h_pass = test.h_fail, test.h_pass
        for x in row:
            t.update(float(x))
        assert t.n == k
        assert {1: "fail", -1: "pass", 0: None}[int(o)] == (t.decision.value if t.decision
                                                            else None)


def _growth(bet: float, y: np.ndarray, centre: float) -> float:
    return float(np.mean(np.log1p(bet * (centre - y))))


def test_each_shape_of_drop_gets_its_own_regression_bet() -> None:
    """The high-quality judge's regression is a collapse (module docstring). The bet
    designed for a clean shift expects no score above 0.9 and bets big; on the collapse
    70% of the scores stay 1.0 and each costs it a factor 1 - lam (1 - m_lo): it loses
    money. The bet designed for the collapse grows, within 5% of the best growth any bet
    can reach at that centre (``kl_inf``, the dual of the divergence)."""
    from assaywatch.analyzers.score_tests import kl_inf

    rng = np.random.default_rng(5)
    t = SequentialScoreTest("e", ScoreSummary.from_scores(hq(rng, (400,), False)))
    y = hq(rng, (200_000,), True)
    shift, collapse = t.lams_fail
    assert shift > 3 * collapse
    assert _growth(shift, y, t.m_lo) < 0 < _growth(collapse, y, t.m_lo)
    best = kl_inf(y, np.full(y.size, 1.0 / y.size), t.m_lo, below=False)
    assert max(_growth(b, y, t.m_lo) for b in t.bets_fail) >= 0.95 * best


def test_shape_designed_bets_fail_a_collapse_sooner_at_the_same_error_rates() -> None:
    """Against the same test with only the shift-designed bets (half, once, twice it,
    equal weights: the design before issue 16), both calibrated to a 405-score horizon,
    on 12 baselines of 400 scores with 40 candidates per arm each (480 streams: standard
    errors 0.010 at 0.05, 0.014 at 0.1). On the collapse the shift-only test leaves over
    10% of the gates undecided at the horizon (its wide bets lose money, the narrow one
    grows slowly); the shape-designed one decides all but 1% and spends under half the
    scores. Neither error rate moves beyond alpha or beta + 3 standard errors."""
    rng = np.random.default_rng(16)
    spent: dict[str, list[np.ndarray]] = {"new": [], "shift": []}
    undecided = {"new": 0, "shift": 0}
    wrong_fail = wrong_pass = streams = 0
    for i in range(12):
        base = ScoreSummary.from_scores(hq(rng, (400,), False))
        new = SequentialScoreTest("e", base)
        old = SequentialScoreTest("e", base)
        old.bets_fail = np.minimum(old.lam_fail * np.array([0.5, 1.0, 2.0]),
                                   0.99 / (1.0 - old.m_lo))
        old.log_w_fail = np.log(np.full(3, 1 / 3))
        old.bets_pass = np.minimum(old.lam_pass * np.array([0.5, 1.0, 2.0]),
                                   0.99 / old.centre_pass)
        old.log_w_pass = np.log(np.full(3, 1 / 3))
        worse = hq(rng, (40, 405), True)
        for key, t in (("new", new), ("shift", old)):
            t.calibrate(405, reps=1_000, boots=50, seed=i)
            out, n = t.simulate(worse)
            spent[key].append(n)
            undecided[key] += int((out == 0).sum())
            if key == "new":
                wrong_pass += int((out == -1).sum())
                same, _ = t.simulate(hq(rng, (40, 405), False))
                wrong_fail += int((same == 1).sum())
        streams += 40
    mean = {k: float(np.concatenate(v).mean()) for k, v in spent.items()}
    assert undecided["shift"] / streams > 0.10
    assert undecided["new"] / streams < 0.01
    assert mean["new"] < 0.5 * mean["shift"]
    assert wrong_fail / streams <= 0.05 + 3 * 0.010
    assert wrong_pass / streams <= 0.10 + 3 * 0.014


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
