"""Top-decile share of false alarms over streams, with the count noise taken out (issue 12).

Run with ``python -m tests.benchmarks decile`` (calls ``main()``) or
``python -m tests.benchmarks.bench_decile``; ``ASSAYWATCH_DECILE_SMALL=1`` gives a quick
look at a tiny size. Uses up to 2 processes (``default_workers()``).

The claim: no decile of streams carries more than 25% of the false alarms in the long run,
i.e. the top 10% of the streams' **true** alarm rates hold at most 25% of the total rate.
``STREAMS`` streams of the realistic world each learn their baseline from runs (of each
size in ``BASELINE_SIZES``), then run ``HORIZON`` in-control runs at a configured ``ARL0``;
every alarm onset of every detector counts (``monitor_measure.incontrol``). Estimators:

(a) naive: the top decile's share of the onset counts. Biased UP: with a few onsets per
    stream the largest counts are partly luck (beside it, its value under equal rates).
(b) split-half cross-fit: rank the streams on the first half of the horizon, take the top
    ``round(0.1 * streams)`` (ties at the cut shared fractionally), report their share of
    the second half's onsets, and the reverse; the mean of both. Biased DOWN: a noisy
    ranking picks streams whose true rates are not the top ones.
(c) gamma deconvolution: rates ~ gamma, shape by the method of moments (variance of the
    rates = (variance of the counts - their mean) / horizon^2), then the expected top-decile
    share of ``STREAMS`` rates drawn from it (Monte Carlo) and of infinitely many
    (E[rate; rate > q90] / E[rate]). A model, and biased UP if onsets cluster within a
    stream (extra-Poisson variance that is not a spread of rates); (c') takes the variance
    of the rates from the covariance of the two halves' counts instead, which such
    clustering leaves alone (noisier).
(d) intervals: 2.5-97.5% percentiles of a bootstrap over streams (``BOOT`` resamples).

The same streams measure the guarantee over baselines: the union keeps ``arl0`` with
probability ``arl0_confidence`` (0.9 by default) over the baselines it could have learned,
each detector its share with probability (1 + 0.9) / 2. Each stream learns its own
baseline, so the share of streams whose true ARL0 is below the target estimates the
probability; its count over the horizon is about Poisson(horizon / ARL0). Estimators:

(e) naive: the share of streams with more onsets than ``horizon / target``. Biased UP
    when the streams' rates sit near the target (a stream exactly at it exceeds half the
    time).
(f) significant: the streams whose count a Poisson(horizon / target) reaches with
    probability < 0.05; 5% of streams exactly at the target do by chance.
(g) gamma: the mass above ``1 / target`` of the gamma fitted to the rates as in (c) (equal
    rates when no spread is seen: 0 or 1).

The tables run for learned baselines of each size in ``BASELINE_SIZES`` (about 2, 1, 2 and
2.5 minutes on 2 cores; 500 runs is where the union's share first keeps the claim), then
on the Gaussian world (the second case) with 200-run baselines. A first table
(:func:`pass_rate_exact_table`, under a minute) computes the pass-rate chart's share
exactly at baseline sizes from 200 to 2,000 runs.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from tests.realworld import monitor_measure as mm
from tests.realworld._compat import DetectorConfig
from tests.realworld.measure import (
    InControlResult,
    default_workers,
    poisson_top_decile,
    top_decile_share,
)
from tests.realworld.world import World, gaussian_world, realistic_world

F64 = NDArray[np.float64]
ARL0 = 500.0
BASELINE_SIZES = (200, 500, 2_000, 10_000)
#: the union's probability over baselines (``detectors.arl0_confidence``, the default)
CONFIDENCE = DetectorConfig().arl0_confidence
STREAMS = 40
HORIZON = 20_000
SEED = 20261214
BOOT = 2_000
MC_REPS = 20_000  # gamma draws of STREAMS rates for (c)'s point estimate
MC_BOOT = 200  # per bootstrap resample
SMALL = (8, 1_500)  # (streams, horizon) with ASSAYWATCH_DECILE_SMALL=1


def _top_k(n: int) -> int:
    return max(1, int(round(0.1 * n)))


def cross_fit_share(rank_by: F64, score: F64) -> float:
    """Share of ``score``'s total held by the top decile of streams ranked on ``rank_by``;
    streams tied at the cut are taken fractionally (the mean over random tie-breaks)."""
    total = float(score.sum())
    if total <= 0:
        return math.nan
    k = _top_k(rank_by.size)
    cut = np.sort(rank_by)[::-1][k - 1]
    above = rank_by > cut
    tied = rank_by == cut
    room = k - int(above.sum())
    held = float(score[above].sum()) + room * float(score[tied].mean())
    return held / total


def split_half(first: F64, second: F64) -> tuple[float, float, float]:
    """(b): (first ranks -> second's share, second ranks -> first's share, their mean)."""
    a = cross_fit_share(first, second)
    b = cross_fit_share(second, first)
    ok = [v for v in (a, b) if not math.isnan(v)]
    return a, b, float(np.mean(ok)) if ok else math.nan


def gamma_shape(mean_count: float, var_rate_t2: float) -> float:
    """Gamma shape of the rates from the mean count and Var(rate) * horizon^2 (inf: no
    spread detected, equal rates)."""
    if mean_count <= 0 or var_rate_t2 <= 0:
        return math.inf
    return mean_count ** 2 / var_rate_t2


def gamma_share_infinite(shape: float) -> float:
    """Share of the total rate held by the top 10% of a gamma's mass."""
    if not math.isfinite(shape):
        return 0.1
    q = stats.gamma.ppf(0.9, shape)
    return float(stats.gamma.sf(q, shape + 1.0))


