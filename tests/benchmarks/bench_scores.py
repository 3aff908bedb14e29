"""The graded-score e-CUSUM (``analyzers/detectors/score.py``) on realistic score worlds.

Run with ``python -m tests.benchmarks scores``. ``BENCH_SCORES_SCALE`` (default 1)
multiplies every repetition count; 0.25 gives a quick look. One process, about 3 minutes
at scale 1.

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
  baselines (``from_baseline``, Jeffreys p0, threshold with ARL0 >= 500 at posterior
  probability 0.95, the e-CUSUM's confidence), told the true drop of the pass rate (its most
  favourable design), run as the float LLR recursion at the detector's threshold; its
  measured ARL0 (first alarm, same estimator) beside it.

A second table splits the e-CUSUM's delay: the detector as built; the same ``m0`` with the
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
from scipy.optimize import minimize_scalar

from assaywatch.analyzers.detectors import BernoulliCUSUM
from assaywatch.analyzers.detectors.score import HIST_LEVELS, best_lambda
from tests.realworld.measure import lr_cusum_threshold
from tests.realworld.test_score_rates import (
    ARL0,
    HORIZON,
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
    measure_case,
    oracle_delay,
    run_delays,
    run_incontrol,
)

F64 = np.ndarray


def _scale(n: int, minimum: int = 2) -> int:
    return max(minimum, int(round(n * float(os.environ.get("BENCH_SCORES_SCALE", "1")))))


SIZES_BENCH = Sizes(coverage=_scale(50_000, 2_000), baselines=_scale(2_000, 200),
                    streams=5, delays=_scale(2_000, 200), oracle=_scale(10_000, 1_000))


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


def world_table(name: str, rng: np.random.Generator) -> list[str]:
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
        c = measure_case(name, n_b, SIZES_BENCH, SEED + 7)
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
    return [head, "in control:"] + inc_rows + ["delays (steady state unless 'zero'):"] + del_rows


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
          f"confidence 0.95; {SIZES_BENCH.baselines} in-control baselines x "
          f"{SIZES_BENCH.streams} streams x {HORIZON} scores, {SIZES_BENCH.delays} delay "
          f"repetitions, {SIZES_BENCH.coverage} baselines for P(m0>mu)")
    for name in WORLDS:
        t0 = time.perf_counter()
        print("\n".join(world_table(name, rng)))
        print(f"({time.perf_counter() - t0:.0f} s)\n", flush=True)
    print("(P(m0>mu): share of baselines whose m0 is above the true mean, stated 0.05; ARL0 "
          "1st: censored-exponential first-alarm estimate, horizon 10 arl0; ren.: scores per "
          "alarm onset; <target: share of baselines whose own renewal ARL0 is below the "
          "target; P(T<=500): share of streams alarmed within arl0 scores (0.63 for a "
          "geometric run length of mean arl0). Delays in scores after the change (after 200 "
          "in-control scores; 'zero': at the start); oracle: LLR CUSUM knowing both "
          "distributions at the target arl0; or@meas: the same at the e-CUSUM's ARL0 1st; "
          "bit: learned pass/fail BernoulliCUSUM at the e-CUSUM's nominal guarantee, bit/e "
          "its delay over the e-CUSUM's; bit oracle: LLR CUSUM on the bit knowing both pass "
          "rates, at the target arl0)\n")
    t0 = time.perf_counter()
    print("\n".join(split_table(rng)))
    print(f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
