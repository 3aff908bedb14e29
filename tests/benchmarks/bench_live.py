"""Candidate runs spent per decision by the live gate's sequential designs.

Seeded Monte Carlo of ``monitor.live.sequential.simulate`` (the gate's own decision) on
fingerprints of simulated runs (tests/analyzers/simagent.py), baseline 270/300 passes;
then the multi-fidelity rows (``--proxy-run``): target runs, proxy runs, and their total
cost (target-run units, proxy at 1/10) relative to the fixed-n design and to the same SPRT
without a proxy ("cost/SPRT": the proxy's calibration runs included).
"""

from __future__ import annotations

import numpy as np

from assaywatch.analyzers.baseline import Baseline, build_baseline
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.model import Outcome
from assaywatch.monitor.live.fidelity import FidelityConfig, simulate_fidelity
from assaywatch.monitor.live.sequential import LiveConfig, StreamTest, simulate
from tests.analyzers.simagent import simulate_runs

N_REP = 4000


def main() -> None:
    rng = np.random.default_rng(2026)
    runs = simulate_runs(300, rng)
    for i, r in enumerate(runs):
        r.outcome = Outcome.PASS if i < 270 else Outcome.FAIL
    base = build_baseline(runs)
    pool = fingerprint_matrix(simulate_runs(1500, rng), base.tools)
    swap = fingerprint_matrix(simulate_runs(600, rng, tool_weights={"search": 0.5,
                                                                    "calc": 0.5}), base.tools)
    designs = {
        "SPRT alone": LiveConfig(warm_start=False, fingerprint=False),
        "SPRT + warm start": LiveConfig(fingerprint=False),
        "SPRT + warm + fingerprint": LiveConfig(),
    }
    print(f"{'design':28s} {'truth':22s} {'mean':>7s} {'p90':>5s} {'fixed/mean':>10s} "
          f"{'fail':>6s} {'pass':>6s} {'alarm':>6s}")
    fixed = StreamTest(base, LiveConfig(), "1.0").n_fixed
    print(f"{'fixed-n (Eq. 6)':28s} {'any':22s} {fixed:7d} {fixed:5d} {1.0:10.2f}")
    for name, cfg in designs.items():
        t = StreamTest(base, cfg, "1.0")
        for label, p, fps in (("unchanged p=0.90", t.theta, pool),
                              ("regressed p=0.80", t.theta - cfg.delta, pool),
                              ("stable p=0.99", 0.99, pool),
                              ("tool swap p=0.90", t.theta, swap)):
            def sample(g: np.random.Generator, n: int, p: float = p,
                       fps: np.ndarray = fps) -> tuple[np.ndarray, np.ndarray]:
                return g.random(n) < p, fps[g.integers(0, len(fps), n)]

            s = simulate(t, sample, N_REP, rng)
            mean = float(s.n.mean())
            print(f"{name:28s} {label:22s} {mean:7.1f} {int(np.percentile(s.n, 90)):5d} "
                  f"{fixed / mean:10.2f} {s.fail_rate:6.3f} {s.pass_rate:6.3f} "
                  f"{s.alarm_rate:6.3f}")
    multi_fidelity(base, fixed, rng)


def multi_fidelity(base: Baseline, fixed: int, rng: np.random.Generator) -> None:
    """+ multi-fidelity (``--proxy-run``) with a proxy at 1/10 the cost, pass/fail
    correlation rho (monitor.live.fidelity.simulate_fidelity); cost in target runs."""
    kappa = 0.1
    print(f"\n{'multi-fidelity, kappa 0.1':28s} {'truth':22s} {'target':>7s} {'proxy':>7s} "
          f"{'cost':>7s} {'cost/fixed':>10s} {'cost/SPRT':>9s} {'fail':>6s} {'pass':>6s} "
          f"{'used':>6s}")
    for warm in (False, True):
        t = StreamTest(base, LiveConfig(fingerprint=False, warm_start=warm), "1.0")
        for label, p in (("unchanged p=0.90", t.theta), ("regressed p=0.80",
                                                         t.theta - t.config.delta)):
            alone = simulate_fidelity(t.sprt, t.n_plan, p, p, 0.0, kappa, N_REP, rng,
                                      FidelityConfig(cost_ratio=kappa, pay_below=-1.0))
            ref = float(alone.n_target.mean())
            for rho in (0.0, 0.5, 0.9):
                s = simulate_fidelity(t.sprt, t.n_plan, p, p, rho, kappa, N_REP, rng)
                cost = float(s.cost(kappa).mean())
                name = f"{'warm' if warm else 'cold'} SPRT + proxy rho={rho:.1f}"
                print(f"{name:28s} {label:22s} {s.n_target.mean():7.1f} "
                      f"{s.n_proxy.mean():7.1f} {cost:7.1f} {cost / fixed:10.3f} "
                      f"{cost / ref:9.3f} {s.fail_rate:6.3f} {s.pass_rate:6.3f} "
                      f"{s.active.mean():6.3f}")


if __name__ == "__main__":
    main()