def gamma_share_n(shape: float, n: int, reps: int, rng: np.random.Generator) -> float:
    """Expected top-decile share of ``n`` rates drawn from gamma(``shape``) (Monte Carlo)."""
    k = _top_k(n)
    if not math.isfinite(shape):
        return k / n
    x = np.sort(rng.gamma(shape, size=(reps, n)), axis=1)[:, ::-1]
    return float(np.mean(x[:, :k].sum(axis=1) / x.sum(axis=1)))


def halves(res: InControlResult) -> tuple[F64, F64]:
    """Per-stream onset counts in runs 1..H/2 and H/2+1..H of the horizon."""
    half = res.horizon // 2
    first = np.array([sum(1 for t, _ in r.alarms if t <= half) for r in res.records], float)
    second = np.array([sum(1 for t, _ in r.alarms if t > half) for r in res.records], float)
    return first, second


def estimates(first: F64, second: F64, rng: np.random.Generator, mc_reps: int
              ) -> dict[str, float]:
    """(a), (b), (c), (c') on one set of per-stream half counts."""
    c = first + second
    n = c.size
    mean = float(c.mean())
    var_moments = float(c.var(ddof=1)) - mean if n > 1 else 0.0
    # E[c1 c2] - E[c1] E[c2] = Var(rate) (H/2)^2 when the halves are independent given
    # the rate; times 4 for the whole horizon
    var_cov = 4.0 * float(np.cov(first, second, ddof=1)[0, 1]) if n > 1 else 0.0
    shape, shape_cov = gamma_shape(mean, var_moments), gamma_shape(mean, var_cov)
    _, _, cross = split_half(first, second)
    return {
        "naive": top_decile_share(c.astype(np.int64)) if c.sum() > 0 else math.nan,
        "cross": cross,
        "shape": shape,
        "gamma_n": gamma_share_n(shape, n, mc_reps, rng),
        "gamma_inf": gamma_share_infinite(shape),
        "shape_cov": shape_cov,
        "gamma_cov_n": gamma_share_n(shape_cov, n, mc_reps, rng),
        "gamma_cov_inf": gamma_share_infinite(shape_cov),
    }


def bootstrap(first: F64, second: F64, reps: int, rng: np.random.Generator
              ) -> dict[str, tuple[float, float]]:
    """2.5-97.5% percentile intervals of every estimate, streams resampled."""
    n = first.size
    draws: dict[str, list[float]] = {}
    for _ in range(reps):
        idx = rng.integers(0, n, size=n)
        for key, v in estimates(first[idx], second[idx], rng, MC_BOOT).items():
            draws.setdefault(key, []).append(v)
    out = {}
    for key, vs in draws.items():
        a = np.array(vs)
        a = a[np.isfinite(a)]  # (a gamma shape is inf when a resample shows no spread)
        out[key] = ((float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5)))
                    if a.size else (math.nan, math.nan))
    return out


def below_target(c: F64, expected: float, rng: np.random.Generator, reps: int = BOOT
                 ) -> dict[str, float]:
    """(e), (f), (g) for per-stream counts ``c`` over a horizon where a stream exactly at the
    target ARL0 expects ``expected`` onsets; the gamma share with its bootstrap interval."""

    def gamma_above(x: F64) -> float:
        m = float(x.mean())
        shape = gamma_shape(m, float(x.var(ddof=1)) - m if x.size > 1 else 0.0)
        if not math.isfinite(shape):
            return float(m > expected)
        return float(stats.gamma.sf(expected, shape, scale=m / shape))

    boot = [gamma_above(c[rng.integers(0, c.size, size=c.size)]) for _ in range(reps)]
    significant = stats.poisson.sf(c - 1, expected) < 0.05
    return {"naive": float(np.mean(c > expected)), "significant": float(significant.sum()),
            "gamma": gamma_above(c), "gamma_lo": float(np.percentile(boot, 2.5)),
            "gamma_hi": float(np.percentile(boot, 97.5))}


