"""Detection delay vs the likelihood-ratio oracle at matched ARL0, and cost per update.

Run with ``python -m tests.benchmarks`` (calls ``main()``) or
``python -m tests.benchmarks.bench_detectors``.

* Pass-rate shifts (0.9 -> 0.8 and 0.9 -> 0.85): BernoulliCUSUM designed for delta=0.1 at
  ARL0 10^4, exact Markov-chain delays; the oracle is the LR CUSUM designed for the true
  shift at the same ARL0. river's detectors on the 0/1 stream cannot be set to an ARL0:
  their ARL0 is measured (renewal estimate over simulated in-control streams, a lower
  bound when few alarms) and the oracle is re-calibrated to *their* ARL0.
* Fingerprint shifts of 0.5 and 1.0 Mahalanobis units (Gaussian, d=6, equicorrelated
  rho=0.4, random direction): FingerprintCUSUM and MEWMA at ARL0 10^4 against the CUSUM
  that knows the shift direction (k = delta/2, one chart, exact Markov chain).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from assaywatch.analyzers.detectors import (
    MEWMA,
    BernoulliCUSUM,
    Detector,
    FingerprintCUSUM,
    RiverDetector,
    bernoulli_cusum_arl,
    bernoulli_cusum_threshold,
    first_alarm_times,
    gaussian_cusum_arl,
    gaussian_cusum_threshold,
)

ARL0 = 10_000
D = 6
COV = 0.6 * np.eye(D) + 0.4
CHOL = np.linalg.cholesky(COV)
RIVER = [("adwin", {}), ("kswin", {"alpha": 1e-4}), ("page_hinkley", {})]
#: the stream's budget over the monitor's whole-run swap charts' part of it (default
#: shares: 1/2 fingerprint, 1/3 of it swaps, 1/2 of those the whole-run shape)
SWAP_RUN_PARTS = 12
#: the other parts of the budget the pair-unknown oracle is measured at (a curve)
SWAP_BUDGET_CURVE = (2, 4, 6)


def _river_on_bits(kind: str, params: dict[str, float], p0: float, p1: float,
                   rng: np.random.Generator) -> tuple[float, int, float]:
    """(measured ARL0, alarms it rests on, mean delay) of a river detector on 0/1 runs."""
    slow = kind == "kswin"  # a KS test per update: ~300 us
    n_streams, length = (4, 4_000) if slow else (8, 15_000)
    alarms = 0
    for _ in range(n_streams):
        det = RiverDetector(kind, **params)
        for x in rng.random(length) < p0:
            det.update(float(x))
        alarms += det.n_alarms
    arl0 = n_streams * length / max(alarms, 1)
    delays = []
    for _ in range(10 if slow else 30):
        det = RiverDetector(kind, **params)
        warm = rng.random(300) < p0  # river needs its own in-control history first
        for x in warm:
            det.update(float(x))
        start = det.n_alarms
        for t, x in enumerate(rng.random(3_000) < p1, start=1):
            det.update(float(x))
            if det.n_alarms > start:
                delays.append(t)
                break
        else:
            delays.append(3_001)
    return arl0, alarms, float(np.mean(delays))


def pass_rate_table() -> list[str]:
    rows = ["pass-rate shifts (ARL0 target 10^4; delays in runs from a fresh start)",
            f"{'shift':<12}{'detector':<22}{'ARL0':>10}{'delay':>9}{'oracle':>9}{'ratio':>7}"]
    rng = np.random.default_rng(70)
    h = bernoulli_cusum_threshold(0.9, 0.8, ARL0)
    for p1 in (0.8, 0.85):
        label = f"0.9->{p1}"
        h_or = bernoulli_cusum_threshold(0.9, p1, ARL0)
        oracle = bernoulli_cusum_arl(p1, 0.9, p1, h_or)
        ours = bernoulli_cusum_arl(p1, 0.9, 0.8, h)
        arl0 = bernoulli_cusum_arl(0.9, 0.9, 0.8, h)
        rows.append(f"{label:<12}{'BernoulliCUSUM d=.1':<22}{arl0:>10.0f}{ours:>9.1f}"
                    f"{oracle:>9.1f}{ours / oracle:>7.2f}")
        for n_base in (200, 2_000):
            x = int(0.9 * n_base)
            hb = bernoulli_cusum_threshold(0.9, 0.8, ARL0, n_base, x, 0.9)
            d_b = bernoulli_cusum_arl(p1, 0.9, 0.8, hb)
            rows.append(f"{'':<12}{f'  baseline {n_base}':<22}"
                        f"{bernoulli_cusum_arl(0.9, 0.9, 0.8, hb):>10.0f}{d_b:>9.1f}"
                        f"{oracle:>9.1f}{d_b / oracle:>7.2f}")
        for kind, params in RIVER:
            arl0_r, alarms, delay = _river_on_bits(kind, params, 0.9, p1, rng)
            arl_match = max(arl0_r, 2.0)
            o_r = bernoulli_cusum_arl(p1, 0.9, p1, bernoulli_cusum_threshold(0.9, p1, arl_match))
            flag = "" if alarms >= 10 else ">"
            rows.append(f"{'':<12}{'river ' + kind + ' *':<22}{flag + f'{arl0_r:.0f}':>10}"
                        f"{delay:>9.1f}{o_r:>9.1f}{delay / o_r:>7.2f}")
    rows.append("* river defaults, measured; '>' = fewer than 10 in-control alarms (lower "
                "bound); delay 3001 = not detected within 3000 runs (censored); oracle = LR "
                "CUSUM at the river detector's measured ARL0")
    return rows


def fingerprint_table() -> list[str]:
    rows = ["fingerprint mean shifts (Gaussian d=6, rho=0.4; ARL0 target 10^4)",
            f"{'shift':<12}{'detector':<22}{'delay':>9}{'oracle':>9}{'ratio':>7}"]
    rng = np.random.default_rng(71)
    u = rng.standard_normal(D)
    direction = CHOL @ (u / np.linalg.norm(u))
    dets: list[tuple[str, Callable[[], Detector]]] = [
        ("FingerprintCUSUM", lambda: FingerprintCUSUM(np.zeros(D), np.ones(D), arl0=ARL0)),
        ("MEWMA lambda=0.1", lambda: MEWMA(np.zeros(D), COV, arl0=ARL0)),
        ("MEWMA lambda=0.05", lambda: MEWMA(np.zeros(D), COV, lam=0.05, arl0=ARL0)),
    ]
    for delta in (0.5, 1.0):
        oracle = gaussian_cusum_arl(gaussian_cusum_threshold(delta / 2, ARL0), delta / 2,
                                    mu=delta)
        shift = delta * direction
        for name, make in dets:
            det = make()
            t = first_alarm_times(det, lambda g, s, sh=shift: g.standard_normal((*s, D))
                                  @ CHOL.T + sh, 1_000, 5_000, rng)  # type: ignore[arg-type]
            rows.append(f"{delta:<12}{name:<22}{t.mean():>9.1f}{oracle:>9.1f}"
                        f"{t.mean() / oracle:>7.2f}")
    return rows


def cost_table() -> list[str]:
    rows = ["cost per update (scalar update(), microseconds)",
            f"{'detector':<26}{'us/update':>10}"]
    rng = np.random.default_rng(72)
    bits = [bool(b) for b in rng.random(20_000) < 0.9]
    vecs = list(rng.standard_normal((5_000, 17)))
    floats = [float(v) for v in rng.random(20_000) < 0.9]
    cases: list[tuple[str, Detector, list[object]]] = [
        ("BernoulliCUSUM", BernoulliCUSUM(0.9), list(bits)),
        ("FingerprintCUSUM d=17", FingerprintCUSUM(np.zeros(17), np.ones(17)), list(vecs)),
        ("MEWMA d=17", MEWMA(np.zeros(17), np.eye(17)), list(vecs)),
        ("river adwin", RiverDetector("adwin"), list(floats)),
        ("river kswin", RiverDetector("kswin"), list(floats[:3_000])),
        ("river page_hinkley", RiverDetector("page_hinkley"), list(floats)),
    ]
    for name, det, xs in cases:
        t0 = time.perf_counter()
        for x in xs:
            det.update(x)
        rows.append(f"{name:<26}{1e6 * (time.perf_counter() - t0) / len(xs):>10.1f}")
    return rows


def realistic_monitor_table() -> list[str]:
    """The monitor's union on the realistic world with learned baselines (issue 12):
    ARL0 at a configured 500, spread over streams, delays against the oracle, calibration
    time. ``BENCH_REALISTIC_SCALE`` multiplies the stream and repetition counts."""
    import math
    import os

    from assaywatch.analyzers.detectors.bootstrap import (
        BaselineData,
        CalibrationSettings,
        calibrate,
    )
    from assaywatch.analyzers.fingerprint import fingerprint_matrix
    from tests.realworld import monitor_measure as mm
    from tests.realworld.measure import (
        default_workers,
        oracle_delay,
        pair_unknown_swap_oracle,
    )
    from tests.realworld.world import realistic_world

    scale = float(os.environ.get("BENCH_REALISTIC_SCALE", "1"))
    world, workers, arl0, horizon = realistic_world(), default_workers(), 500.0, 2_000
    rows = [f"monitor union, realistic world, learned baselines, configured arl0 = {arl0:g}",
            f"{'baseline':>9}{'streams':>8}{'onsets':>7}{'ARL0':>7}{'ratio':>7}"
            f"{'top10%':>8}{'if eq.':>7}  onsets by detector"]
    measured = {}
    for n_b, k in ((200, 40), (2_000, 20), (10_000, 6)):
        res = mm.incontrol(world, n_b, max(2, int(k * scale)), horizon, arl0, seed=31,
                           workers=workers)
        measured[n_b] = res.arl_first if math.isfinite(res.arl_first) else arl0
        rows.append(f"{n_b:>9,}{res.n_streams:>8}{int(res.counts.sum()):>7}"
                    f"{res.arl_renewal:>7.0f}{res.arl_renewal / arl0:>7.2f}"
                    f"{res.top_decile_share:>8.2f}{res.top_decile_reference:>7.2f}  "
                    f"{dict(res.detector_alarms)}")
    rows += ["", f"{'change':<12}{'baseline':>9}{'ARL0':>7}{'engine':>8}{'kept':>6}"
             f"{'oracle':>8}{'ratio':>7}"]
    for n_b in (200, 2_000):
        res_d = mm.delays(world, n_b, max(4, int(64 * scale)), seed=32, workers=workers)
        for change, r in res_d.items():
            orc = oracle_delay(world, change, measured[n_b], 200, pool=20_000, seed=33,
                               reps=1_000)
            rows.append(f"{change:<12}{n_b:>9,}{measured[n_b]:>7.0f}{r.mean:>8.1f}"
                        f"{len(r.delays):>6}{orc.delay:>8.1f}{r.mean / orc.delay:>7.2f}")
            if change == "tool_swap":
                # the union that does not know the pair, with all of the budget, parts of it
                # (SWAP_BUDGET_CURVE) and the monitor's whole-run swap charts' part: half to
                # the fingerprint, a third of that to the swaps, half of that to whole runs
                unk = {k: pair_unknown_swap_oracle(world, measured[n_b] * k, 200,
                                                   pool=20_000, seed=33, reps=1_000).delay
                       for k in (1, *SWAP_BUDGET_CURVE, SWAP_RUN_PARTS)}
                rows.append(f"{'  pair unknown':<28}{r.mean:>8.1f}{len(r.delays):>6}"
                            f"{unk[1]:>8.1f}{r.mean / unk[1]:>7.2f}  (that oracle "
                            f"{unk[1] / orc.delay:.2f}x the one knowing the pair)")
                part = unk[SWAP_RUN_PARTS]
                rows.append(f"{'  pair unknown, 1/12 budget':<28}{r.mean:>8.1f}"
                            f"{len(r.delays):>6}{part:>8.1f}{r.mean / part:>7.2f}"
                            f"  (that oracle {part / orc.delay:.2f}x the first)")
                curve = ", ".join(f"{'1' if k == 1 else f'1/{k}'} {d / orc.delay:.2f}x"
                                  for k, d in unk.items())
                rows.append(f"{'  pair unknown by budget':<28}  {curve} the first oracle")
    rng = np.random.default_rng(34)
    times = []
    for i in range(4):
        runs = world.runs(2_000, rng, scenario=i, key=world.key(i))
        tools = sorted(world.scenario(i).tool_names)
        x = fingerprint_matrix(runs, tools)
        passes = sum(r.outcome.value == "pass" for r in runs)
        data = BaselineData(x.mean(0), np.cov(x, rowvar=False), 2_000, passes,
                            2_000 - passes, x)
        t0 = time.perf_counter()
        calibrate(data, CalibrationSettings(arl0=10_000), seed=i)
        times.append(time.perf_counter() - t0)
    rows += ["", f"calibration per stream (2,000-run sample, defaults): median "
             f"{np.median(times):.3f} s, max {max(times):.3f} s",
             "(ARL0: runs per alarm onset over the horizon; ratio = ARL0 / arl0; top10%: "
             "share of onsets of the top decile of streams, 'if eq.' its value when every "
             "stream has the pooled rate; delays: steady state after 200 runs, oracle = LR "
             "CUSUM on the exact per-run LLR at the measured ARL0; 'pair unknown': the "
             "union of one such CUSUM per ordered pair of tools, which knows the swap's "
             "shape but not which pair; '1/12 budget': that union at 12x the ARL0, the "
             "part of the budget the monitor's whole-run swap charts have; 'by budget': that "
             "union at 1/k of the budget, i.e. k x the ARL0, against the first oracle)"]
    return rows


def main() -> None:
    for table in (pass_rate_table(), fingerprint_table(), cost_table(),
                  realistic_monitor_table()):
        print("\n".join(table))
        print()


if __name__ == "__main__":
    main()
