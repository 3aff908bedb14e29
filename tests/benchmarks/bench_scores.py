"""The graded-score e-CUSUM (``analyzers/detectors/score.py``) on realistic score worlds.

Run with ``python -m tests.benchmarks scores``. ``BENCH_SCORES_SCALE`` (default 1)
multiplies every repetition count; 0.25 gives a quick look. The eight (world, n_b) cases
run in two processes: about 4 minutes on two cores at scale 1 (the 4,800 calibrated
thresholds, ~0.05 s each, are about half of it).

Worlds, learned baselines and estimators are those of ``tests/realworld/test_score_rates.py``
(its docstring states them): (a) lumpy, 50 % at 1.0 plus a Beta, (b) ordinal 1-5 rubric,
(c) near-binary {0, 0.5, 1}, (d) Gaussian-like Beta(20, 5); a drop of 0.1 of the scale in
the mean; ``arl0 = 500``; every repetition learns its own baseline of ``n_b`` scores.

Per world, one row per baseline size:

* ``P(m0>mu)``: share of baselines whose lower confidence bound m0 is above the true mean
  (the detector states 0.05);
* ``ARL0 first``: censored-exponential estimate of the run length to the first false alarm
  (horizon 10 arl0; ``>x`` is the 95 % lower bound when no stream alarmed); ``ARL0 ren.``:
  scores per alarm onset with restarts; ``<tgt``: share of baselines whose own renewal
  ARL0 (over their streams) is below the target;
* steady-state delays (change after 200 in-control scores): the e-CUSUM; the oracle, Page's
  LLR CUSUM knowing both distributions, at the target ARL0 and at the e-CUSUM's measured
  first-alarm ARL0 (equal false-alarm rates), and the ratios;
* ``bit``: the pass/fail ``BernoulliCUSUM`` on ``score >= mid-scale``, learned from the same
  baselines (``from_baseline``, Jeffreys p0, threshold with ARL0 >= 500 with probability
  0.95 over baselines, the e-CUSUM's confidence), told the true drop of the pass rate (its most
  favourable design), run as the float LLR recursion at the detector's threshold; its
  measured ARL0 (first alarm, same estimator) beside it.

Per world, the **calibrated** threshold the monitor runs (``bootstrap.score_threshold``,
40 bootstrap baselines, per baseline with its own rng), 600 baselines per n_b at scale 1:

* in control: median h; the exact ARL0 of each baseline's detector under the world's law
  (``exact_arl``: the CUSUM's Markov chain, not a simulation), its median and 5 %
  quantile; ``<target``: share of baselines whose ARL0 is below the target (the
  calibration states at most 0.05) and its 95 % upper confidence bound (Clopper-Pearson);
  ``sim ARL0``: scores per alarm over one simulated stream of 10 arl0 per baseline, with
  ``pred.`` the same predicted by the exact ARL0s (the check of the exact figures);
* delays (two repetitions per baseline): zero start and steady state, ``FA<200``: share of
  steady-state repetitions with a false alarm in the 200 in-control scores (dropped), the
  ratios to the oracle at the target ARL0, the Lorden variant's steady delay and the
  calibrated one's speed-up over it, and ``bit``: the learned pass/fail BernoulliCUSUM
  (as above) on the same baselines, ``bit/e`` its delay over the calibrated e-CUSUM's (> 1:
  the graded score detects sooner than the bit).

A last line pools the share below target over the worlds per n_b.

Another table splits the Lorden e-CUSUM's delay: the detector as built; the same ``m0`` with the
bet ``lam*`` that maximises the expected log-growth under the *actual* post-change
distribution (what ``best_lambda``'s "shifted down by 0.1" alternative aims at); and the
baseline mean known (``m0`` = true mean, ``lam`` from ``best_lambda``), at ``arl0`` 500 and
the production 10,000, n_b = 1,000.
"""

from __future__ import annotations

import math
import os
import time
from functools import cache

import numpy as np
from scipy import stats
from scipy.optimize import minimize_scalar