def _below_rows(res: InControlResult, rng: np.random.Generator) -> list[str]:
    """The share of baselines below their target: the union's (arl0, probability
    ``CONFIDENCE``) and each detector's (arl0 / its share, probability (1 + c) / 2)."""
    n, h = res.n_streams, res.horizon
    allowed = 1.0 - CONFIDENCE
    rows = [f"share of baselines whose ARL0 is below the target (allowed: the union "
            f"{allowed:.2f}, each detector {allowed / 2:.3f})",
            f"{'alarms of':<20}{'target':>8}{'expected':>10}{'naive':>7}{'significant':>13}"
            f"{'gamma':>7}{'95% (boot)':>14}"]
    sets = [("the union", ARL0, res.counts.astype(float))]
    for det in sorted(res.detector_alarms):  # the default alarm_shares: 1/2 each
        sets.append((det, ARL0 / 0.5, _detector_counts(res, det)))
    for name, target, c in sets:
        e = below_target(c, h / target, rng)
        rows.append(f"{name:<20}{target:>8,.0f}{h / target:>10.1f}{e['naive']:>7.2f}"
                    f"{int(e['significant']):>7} of {n:<3}{e['gamma']:>7.3f}"
                    f"{e['gamma_lo']:>7.3f}-{e['gamma_hi']:.3f}")
    rows.append(f"(naive: share of streams above the expected count; significant: streams "
                f"above it at Poisson p < 0.05, {0.05 * n:.0f} by chance if all sat at the "
                f"target; gamma: mass of the fitted rates above the target's)")
    return rows


def _detector_counts(res: InControlResult, det: str) -> F64:
    """Per-stream onset counts of one detector."""
    return np.array([sum(1 for _, d in r.alarms if d == det) for r in res.records], float)


def _by_detector(res: InControlResult) -> list[str]:
    """Each detector's own spread: its onsets' naive top-decile share and index of
    dispersion over the streams."""
    out = []
    for det in sorted(res.detector_alarms):
        c = _detector_counts(res, det)
        disp = float(((c - c.mean()) ** 2).sum() / c.mean())
        out.append(f"  {det}: {int(c.sum())} onsets, top decile {top_decile_share(c):.2f}"
                   f", index of dispersion {disp:.1f}, streams without one "
                   f"{int((c == 0).sum())} of {c.size}")
    return out


def _sizes() -> tuple[int, int]:
    if os.environ.get("ASSAYWATCH_DECILE_SMALL", "") not in ("", "0"):
        return SMALL
    return STREAMS, HORIZON


