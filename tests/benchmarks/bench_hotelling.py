"""Hotelling T^2 power by shift type, and fingerprint() cost.

Run with ``python -m tests.benchmarks`` (calls ``main()``) or directly with
``python -m tests.benchmarks.bench_hotelling`` from the repository root.

Each shift type is a simulated agent variant (tests/analyzers/simagent.py). For each, a
pool of runs is simulated once; each replicate draws n baseline and n candidate
fingerprints from the pools (with replacement) and runs the projected test at alpha = 0.05.
Columns: "default" keeps every non-null principal component (constant and collinear
directions removed); "d_eff 95%" is the paper's truncation; "nominal 14" is the paper's
recipe as released: pseudo-inverse of the pooled covariance with the nominal 14 degrees of
freedom. All three on the same replicates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from assaywatch.analyzers.fingerprint import fingerprint, fingerprint_matrix
from assaywatch.analyzers.hotelling import hotelling_from_samples
from tests.analyzers.simagent import simulate_runs

TOOLS = ["calc", "lookup", "search"]
SIZES = (50, 100, 200)
REPS = 200
POOL = 4000
ALPHA = 0.05
SEED = 20261201

SHIFTS: Mapping[str, Mapping[str, object]] = {
    "none (Type I)": {},
    "tool-mix swap": {"tool_weights": {"search": 0.3, "lookup": 0.5, "calc": 0.2}},
    "step count +1": {"extra_steps": 1},
    "latency x1.5": {"latency_scale": 1.5},
    "tokens +20%": {"token_scale": 1.2},
    "output length x1.2": {"output_length_mean": 480.0},
}


def _nominal_reject(xb: NDArray[np.float64], xc: NDArray[np.float64], d: int = 14) -> bool:
    nb, nc = len(xb), len(xc)
    n = nb + nc
    s = ((nb - 1) * np.cov(xb, rowvar=False) + (nc - 1) * np.cov(xc, rowvar=False)) / (n - 2)
    diff = xc.mean(0) - xb.mean(0)
    t2 = nb * nc / n * float(diff @ np.linalg.pinv(s) @ diff)
    return bool(stats.f.sf((n - d - 1) / ((n - 2) * d) * t2, d, n - d - 1) < ALPHA)


def power_table() -> list[tuple[str, int, float, float, float]]:
    """(shift, n per side, power default (all non-null components), power with the paper's
    95% truncation, power with the nominal 14 dof)."""
    rng = np.random.default_rng(SEED)
    base = fingerprint_matrix(simulate_runs(POOL, rng), TOOLS)
    rows = []
    for name, kw in SHIFTS.items():
        cand = fingerprint_matrix(simulate_runs(POOL, rng, **kw), TOOLS)  # type: ignore[arg-type]
        for n in SIZES:
            proj = full = nom = 0
            for _ in range(REPS):
                xb = base[rng.integers(0, POOL, n)]
                xc = cand[rng.integers(0, POOL, n)]
                full += hotelling_from_samples(xb, xc, ALPHA).reject
                proj += hotelling_from_samples(xb, xc, ALPHA, threshold=0.95).reject
                nom += _nominal_reject(xb, xc)
            rows.append((name, n, full / REPS, proj / REPS, nom / REPS))
    return rows


def fingerprint_cost_us(n: int = 5000) -> float:
    runs = simulate_runs(n, np.random.default_rng(SEED))
    t0 = time.perf_counter()
    for r in runs:
        fingerprint(r, TOOLS)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    print(f"Hotelling T^2 power, alpha={ALPHA}, {REPS} replicates, pools of {POOL} runs, "
          f"seed {SEED}")
    print(f"{'shift':<20} {'n/side':>6} {'default':>8} {'d_eff 95%':>10} {'nominal 14':>11}")
    for name, n, full, trunc, nom in power_table():
        print(f"{name:<20} {n:>6} {full:>8.3f} {trunc:>10.3f} {nom:>11.3f}")
    runs = simulate_runs(1000, np.random.default_rng(SEED))
    steps = np.mean([len(r.steps) for r in runs])
    print(f"fingerprint(): {fingerprint_cost_us():.1f} us per run "
          f"(simulated runs, mean {steps:.1f} steps, {len(TOOLS)} tools)")


if __name__ == "__main__":
    main()
