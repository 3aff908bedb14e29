"""SPRT sample sizes against the fixed-n design, warm starts, and the cost of an update.

theta = 0.9, delta = 0.1, alpha = 0.05, beta = 0.1, truncated at the gate's n_max = 500.
Mean / median / p90 of N are exact (``sprt_exact``); the "MC" columns are a seeded
20,000-replicate vectorised simulation of the same test, as a check.
"""

from __future__ import annotations

import time

import numpy as np

from assaywatch.analyzers.sprt import SPRT, warm_start_llr
from assaywatch.analyzers.sprt_operating import simulate_sprt, sprt_exact
from assaywatch.analyzers.verdicts import planned_sample_size, sample_size

THETA, DELTA, ALPHA, BETA, N_MAX = 0.9, 0.1, 0.05, 0.1, 500
REPS = 20_000


def _row(label: str, p: float, llr0: float, rng: np.random.Generator) -> str:
    exact = sprt_exact(THETA, DELTA, ALPHA, BETA, p, N_MAX, llr0)
    start = time.perf_counter()
    sim = simulate_sprt(THETA, DELTA, ALPHA, BETA, p, REPS, rng, N_MAX, llr0)
    ms = (time.perf_counter() - start) * 1e3
    return (
        f"{label:<26} {p:>5.2f} {llr0:>7.3f} {exact.fail:>7.4f} {exact.mean_n:>7.1f} "
        f"{exact.quantile_n(0.5):>6d} {exact.quantile_n(0.9):>5d} {sim.fail_rate:>8.4f} "
        f"{sim.n.mean():>7.1f} {ms:>7.0f}"
    )


def main() -> None:
    n_eq6 = sample_size(THETA, DELTA, ALPHA, BETA)
    n_fisher = planned_sample_size(THETA, DELTA, ALPHA, BETA, "fisher")
    n_z = planned_sample_size(THETA, DELTA, ALPHA, BETA, "z")
    print(
        f"fixed-n design per arm for the same (alpha, beta, delta): Eq. 6 {n_eq6}, "
        f"exact Fisher {n_fisher}, exact z-test {n_z}"
    )
    print(
        f"{'variant':<26} {'p':>5} {'llr0':>7} {'P(Fail)':>7} {'mean N':>7} {'median':>6} "
        f"{'p90':>5} {'MC Fail':>8} {'MC N':>7} {'MC ms':>7}"
    )
    rng = np.random.default_rng(2026)
    for p in (0.9, 0.85, 0.8):
        print(_row("cold", p, 0.0, rng))
    warm = {
        "warm same version 90/100": warm_start_llr(THETA, DELTA, ALPHA, BETA, 90, 100, True),
        "warm same version 80/100": warm_start_llr(THETA, DELTA, ALPHA, BETA, 80, 100, True),
        "warm older 95/100 (a0=.1)": warm_start_llr(THETA, DELTA, ALPHA, BETA, 95, 100, False),
        "warm older 75/100 (a0=.1)": warm_start_llr(THETA, DELTA, ALPHA, BETA, 75, 100, False),
    }
    for label, llr0 in warm.items():
        for p in (0.9, 0.8):
            print(_row(label, p, llr0, rng))
    print("P(Fail) at p = 0.9 is the Type I error, at p = 0.8 the power.")

    stream = (np.random.default_rng(1).random(200_000) < 0.9).tolist()
    test = SPRT(THETA, DELTA, ALPHA, BETA)
    start = time.perf_counter()
    for passed in stream:
        test.update(passed)
        if test.decision is not None:
            test.reset()
    per_update = (time.perf_counter() - start) / len(stream) * 1e6
    print(f"SPRT.update: {per_update:.2f} us per call (200,000 calls, with resets)")