def decile_table(streams: int | None = None, horizon: int | None = None,
                 baseline_runs: int = BASELINE_SIZES[0], world: World | None = None
                 ) -> list[str]:
    n, h = _sizes()
    n, h = streams or n, horizon or h
    world, workers = world or realistic_world(), default_workers()
    t0 = time.perf_counter()
    res = mm.incontrol(world, baseline_runs, n, h, ARL0, seed=SEED, workers=workers)
    wall = time.perf_counter() - t0
    first, second = halves(res)
    c = res.counts
    rng = np.random.default_rng([SEED, 7])
    est = estimates(first, second, rng, MC_REPS)
    ci = bootstrap(first, second, BOOT, rng)
    a_half, b_half, _ = split_half(first, second)
    reference = poisson_top_decile(float(c.mean()), n, rng, MC_REPS)
    k = _top_k(n)

    def row(label: str, key: str | None, value: float, bias: str) -> str:
        lo, hi = ci[key] if key else (math.nan, math.nan)
        interval = f"{lo:.3f}-{hi:.3f}" if key else ""
        return f"{label:<44}{value:>7.3f}{interval:>14}  {bias}"

    def shape_txt(s: float) -> str:
        return "inf" if not math.isfinite(s) else f"{s:.1f}"

    exposure = n * h
    dispersion = float(((c - c.mean()) ** 2).sum() / c.mean()) if c.sum() else math.nan
    scen: Counter[int] = Counter()
    for r in res.records:
        scen[r.stream % len(world.scenarios)] += len(r.alarms)
    rows = [f"top-decile share of false alarms, {world.name} world, learned baselines of "
            f"{baseline_runs:,} runs, configured arl0 = {ARL0:g}; {n} streams x {h:,} runs "
            f"(top decile = {k} streams)",
            f"{'estimator':<44}{'share':>7}{'95% (boot)':>14}  bias",
            row("(a) naive, share of the counts", "naive", est["naive"], "up (count noise)"),
            row("    if every stream had the pooled rate", None, reference,
                "(Poisson reference)"),
            row("(b) split-half cross-fit, mean", "cross", est["cross"], "down (noisy ranking)"),
            row("    ranked on 1st half, share of 2nd", None, a_half, ""),
            row("    ranked on 2nd half, share of 1st", None, b_half, ""),
            row(f"(c) gamma (moments, shape {shape_txt(est['shape'])}), {n} streams",
                "gamma_n", est["gamma_n"], "model; up if onsets cluster"),
            row("    same gamma, infinitely many streams", "gamma_inf", est["gamma_inf"], ""),
            row(f"(c') gamma (half covariance, shape {shape_txt(est['shape_cov'])}), {n}",
                "gamma_cov_n", est["gamma_cov_n"], "model; noisier"),
            row("    same gamma, infinitely many streams", "gamma_cov_inf",
                est["gamma_cov_inf"], ""),
            "",
            f"onsets {int(c.sum())} (halves {int(first.sum())} + {int(second.sum())}); "
            f"exposure / arl0 = {exposure / ARL0:.0f}; runs per onset {res.arl_renewal:.0f}"
            f" ({res.arl_renewal / ARL0:.2f} x arl0); mean {c.mean():.2f} per stream",
            f"index of dispersion {dispersion:.1f} on {n - 1} df (equal-rate Poisson p = "
            f"{stats.chi2.sf(dispersion, n - 1):.3g}); corr(1st half, 2nd half) = "
            f"{np.corrcoef(first, second)[0, 1]:.2f}",
            f"onsets by detector {dict(res.detector_alarms)}; by scenario "
            f"{dict(sorted(scen.items()))}",
            *_by_detector(res),
            f"per-stream counts, sorted: {sorted(c.tolist(), reverse=True)}",
            f"measurement {wall:.0f} s with {workers} worker(s), "
            f"{n * (h + baseline_runs) / wall:.0f} runs/s (learning runs included)",
            f"(intervals: {BOOT} bootstrap resamples of the streams; (c) Monte Carlo "
            f"{MC_REPS} sets of {n} gamma rates, {MC_BOOT} per resample)",
            "", *_below_rows(res, rng)]
    return rows


#: baseline sizes and pass rates of the exact table of the pass-rate chart's spread
EXACT_SIZES = (200, 500, 1_000, 2_000)
EXACT_RATES = (0.8, 0.9)


def pass_rate_exact_table() -> list[str]:
    """The pass-rate chart's top-decile share over the baselines a stream could have
    learned, exact (every baseline count with its binomial probability, the monitor's
    calibration, the chart's Markov-chain ARL at the true rate; the helpers of
    ``tests/analyzers/detectors/test_bernoulli_cusum.py``): from which baseline size the
    chart alone keeps the 25% claim."""
    from tests.analyzers.detectors.test_bernoulli_cusum import (
        ARL,
        _rates_over_baselines,
        _top_decile,
    )

    rows = [f"pass-rate chart over the baselines it could have learned, exact (its target "
            f"ARL0 {ARL:g}: a half share of arl0 {ARL0:g})",
            f"{'baseline':>9}{'p':>6}{'top10%':>8}{'mean ARL0 / target':>20}"
            f"{'P(ARL0 < target)':>18}"]
    for n in EXACT_SIZES:
        for p in EXACT_RATES:
            w, rates = _rates_over_baselines(n, p)
            mean_rate = float((w * rates).sum() / w.sum())
            rows.append(f"{n:>9,}{p:>6.2f}{_top_decile(w, rates):>8.3f}"
                        f"{1.0 / mean_rate / ARL:>20.2f}{w[rates > 1.0 / ARL].sum():>18.3f}")
    return rows


def main() -> None:
    print("\n".join(pass_rate_exact_table()) + "\n", flush=True)
    for i, n_b in enumerate(BASELINE_SIZES):
        print(("\n" if i else "") + "\n".join(decile_table(baseline_runs=n_b)), flush=True)
    # the second case: Gaussian fingerprints, at the size where the baselines vary most
    print("\n" + "\n".join(decile_table(baseline_runs=BASELINE_SIZES[0],
                                         world=gaussian_world())), flush=True)


if __name__ == "__main__":
    main()
