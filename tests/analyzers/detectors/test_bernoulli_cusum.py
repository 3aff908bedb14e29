"""Bernoulli CUSUM: exact Markov-chain calibration, ARL0, delay vs the oracle, baselines."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.detectors import (
    BernoulliCUSUM,
    alarm_rate_arl,
    bernoulli_cusum_arl,
    bernoulli_cusum_threshold,
    bernoulli_lattice,
    first_alarm_times,
)


def _bern(p: float):  # noqa: ANN202 - sampler for the simulation helpers
    return lambda rng, shape: rng.random(shape) < p


def _float_cusum_first_alarm(
    p_true: float, p0: float, p1: float, h: float, reps: int, rng: np.random.Generator
) -> np.ndarray:
    """Independent oracle: the textbook float LR CUSUM (no lattice), fresh starts."""
    a, b = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))
    s = np.zeros(reps)
    times = np.zeros(reps, dtype=np.int64)
    open_ = np.ones(reps, dtype=bool)
    t = 0
    while open_.any():
        t += 1
        s = np.maximum(0.0, s + np.where(rng.random(reps) < p_true, a, b))
        hit = open_ & (s >= h)
        times[hit] = t
        open_ &= ~hit
    return times


def test_lattice_matches_the_llr_ratio_and_scale() -> None:
    unit, down, up = bernoulli_lattice(0.9, 0.8)
    a, b = math.log(0.8 / 0.9), math.log(0.2 / 0.1)
    assert down * unit == pytest.approx(a, rel=1e-12)  # the smaller step is exact
    assert up * unit == pytest.approx(b, rel=2e-3)  # the other within 0.2 %


def test_spec_reference_thresholds_and_delays() -> None:
    """SPEC.md (simulated): h = 5.64 / 3.42 for ARL0 10^4 / 10^3, delays 110 / 62 runs.

    Our thresholds are exact for the lattice chart; the SPEC's come from a simulation with
    its own Monte Carlo error, so h is compared within 0.05 nats (1 % of h) and the
    delays within 3 %.
    """
    h4 = bernoulli_cusum_threshold(0.9, 0.8, 10_000)
    h3 = bernoulli_cusum_threshold(0.9, 0.8, 1_000)
    assert h4 == pytest.approx(5.64, abs=0.05)
    assert h3 == pytest.approx(3.42, abs=0.05)
    assert bernoulli_cusum_arl(0.8, 0.9, 0.8, h4) == pytest.approx(110, rel=0.03)
    assert bernoulli_cusum_arl(0.8, 0.9, 0.8, h3) == pytest.approx(62, rel=0.03)
    # smallest lattice threshold meeting the target: one lattice unit less falls short
    unit = bernoulli_lattice(0.9, 0.8)[0]
    assert bernoulli_cusum_arl(0.9, 0.9, 0.8, h4) >= 10_000
    assert bernoulli_cusum_arl(0.9, 0.9, 0.8, h4 - unit) < 10_000


def test_markov_chain_arl_matches_simulation_of_the_detector() -> None:
    det = BernoulliCUSUM(0.9, 0.8, arl0=2_000)
    exact0 = bernoulli_cusum_arl(0.9, 0.9, 0.8, det.threshold)
    exact1 = bernoulli_cusum_arl(0.8, 0.9, 0.8, det.threshold)
    rng = np.random.default_rng(20)
    arl0, alarms = alarm_rate_arl(det, _bern(0.9), 500, 8_000, rng)
    # ~2000 alarms: renewal estimate's relative SE ~ 1/sqrt(2000) = 2.2 %; allow 4 SE
    assert alarms > 1_500
    assert arl0 == pytest.approx(exact0, rel=0.09)
    delays = first_alarm_times(det, _bern(0.8), 4_000, 3_000, rng)
    # delay sd ~ mean / 1.5 here; SE of the mean over 4000 ~ 0.9 %: allow 4 SE
    assert delays.mean() == pytest.approx(exact1, rel=0.04)


def test_in_control_arl0_at_ten_thousand_within_20_percent_of_target() -> None:
    det = BernoulliCUSUM(0.9, delta=0.1, arl0=10_000)
    rng = np.random.default_rng(21)
    arl0, alarms = alarm_rate_arl(det, _bern(0.9), 400, 25_000, rng, chunk=2_500)
    # 10^7 runs, ~1000 alarms: relative SE ~ 3.2 %, so 20 % is > 6 SE
    assert alarms > 600
    assert arl0 == pytest.approx(10_000, rel=0.20)


def test_delay_matches_the_independent_float_oracle_and_beats_misspecified_designs() -> None:
    """With p0 known the detector is the LR CUSUM (Lorden/Moustakides optimal)."""
    h = bernoulli_cusum_threshold(0.9, 0.8, 10_000)
    ours = bernoulli_cusum_arl(0.8, 0.9, 0.8, h)
    oracle = _float_cusum_first_alarm(0.8, 0.9, 0.8, h, 3_000, np.random.default_rng(22))
    # oracle mean over 3000 fresh starts: SE ~ 1 %; the 1.1x bound of the brief
    assert ours <= 1.1 * oracle.mean()
    assert ours >= 0.95 * oracle.mean()
    report = []
    for design_p1 in (0.85, 0.7):  # designed for a smaller / larger drop than the real one
        h_mis = bernoulli_cusum_threshold(0.9, design_p1, 10_000)
        assert bernoulli_cusum_arl(0.9, 0.9, design_p1, h_mis) >= 10_000
        delay = bernoulli_cusum_arl(0.8, 0.9, design_p1, h_mis)
        report.append((design_p1, delay / ours))
        # exact chains on both sides: the oracle is never beaten (1 % lattice slack)
        assert delay >= 0.99 * ours
    print("misspecified design p1 -> delay ratio vs oracle:", report)


def test_arl_is_monotone_in_the_true_pass_rate() -> None:
    """The premise of the exact posterior-quantile calibration."""
    h = bernoulli_cusum_threshold(0.9, 0.8, 10_000)
    rates = np.linspace(0.75, 0.97, 23)
    arls = [bernoulli_cusum_arl(p, 0.9, 0.8, h) for p in rates]
    assert all(x < y for x, y in zip(arls, arls[1:], strict=False))


def test_posterior_quantile_equals_brute_force_posterior_simulation() -> None:
    """h from the monotone-quantile shortcut vs drawing p0 from the posterior."""
    n, x = 200, 180
    h = bernoulli_cusum_threshold(0.9, 0.8, 10_000, baseline_runs=n, baseline_passes=x)
    draws = stats.beta(x + 0.5, n - x + 0.5).rvs(2_000, random_state=np.random.default_rng(23))
    ok = np.mean([bernoulli_cusum_arl(p, 0.9, 0.8, h) >= 10_000 for p in draws[:400]])
    # 400 draws: SE of a 0.9 fraction is 1.5 %; allow 3 SE
    assert ok == pytest.approx(0.9, abs=0.045)
    assert h > bernoulli_cusum_threshold(0.9, 0.8, 10_000)  # estimation costs threshold


@pytest.mark.slow
@pytest.mark.parametrize(("n_base", "max_penalty"), [(200, 4.0), (2_000, 1.5)])
def test_estimated_baseline_keeps_arl0_with_90_percent_probability(
    n_base: int, max_penalty: float
) -> None:
    """Draw true p0, draw a baseline, calibrate on the plug-in, score the exact ARL0."""
    rng = np.random.default_rng(24 + n_base)
    n_draws = 200
    true_p = rng.uniform(0.85, 0.95, n_draws)
    passes = rng.binomial(n_base, true_p)
    met, penalties = 0, []
    for p, x in zip(true_p, passes, strict=True):
        p_hat = x / n_base
        h = bernoulli_cusum_threshold(p_hat, p_hat - 0.1, 10_000, n_base, int(x), 0.9)
        met += bernoulli_cusum_arl(p, p_hat, p_hat - 0.1, h) >= 10_000
    # Bayesian coverage is exact under a uniform prior and nearly so under Jeffreys; 200
    # draws give a SE of 2.1 % around 0.9: allow 2.5 SE below
    assert met / n_draws >= 0.85
    for x in rng.binomial(n_base, 0.9, 60):  # delay penalty at the reference p0 = 0.9
        p_hat = x / n_base
        h = bernoulli_cusum_threshold(p_hat, p_hat - 0.1, 10_000, n_base, int(x), 0.9)
        penalties.append(bernoulli_cusum_arl(0.8, p_hat, p_hat - 0.1, h))
    oracle = bernoulli_cusum_arl(0.8, 0.9, 0.8, bernoulli_cusum_threshold(0.9, 0.8, 10_000))
    ratio = float(np.mean(penalties)) / oracle
    print(f"baseline {n_base}: coverage {met / n_draws:.3f}, delay penalty {ratio:.2f}x")
    assert 1.0 < ratio <= max_penalty


def test_calibration_is_fast_enough_for_baseline_freezes() -> None:
    t0 = time.perf_counter()
    for x in (171, 173, 177):  # uncached inputs
        bernoulli_cusum_threshold(x / 190, x / 190 - 0.1, 10_000, 190, x, 0.9)
    per_call = (time.perf_counter() - t0) / 3
    assert per_call < 0.5  # target 200 ms on an idle core; CI runners are shared


def test_constructor_validates_arguments() -> None:
    with pytest.raises(ValueError, match="from_baseline"):
        BernoulliCUSUM(1.0)
    with pytest.raises(ValueError, match="delta"):
        BernoulliCUSUM(0.05, delta=0.1)
    with pytest.raises(ValueError, match="both"):
        bernoulli_cusum_threshold(0.9, 0.8, 1_000, baseline_runs=10)
    with pytest.raises(ValueError, match="pass"):
        BernoulliCUSUM(0.9).update(2)
    # an all-pass baseline: p0 inside (0, 1); (50 runs no longer suffice for ARL0 10,000
    # at the Clopper-Pearson bound 0.1 ** (1 / 50) = 0.955 with p1 = p0 - 0.1)
    det = BernoulliCUSUM.from_baseline(runs=100, passes=100)
    assert 0.99 < det.p0 < 1.0 and det.threshold > 0


def test_larger_baselines_give_smaller_thresholds() -> None:
    hs = [
        bernoulli_cusum_threshold(0.9, 0.8, 10_000, n, int(0.9 * n)) for n in (200, 1_000, 10_000)
    ]
    assert hs[0] > hs[1] > hs[2] > bernoulli_cusum_threshold(0.9, 0.8, 10_000)


# -- the monitor's pass-rate chart over the baselines it could have learned (exact) --------
CONF, DELTA, ARL = 0.95, 0.1, 1_000.0  # a half share of arl0 500 at confidence 0.9


def _rates_over_baselines(n: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """(probability, in-control alarm rate at the true p) of every baseline of n runs with
    a probability above 1e-9, through the monitor's calibration (``bootstrap._pass_rate``:
    Clopper-Pearson bound, design rate chosen on its grid)."""
    from assaywatch.analyzers.detectors.bootstrap import _pass_rate_exact

    xs = np.arange(n + 1)
    w = stats.binom.pmf(xs, n, p)
    keep = w > 1e-9
    rates = []
    for x in xs[keep]:
        out = _pass_rate_exact(int(x), int(n - x), DELTA, ARL, CONF)
        assert not isinstance(out, str), out
        h, p0 = out
        rates.append(1.0 / bernoulli_cusum_arl(p, p0, p0 - DELTA, h))
    return w[keep], np.array(rates)


@pytest.mark.slow
@pytest.mark.parametrize("p", [0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.95])
def test_arl0_holds_with_the_stated_confidence_over_baselines(p: float) -> None:
    """Exact, not simulated: the probability, over the 200-run baselines of an agent whose
    pass rate is p, that the chart's true in-control ARL falls under its target is at most
    1 - 0.95 (the Jeffreys posterior quantile used before missed 0.037-0.062 on this grid:
    0.057 at p = 0.9, 0.062 at 0.95)."""
    w, rates = _rates_over_baselines(200, p)
    assert w[rates > 1.0 / ARL].sum() <= 1.0 - CONF


def _top_decile(w: np.ndarray, rates: np.ndarray) -> float:
    """Share of the mean alarm rate held by the top 10% of baselines (by probability)."""
    order = np.argsort(-rates)
    left, top = 0.1, 0.0
    for i in order:
        take = min(w[i], left)
        top += take * rates[i]
        left -= take
        if left <= 0:
            break
    return float(top / (w * rates).sum())


@pytest.mark.slow
def test_pass_rate_alarms_spread_over_streams_of_2000_run_baselines() -> None:
    """Streams differ only by their baseline's luck. With 2,000-run baselines the 10% of
    streams with the most optimistic baselines carry at most a quarter of the pass-rate
    chart's false alarms (exactly: 0.2 where equal rates give 0.1)."""
    w, rates = _rates_over_baselines(2_000, 0.9)
    assert _top_decile(w, rates) <= 0.25


@pytest.mark.xfail(reason="exact: with 200-run baselines the top decile of streams carries "
                   "0.59 of the pass-rate chart's false alarms (0.61 at p = 0.8): the "
                   "quantile guarantee puts the median baseline's ARL at 22x its target and "
                   "the mean at 5.4x; measured 0.68 over 40 streams (bench_decile), where "
                   "the fingerprint chart's is 0.24; 0.35 with 500-run baselines, 0.25 "
                   "with 1,000 (bench_decile's exact table)", strict=True)
def test_pass_rate_alarms_spread_over_streams_of_200_run_baselines() -> None:
    w, rates = _rates_over_baselines(200, 0.9)
    assert _top_decile(w, rates) <= 0.25