from assaywatch.analyzers.detectors import BernoulliCUSUM
from assaywatch.analyzers.detectors.score import HIST_LEVELS, best_lambda
from tests.realworld.measure import lr_cusum_threshold
from tests.realworld.test_score_rates import (
    ARL0,
    HORIZON,
    KEYS,
    PREFIX,
    SEED,
    SHIFT,
    SIZES,
    WORLDS,
    Case,
    Delays,
    Learned,
    Sizes,
    World,
    learn,
    measure_cases,
    oracle_delay,
    run_delays,
    run_incontrol,
)

F64 = np.ndarray


def _scale(n: int, minimum: int = 2) -> int:
    return max(minimum, int(round(n * float(os.environ.get("BENCH_SCORES_SCALE", "1")))))


SIZES_BENCH = Sizes(coverage=_scale(50_000, 2_000), baselines=_scale(2_000, 200),
                    streams=5, delays=_scale(2_000, 200), oracle=_scale(10_000, 1_000),
                    calibrated=tuple((n_b, _scale(600, 60)) for n_b in SIZES),
                    calibrated_delays=2)


# -- the pass/fail bit ---------------------------------------------------------------------
@cache
def _bernoulli(n_b: int, passes: int, delta: float) -> tuple[float, float, float]:
    """(log-LR of a pass, of a fail, threshold) of the learned Bernoulli CUSUM."""
    det = BernoulliCUSUM.from_baseline(n_b, passes, delta=delta, arl0=ARL0, confidence=0.95)
    p0, p1 = det.p0, det.design_p1
    return math.log(p1 / p0), math.log((1 - p1) / (1 - p0)), det.threshold


class BitChart:
    """Float LLR recursion of one learned BernoulliCUSUM per column."""

    def __init__(self, world: World, n_b: int, passes: np.ndarray) -> None:
        delta = world.pass_rate() - world.pass_rate(True)
        rows = np.array([_bernoulli(n_b, int(k), delta) for k in passes])
        self.a, self.b, self.h = rows[:, 0], rows[:, 1], rows[:, 2]
        self.mid = (world.scale[0] + world.scale[1]) / 2

    def increments(self, x: F64) -> F64:
        return np.asarray(np.where(x >= self.mid, self.a, self.b), dtype=float)


def bit_figures(world: World, c: Case, streams: int, rng: np.random.Generator
                ) -> tuple[Delays, float]:
    chart = BitChart(world, c.n_b, c.delay_learned.passes)
    delays = run_delays(world, chart.increments, chart.h, chart.h.size, PREFIX, rng)
    inc_chart = BitChart(world, c.n_b, np.repeat(c.learned.passes, streams))
    inc = run_incontrol(world, inc_chart.increments, inc_chart.h, inc_chart.h.size, HORIZON,
                        streams, rng)
    return delays, inc.arl_first()


# -- splitting the delay -------------------------------------------------------------------
def _post_histogram(world: World, rng: np.random.Generator) -> tuple[F64, F64]:
    lo, hi = world.scale
    y = (world.sample(rng, (200_000,), changed=True) - lo) / (hi - lo)
    levels, counts = np.unique(np.rint(np.clip(y, 0, 1) * HIST_LEVELS), return_counts=True)
    return levels / HIST_LEVELS, counts / counts.sum()


def optimal_lam(m0: float, ys: F64, ps: F64) -> float:
    """argmax of sum p log(1 + lam (m0 - y)) on [0, 0.99 / (1 - m0)] (concave)."""
    top = 0.99 / max(1.0 - m0, 1e-3)
    res = minimize_scalar(lambda lam: -float(np.dot(ps, np.log1p(lam * (m0 - ys)))),
                          bounds=(0.0, top), method="bounded", options={"xatol": 1e-4})
    return float(res.x)


