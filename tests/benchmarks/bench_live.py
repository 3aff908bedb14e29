"""Candidate runs spent per decision by the live gate's sequential designs.

Seeded Monte Carlo of ``monitor.live.sequential.simulate`` (the gate's own decision) on
fingerprints of simulated runs (tests/analyzers/simagent.py), baseline 270/300 passes.
"""

from __future__ import annotations

import numpy as np

from assaywatch.analyzers.baseline import build_baseline
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.model import Outcome
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
    print("multi-fidelity (--proxy-run): not implemented yet")


if __name__ == "__main__":
    main()
