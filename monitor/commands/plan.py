"""``assaywatch plan``: how many candidate runs each stream needs (SPEC.md 7.2, 3.4, Thm 7.1).

Per baseline stream, for the gate's alpha, beta, delta (``--config``) and a minimum
behaviour shift Delta_M (``--shift``, in baseline standard deviations: a Mahalanobis
distance):

``n_pass_rate``
    Smallest candidate size n_c at which the gate's pass-rate verdict is designed to
    decide (``analyzers.verdicts.candidate_sample_size``): its Fail test at the Holm
    family's smallest level (alpha over 2 tests per stream: pass rate and fingerprint) has
    power 1 - beta at a drop of delta, and an unchanged stream passes with probability
    1 - alpha over that family, at the least favourable rate in the baseline's 95% Wilson
    interval (the baseline's own n_b fixed). None when even n_c -> infinity cannot reach
    it (the baseline is too small: record more baseline runs).
``n_fingerprint``
    Smallest n_c whose exact Hotelling power P[F'(d, n-d-1; lambda) > F_crit],
    lambda = n_b n_c / (n_b + n_c) Delta_M^2, reaches 1 - beta at ``fingerprint_alpha``;
    d is the dimension the gate's test projects onto (every non-null component of the
    baseline's correlation matrix). Eq. 30's heuristic (equal arms) is printed beside it.
``n_budget``
    Algorithm 4: n* = ceil(z^2 sigma2 / Delta_M^2 + (d_eff + 1)/2) (1 + sqrt(2/k)), d_eff at
    95% variance, on the baseline-sd scale of Delta_M.

How sigma2 is obtained. A baseline keeps the fingerprint mean and covariance, not its
runs. *Variance class*: the natural-scale total variance (analyzers/budget.py) is computed
from the covariance diagonal, the two count features divided by max(1, |mean|)^2, so the
1.5 / 5.0 thresholds mean what they mean for calibration runs. *n_budget*: without
calibration runs the candidate is assumed as variable as the baseline, so on the scale of
Delta_M (baseline sds) sigma2 = the number of non-constant features and k = n_b. With
``--calibration FILES`` (a few candidate runs), sigma2, the class and d_eff come from those
runs, standardised by the baseline's sds, and k is their number (n* then counts them).

``recommended`` = max(n_pass_rate, n_fingerprint): the runs after which neither gate test
should be Inconclusive for lack of runs.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

#: Largest candidate size searched.
MAX_RUNS = 1_000_000


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan", help="recommend candidate runs per stream (adaptive budget)",
        description="For each baseline stream: variance class, and the candidate runs the "
                    "gate's pass-rate and fingerprint tests need to reach power 1 - beta "
                    "(exact powers), beside the adaptive budget n* sized from the agent's own "
                    "variability.")
    p.add_argument("--baseline", required=True, nargs="+", metavar="FILE",
                   help="baseline JSON, or span files of the known-good version")
    p.add_argument("--config", metavar="FILE", help="gate config YAML (alpha, beta, delta, "
                   "fingerprint_alpha, test, contracts)")
    p.add_argument("--calibration", nargs="+", metavar="FILE",
                   help="span files with a few candidate runs: sigma2 and the class then "
                        "come from them instead of the baseline")
    p.add_argument("--shift", type=float, default=0.5, metavar="D",
                   help="smallest behaviour shift worth detecting, in baseline standard "
                        "deviations (Mahalanobis; default 0.5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--strict", action="store_true", help="fail on the first bad record")
    p.set_defaults(func=run)


def smallest_n(power: Callable[[int], float], target: float, start: int = 2,
               limit: int = MAX_RUNS) -> int | None:
    """Smallest n in [start, limit] with power(n) >= target (doubling, then bisection;
    power is treated as non-decreasing in n, which exact powers are up to a saw-tooth of a
    few runs), or None when power(limit) < target."""
    if power(limit) < target:
        return None
    lo, hi = start - 1, start
    while power(hi) < target:
        lo, hi = hi, min(limit, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def plan_stream(base: Any, policy: Any, shift: float,
                calibration: Sequence[Any] | None = None, n_streams: int = 1) -> dict[str, Any]:
    """The plan of one baseline stream (see the module docstring for every number)."""
    import numpy as np

    from assaywatch.analyzers.budget import adaptive_budget, budget_from_variance, variance_class
    from assaywatch.analyzers.fingerprint import FIXED_FEATURES, fingerprint_matrix
    from assaywatch.analyzers.hotelling import (
        DEFAULT_THRESHOLD,
        Projection,
        effective_dimension,
        fingerprint_sample_size,
        hotelling_power,
    )
    from assaywatch.analyzers.verdicts import candidate_sample_size

    n_b = base.passes + base.fails
    out: dict[str, Any] = {"stream": str(base.key), **base.key.as_labels(),
                           "baseline_runs": base.n_runs, "baseline_decided": n_b,
                           "baseline_pass_rate": base.pass_rate, "notes": []}
    target = 1 - policy.beta
    if n_b == 0:
        out["n_pass_rate"] = None
        out["notes"].append("no decided outcomes in the baseline: no pass-rate test")
    elif (base.pass_rate or 0.0) < policy.delta:
        out["n_pass_rate"] = None
        out["notes"].append(f"baseline pass rate below delta {policy.delta}: no drop possible")
    else:
        out["n_pass_rate"] = candidate_sample_size(
            base.passes, n_b, policy.delta, policy.alpha, policy.beta, policy.test,
            tests=2 * max(1, n_streams), limit=MAX_RUNS)
        if out["n_pass_rate"] is None:
            out["notes"].append(f"{n_b} decided baseline runs cannot give power {target:.2f} "
                                "at any candidate size: record more baseline runs")
    cov = np.asarray(base.cov, dtype=np.float64)
    mean = np.asarray(base.mean, dtype=np.float64)
    d = Projection.fit(mean, cov, DEFAULT_THRESHOLD).d_eff if base.n_runs >= 2 else 0
    out["d"] = d
    if d == 0 or base.n_runs < 2:
        out["n_fingerprint"] = out["n_fingerprint_eq30"] = None
        out["notes"].append("fingerprint constant or baseline < 2 runs: no fingerprint test")
    else:
        out["n_fingerprint"] = smallest_n(
            lambda n: hotelling_power(base.n_runs, n, d, shift, policy.fingerprint_alpha)
            if base.n_runs + n > d + 1 else 0.0, target)
        out["n_fingerprint_eq30"] = fingerprint_sample_size(policy.fingerprint_alpha,
                                                            policy.beta, d, shift)
        if out["n_fingerprint"] is None:
            out["notes"].append(f"{base.n_runs} baseline runs cannot give Hotelling power "
                                f"{target:.2f} at a shift of {shift}: record more")
    # sigma2: see the module docstring.
    diag = np.clip(np.diag(cov), 0.0, None)
    unit = np.ones_like(diag)
    for name in ("max_depth", "branches"):
        j = FIXED_FEATURES.index(name)
        unit[j] = max(1.0, abs(float(mean[j])))
    sd = np.sqrt(diag)
    if calibration:
        X = fingerprint_matrix(calibration, base.tools)
        if X.shape[0] < 2:
            raise ValueError(f"{base.key}: calibration needs >= 2 runs, got {X.shape[0]}")
        b = adaptive_budget(X, policy.fingerprint_alpha, policy.beta, shift, baseline_sd=sd)
        out.update(sigma2_source=f"calibration ({b.k} runs)", variance_class=b.variance_class,
                   sigma2_natural=b.sigma2_natural, sigma2=b.sigma2, d_eff=b.d_eff,
                   n_budget=b.n_star)
    else:
        sig_nat = float((diag / unit**2).sum())
        keep = sd > 1e-12 * max(1.0, float(sd.max(initial=0.0)))
        sigma2 = float(keep.sum())
        d_eff = effective_dimension(cov, 0.95, standardize=True) if keep.any() else 0
        n_budget = (budget_from_variance(sigma2, d_eff, base.n_runs, policy.fingerprint_alpha,
                                         policy.beta, shift)[0] if base.n_runs >= 2 else None)
        out.update(sigma2_source="baseline covariance", variance_class=variance_class(sig_nat),
                   sigma2_natural=sig_nat, sigma2=sigma2, d_eff=d_eff, n_budget=n_budget)
    needs = [out["n_pass_rate"], out["n_fingerprint"]]
    known = [v for v in needs if v is not None]
    out["recommended"] = max(known) if known else None
    if known and len(known) < len(needs):
        out["notes"].append("recommended covers only the tests that can reach the power")
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3g}"
    return str(v)


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import check_files, load_runs, usage_error
    from assaywatch.monitor.commands.gate_io import baselines_from_inputs, load_policy

    check_files(args.baseline, "baseline file")
    if not args.shift > 0:
        raise usage_error(f"--shift must be > 0, got {args.shift}")
    policy = load_policy(args.config)
    baselines, _ = baselines_from_inputs(args.baseline, args.strict, policy)
    if not baselines:
        raise usage_error(f"no baseline streams in {', '.join(args.baseline)}")
    cal: dict[tuple[str, str], list[Any]] = {}
    if args.calibration:
        check_files(args.calibration, "calibration file")
        runs, _ = load_runs(args.calibration, strict=args.strict, policy=policy)
        for r in runs:
            cal.setdefault((r.key.agent, r.key.scenario), []).append(r)
    plans = []
    for b in baselines:
        c = cal.get((b.key.agent, b.key.scenario))
        try:
            plans.append(plan_stream(b, policy, args.shift, c if c and len(c) >= 2 else None,
                                     n_streams=len(baselines)))
        except ValueError as exc:
            raise usage_error(str(exc)) from None
        if args.calibration and not (c and len(c) >= 2):
            plans[-1]["notes"].append("no (or one) calibration run for this stream: sigma2 "
                                      "from the baseline")
    settings = {"alpha": policy.alpha, "beta": policy.beta, "delta": policy.delta,
                "fingerprint_alpha": policy.fingerprint_alpha, "test": policy.test,
                "shift": args.shift}
    if args.json:
        print(json.dumps({"settings": settings, "streams": plans}, indent=1, default=str))
        return 0
    cols = ("stream", "baseline_runs", "baseline_pass_rate", "variance_class",
            "sigma2_natural", "d", "n_pass_rate", "n_fingerprint", "n_fingerprint_eq30",
            "n_budget", "recommended")
    head = ("stream", "n_b", "p_b", "class", "sigma2", "d", "n_pass", "n_fp", "n_fp_eq30",
            "n_budget", "recommended")
    rows = [head] + [tuple(_fmt(p[c]) for c in cols) for p in plans]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths, strict=True))))
    for p in plans:
        for note in p["notes"]:
            print(f"# {p['stream']}: {note}")
    print(f"# alpha {policy.alpha}, beta {policy.beta}, delta {policy.delta}, fingerprint "
          f"alpha {policy.fingerprint_alpha}, shift {args.shift} sd; n_* are candidate runs")
    return 0