def split_row(name: str, n_b: int, arl0: float, reps: int, rng: np.random.Generator
              ) -> list[float]:
    world = WORLDS[name]
    det = learn(world, n_b, reps, rng, arl0=arl0)
    built = run_delays(world, det.increments, det.h, reps, PREFIX, rng)
    ys, ps = _post_histogram(world, rng)
    star = Learned(np.array([optimal_lam(m, ys, ps) for m in det.m0]), det.m0, det.h,
                   det.lo, det.hi, det.true_mean)
    best = run_delays(world, star.increments, star.h, reps, PREFIX, rng)
    mu = det.true_mean
    known = Learned(np.array([best_lambda(s, mu, SHIFT) for s in det.summaries]),
                    np.full(reps, mu), det.h, det.lo, det.hi, mu)
    kn = run_delays(world, known.increments, known.h, reps, PREFIX, rng)
    orc = oracle_delay(name, PREFIX, _scale(10_000, 1_000), rng, target=arl0)
    return [float(det.lam.mean()), float(star.lam.mean()), built.mean, best.mean, kn.mean,
            orc.mean]


# -- tables --------------------------------------------------------------------------------
def _arl(x: float, lower: float) -> str:
    return f">{lower:.0f}" if not math.isfinite(x) else f"{x:.0f}"


def bit_oracle(world: World, rng: np.random.Generator) -> Delays:
    """Page's LLR CUSUM on the bit knowing both pass rates, at the target ARL0."""
    p0, p1 = world.pass_rate(), world.pass_rate(True)
    mid = (world.scale[0] + world.scale[1]) / 2
    a, b = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))

    def inc(x: F64) -> F64:
        return np.asarray(np.where(x >= mid, a, b), dtype=float)

    h = lr_cusum_threshold(inc(world.sample(rng, (200_000,))), ARL0, rng)
    return run_delays(world, inc, h, SIZES_BENCH.oracle, PREFIX, rng)


def world_table(name: str, cases: dict[tuple[str, int], Case], rng: np.random.Generator
                ) -> list[str]:
    world = WORLDS[name]
    lo, hi = world.scale
    w = hi - lo
    head = (f"{world.name}: mean {(world.mean() - lo) / w:.3f} -> "
            f"{(world.mean(True) - lo) / w:.3f} of the scale [{lo:g}, {hi:g}]; pass rate "
            f"(score >= mid-scale) {world.pass_rate():.3f} -> {world.pass_rate(True):.3f}")
    inc_rows = [f"{'n_b':>7}{'target':>8}{'P(m0>mu)':>10}{'ARL0 1st':>10}{'ARL0 ren.':>11}"
                f"{'<target':>9}{'P(T<=500)':>11}{'bit ARL0 1st':>14}"]
    del_rows = [f"{'n_b':>7}{'e-CUSUM':>9}{'(zero)':>8}{'oracle':>8}{'ratio':>7}"
                f"{'(zero)':>7}{'or@meas':>9}{'ratio':>7}{'bit':>8}{'bit/e':>7}"
                f"{'bit oracle':>11}"]
    b_orc = bit_oracle(world, rng)
    for n_b in SIZES:
        c = cases[(name, n_b)]
        inc = c.incontrol
        first = inc.arl_first()
        target = first if math.isfinite(first) else inc.arl_first_lower()
        at_meas = oracle_delay(name, PREFIX, SIZES_BENCH.oracle, rng, target=target)
        bit, bit_arl = bit_figures(world, c, SIZES_BENCH.streams, rng)
        e = c.steady.mean
        inc_rows.append(f"{n_b:>7,}{ARL0:>8.0f}{c.miss_rate:>10.3f}"
                        f"{_arl(first, inc.arl_first_lower()):>10}{inc.arl_renewal():>11.0f}"
                        f"{inc.share_below(ARL0):>9.3f}{inc.p_before(ARL0):>11.3f}"
                        f"{bit_arl:>14.0f}")
        notes = [f"e-CUSUM {c.steady.censored} censored at {c.steady.max_delay}"
                 ] if c.steady.censored else []
        notes += [f"bit {bit.censored} censored"] if bit.censored else []
        del_rows.append(f"{n_b:>7,}{e:>9.1f}{c.delay0.mean:>8.1f}{c.oracle_steady.mean:>8.1f}"
                        f"{e / c.oracle_steady.mean:>7.2f}{c.ratio(False)[0]:>7.2f}"
                        f"{at_meas.mean:>9.1f}{e / at_meas.mean:>7.2f}{bit.mean:>8.1f}"
                        f"{bit.mean / e:>7.2f}{b_orc.mean:>11.1f}"
                        + (f"  ({'; '.join(notes)})" if notes else ""))
    return ([head, "Lorden threshold log(arl0), in control:"] + inc_rows
            + ["delays (steady state unless 'zero'):"] + del_rows
            + calibrated_table(name, cases, rng))


def _upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial share."""
    return 1.0 if k >= n else float(stats.beta.ppf(level, k + 1, n - k))


def calibrated_table(name: str, cases: dict[tuple[str, int], Case],
                     rng: np.random.Generator) -> list[str]:
    world = WORLDS[name]
    inc_rows = [f"{'n_b':>7}{'bases':>7}{'h med':>7}{'ARL0 med':>10}{'ARL0 q05':>10}"
                f"{'<target':>9}{'(95% up)':>10}{'sim ARL0':>10}{'pred.':>8}"]
    del_rows = [f"{'n_b':>7}{'zero':>7}{'steady':>8}{'FA<200':>8}{'ratio0':>8}{'ratio':>7}"
                f"{'Lorden':>8}{'L/cal':>7}{'bit':>8}{'bit/e':>7}"]
    for n_b in SIZES:
        c = cases[(name, n_b)]
        cal = c.cal
        assert cal is not None
        b = cal.arl0.size
        onsets = int(cal.incontrol.onsets.sum())
        sim = b * cal.incontrol.horizon / onsets if onsets else math.inf
        pred = b * cal.incontrol.horizon / cal.predicted_onsets()
        inc_rows.append(f"{n_b:>7,}{b:>7}{float(np.median(cal.learned.h)):>7.2f}"
                        f"{float(np.median(cal.arl0)):>10.0f}"
                        f"{float(np.quantile(cal.arl0, 0.05)):>10.0f}"
                        f"{cal.share_below:>9.3f}{_upper(cal.below, b):>10.3f}"
                        f"{sim:>10.0f}{pred:>8.0f}")
        k = SIZES_BENCH.calibrated_delays
        chart = BitChart(world, n_b, np.repeat(cal.learned.passes, k))
        bit = run_delays(world, chart.increments, chart.h, chart.h.size, PREFIX, rng)
        e = cal.steady.mean
        fa = cal.steady.dropped / (cal.steady.dropped + cal.steady.delays.size)
        notes = [f"calibrated {cal.steady.censored} censored at {cal.steady.max_delay}"
                 ] if cal.steady.censored else []
        notes += [f"bit {bit.censored} censored"] if bit.censored else []
        del_rows.append(f"{n_b:>7,}{cal.delay0.mean:>7.1f}{e:>8.1f}{fa:>8.3f}"
                        f"{c.cal_ratio(False)[0]:>8.2f}{c.cal_ratio(True)[0]:>7.2f}"
                        f"{c.steady.mean:>8.1f}{c.steady.mean / e:>7.2f}{bit.mean:>8.1f}"
                        f"{bit.mean / e:>7.2f}"
                        + (f"  ({'; '.join(notes)})" if notes else ""))
    return (["calibrated threshold (bootstrap.score_threshold), in control (exact ARL0 per "
             "baseline):"] + inc_rows + ["calibrated, delays (ratios to the oracle at the "
                                         "target arl0):"] + del_rows)


def pooled_rows(cases: dict[tuple[str, int], Case]) -> list[str]:
    rows = ["calibrated: share of baselines with an ARL0 below the target, pooled over the "
            "worlds (stated at most 0.05)"]
    for n_b in SIZES:
        cals = [cases[(name, n_b)].cal for name in WORLDS]
        below = sum(c.below for c in cals if c is not None)
        b = sum(c.arl0.size for c in cals if c is not None)
        rows.append(f"  n_b = {n_b:>5,}: {below} of {b} = {below / b:.3f} (95 % upper bound "
                    f"{_upper(below, b):.3f})")
    return rows


def split_table(rng: np.random.Generator) -> list[str]:
    rows = ["where the e-CUSUM's delay goes (steady state, n_b = 1,000; mean lam over "
            "baselines)",
            f"{'world':<28}{'arl0':>7}{'lam':>6}{'lam*':>6}{'built':>8}{'lam*':>8}"
            f"{'m0=mu':>8}{'oracle':>8}"]
    reps = _scale(1_000, 100)
    for name, world in WORLDS.items():
        for arl0 in (ARL0, 10_000.0):
            lam, lam_star, built, best, known, orc = split_row(name, 1_000, arl0, reps, rng)
            rows.append(f"{world.name:<28}{arl0:>7.0f}{lam:>6.2f}{lam_star:>6.2f}"
                        f"{built:>8.1f}{best:>8.1f}{known:>8.1f}{orc:>8.1f}")
    rows.append("(built: the detector; lam*: same m0, the bet growth-optimal for the actual "
                "drop; m0=mu: the true baseline mean, lam from best_lambda; oracle: LLR "
                "CUSUM at that arl0)")
    return rows


def main() -> None:
    rng = np.random.default_rng(SEED + 8)
    print(f"graded-score e-CUSUM, drop {SHIFT:g} of the scale, target arl0 {ARL0:g}, "
          f"confidence 0.95; Lorden: {SIZES_BENCH.baselines} in-control baselines x "
          f"{SIZES_BENCH.streams} streams x {HORIZON} scores, {SIZES_BENCH.delays} delay "
          f"repetitions, {SIZES_BENCH.coverage} baselines for P(m0>mu); calibrated: "
          f"{dict(SIZES_BENCH.calibrated)} baselines per n_b, "
          f"{SIZES_BENCH.calibrated_delays} delay repetitions each")
    t0 = time.perf_counter()
    cases = measure_cases(KEYS, SIZES_BENCH, SEED + 7)
    print(f"(cases measured in {time.perf_counter() - t0:.0f} s)\n", flush=True)
    for name in WORLDS:
        t0 = time.perf_counter()
        print("\n".join(world_table(name, cases, rng)))
        print(f"({time.perf_counter() - t0:.0f} s)\n", flush=True)
    print("\n".join(pooled_rows(cases)) + "\n")
    print("(P(m0>mu): share of baselines whose m0 is above the true mean, stated 0.05; ARL0 "
          "1st: censored-exponential first-alarm estimate, horizon 10 arl0; ren.: scores per "
          "alarm onset; <target: share of baselines whose own renewal ARL0 is below the "
          "target; P(T<=500): share of streams alarmed within arl0 scores (0.63 for a "
          "geometric run length of mean arl0). Delays in scores after the change (after 200 "
          "in-control scores; 'zero': at the start); oracle: LLR CUSUM knowing both "
          "distributions at the target arl0; or@meas: the same at the e-CUSUM's ARL0 1st; "
          "bit: learned pass/fail BernoulliCUSUM at the e-CUSUM's nominal guarantee, bit/e "
          "its delay over the e-CUSUM's; bit oracle: LLR CUSUM on the bit knowing both pass "
          "rates, at the target arl0. Calibrated: h med, the median threshold (Lorden's is "
          f"{math.log(ARL0):.2f}); ARL0 med / q05: median and 5 % quantile over baselines of "
          "the exact ARL0; <target: share of baselines whose exact ARL0 is below the target; "
          "sim ARL0 / pred.: scores per alarm in simulation / predicted by the exact ARL0s; "
          "FA<200: share of steady-state repetitions alarmed in the 200 in-control scores; "
          "ratio0 / ratio: zero-start / steady delay over the oracle's; Lorden: the Lorden "
          "variant's steady delay, L/cal its ratio to the calibrated one; bit/e: the "
          "pass/fail chart's steady delay over the calibrated e-CUSUM's)\n")
    t0 = time.perf_counter()
    print("\n".join(split_table(rng)))
    print(f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
