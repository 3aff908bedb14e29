"""The gate's error rates on the realistic (and the near-Gaussian) world, fast (issue 12).

:func:`gate_rates` repeats the gate's decision on ``n_streams`` streams with fresh baselines
and candidates drawn without replacement from pools of pre-fingerprinted runs of
``tests/realworld/world.py``. It runs the gate's own decision code
(``monitor/offline/gate.py``: :func:`stream_statistics` per stream, :func:`judge` over the
Holm family, :func:`decision`) on the counts and fingerprint matrices, so a repetition
costs what the statistics cost, not what building ``Run`` objects costs. The only step of
``decide`` left out is the coverage test, which with the default ``c_min = 0`` always
passes (``test_gate_rates.py`` checks that ``decide`` on the same runs agrees).

A baseline is a real :class:`Baseline`: the scenario's template (tools, feature names)
with the drawn runs' counts, mean and covariance. By default it is frozen (sufficient
statistics only, as a baseline JSON is); ``baseline_rows=True`` also hands the gate the
baseline's fingerprints, as when the baseline comes as span files.

:func:`gate_table` is the gate part of ``tests/benchmarks/bench_realistic.py``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.baseline import Baseline, BaselineBuilder
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.model import Outcome
from assaywatch.analyzers.verdicts import planned_sample_size
from assaywatch.monitor.offline.gate import GatePolicy, decision, judge, stream_statistics
from assaywatch.monitor.offline.report import StreamResult
from tests.realworld.world import Change, World, gaussian_world, realistic_world

F64 = NDArray[np.float64]


@dataclass
class Pool:
    """Fingerprints and outcomes of pre-generated runs of one scenario and change."""

    X: F64
    passed: NDArray[np.bool_]


@dataclass
class Pools:
    world: World
    templates: list[Baseline]
    pools: dict[tuple[int, str], Pool]


def make_pools(world: World, size: int, seed: int, drop: float = 0.1) -> Pools:
    """``size`` runs per scenario unchanged ("none") and with the pass rate down by
    ``drop`` ("pass_rate"), fingerprinted with the scenario's sorted tool inventory."""
    rng = np.random.default_rng(seed)
    templates, pools = [], {}
    for i, sc in enumerate(world.scenarios):
        tools = sorted(sc.tool_names)
        for name, change in (("none", None), ("pass_rate", Change.pass_drop(drop))):
            runs = world.runs(size, rng, change, scenario=i)
            passed = np.array([r.outcome is Outcome.PASS for r in runs])
            keep = exact_rate(passed, sc.pass_rate - (drop if change else 0.0), rng)
            pools[(i, name)] = Pool(fingerprint_matrix(runs, tools)[keep], passed[keep])
            if change is None:
                b = BaselineBuilder(world.key(i), tools=tools)
                b.add_many(runs[:50])
                templates.append(b.freeze())
    return Pools(world, templates, pools)


def exact_rate(passed: NDArray[np.bool_], rate: float, rng: np.random.Generator
               ) -> NDArray[np.int64]:
    """Indices of a random subset whose pass rate is exactly ``rate`` (as written: 0.8 is
    4/5), dropping as few surplus passes or fails as possible. A pool of 8,000 runs has a
    realised rate within about 0.004 of the model's, and since every repetition draws from
    the same pool, that offset would bias every repetition alike (a drop of 0.093 instead
    of 0.1 raises the non-inferiority test's pass rate from 0.10 to about 0.14)."""
    r = Fraction(repr(round(rate, 12)))
    pas, fai = np.flatnonzero(passed), np.flatnonzero(~passed)
    best = (0, 0)
    for f in range(fai.size, 0, -1):  # the largest subset with p/(p+f) == r exactly
        p = r / (1 - r) * f
        if p.denominator == 1 and p <= pas.size:
            best = (int(p), f)
            break
    keep = np.concatenate([rng.choice(pas, best[0], replace=False),
                           rng.choice(fai, best[1], replace=False)])
    return np.sort(keep)


@dataclass
class GateRates:
    """Decisions of ``reps`` repetitions. ``rejected``: repetitions where some test
    rejected after Holm (a pass-rate drop or a fingerprint shift): on unchanged data, the
    false positives. ``manual_for_runs``: manual reviews with no test rejected (too few runs
    to show non-inferiority). ``regressed_pass``: repetitions where the regressed stream
    passed its pass-rate test."""

    label: str
    reps: int
    decisions: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    manual_for_runs: int = 0
    regressed_pass: int = 0
    fingerprint_fail: int = 0
    calibrations: Counter[str] = field(default_factory=Counter)

    def p(self, decision_: str) -> float:
        return self.decisions[decision_] / self.reps

    def se(self, p: float) -> float:
        """Binomial standard error of a rate p over these repetitions."""
        return float(np.sqrt(max(p * (1 - p), 1e-12) / self.reps))


def _baseline(template: Baseline, key: Any, x: F64, passed: NDArray[np.bool_]) -> Baseline:
    k = int(passed.sum())
    return dataclasses.replace(template, key=key, n_runs=x.shape[0], passes=k,
                               fails=x.shape[0] - k, mean=x.mean(axis=0),
                               cov=np.cov(x, rowvar=False, ddof=1))


def gate_rates(pools: Pools, n_streams: int, n_baseline: int, n_candidate: int,
               regressed: int, reps: int, seed: int, label: str = "",
               policy: GatePolicy | None = None, baseline_rows: bool = False,
               rotate: bool = False) -> GateRates:
    """The gate's decision over ``reps`` repetitions of ``n_streams`` streams (scenarios
    in turn; ``rotate`` shifts the first scenario every repetition), the first
    ``regressed`` of them with the pass rate down by the pools' drop."""
    policy = policy or GatePolicy()
    world = pools.world
    k = len(world.scenarios)
    rng = np.random.default_rng([seed, n_streams, n_baseline, n_candidate, regressed])
    out = GateRates(label, reps)
    for rep in range(reps):
        streams: list[StreamResult] = []
        pr: list[tuple[int, Any]] = []
        fp: list[tuple[int, Any]] = []
        for s in range(n_streams):
            i = (s + (rep if rotate else 0)) % k
            base_pool = pools.pools[(i, "none")]
            idx = rng.choice(base_pool.X.shape[0], n_baseline + n_candidate, replace=False)
            xb, pb = base_pool.X[idx[:n_baseline]], base_pool.passed[idx[:n_baseline]]
            if s < regressed:
                cand = pools.pools[(i, "pass_rate")]
                cidx = rng.choice(cand.X.shape[0], n_candidate, replace=False)
                xc, pc = cand.X[cidx], cand.passed[cidx]
            else:
                xc, pc = base_pool.X[idx[n_baseline:]], base_pool.passed[idx[n_baseline:]]
            key = world.key(s)
            base = _baseline(pools.templates[i], key, xb, pb)
            sr = StreamResult(agent=key.agent, version="2.0", scenario=key.scenario,
                              baseline_version=key.version)
            streams.append(sr)
            res, h = stream_statistics(sr, base, int(pc.sum()), n_candidate, xc, policy,
                                       xb if baseline_rows else None)
            if res is not None:
                pr.append((s, res))
            if h is not None:
                fp.append((s, h))
                out.calibrations[h.calibration] += 1
        judge(streams, pr, fp, policy)
        verdict, _ = decision(streams, policy)
        out.decisions[verdict] += 1
        tests = [(s, t) for s, sr in enumerate(streams) for t in sr.tests]
        rejected = any(
            (t.name == "pass_rate" and t.statistics.get("p_value_holm", 1.0) < policy.alpha)
            or (t.name == "fingerprint" and t.verdict == "fail") for _, t in tests)
        out.rejected += rejected
        out.manual_for_runs += verdict == "manual" and not rejected
        out.fingerprint_fail += any(t.name == "fingerprint" and t.verdict == "fail"
                                    for _, t in tests)
        out.regressed_pass += regressed > 0 and any(
            s == 0 and t.name == "pass_rate" and t.verdict == "pass" for s, t in tests)
    return out


#: The must-show cases of issue 12 (the gate part): (label, streams, n_b, n_c, regressed).
def cases(n_plan: int) -> list[tuple[str, int, int, int, int]]:
    return [
        (f"20 scenarios, one regressed by delta, n = {n_plan} per arm", 20, n_plan, n_plan, 1),
        (f"20 scenarios unchanged, n = {n_plan} per arm", 20, n_plan, n_plan, 0),
        ("1 scenario unchanged, baseline 2,000 vs candidate 50", 1, 2_000, 50, 0),
    ]


def gate_table(reps: int = 400, seed: int = 20261215, pool_size: int = 8_000,
               worlds: Sequence[World] | None = None) -> list[str]:
    """The gate part of bench_realistic: the three cases of issue 12 on each world, at the
    planned n for a Holm family of 40 tests (20 streams, pass rate and fingerprint)."""
    policy = GatePolicy()
    n_plan = planned_sample_size(0.9, policy.delta, policy.alpha, policy.beta,
                                 policy.test, tests=40)  # type: ignore[arg-type]
    rows = [f"gate (decide's statistics, default policy: alpha {policy.alpha}, beta "
            f"{policy.beta}, delta {policy.delta}; planned n for 40 tests = {n_plan})",
            f"{'world':<11}{'case':<56}{'reps':>5}{'deploy':>8}{'manual':>8}{'block':>7}"
            f"{'false+':>8}{'fp fail':>8}  calibration"]
    for world in worlds or (realistic_world(), gaussian_world()):
        pools = make_pools(world, pool_size, seed)
        for label, m, n_b, n_c, regressed in cases(n_plan):
            g = gate_rates(pools, m, n_b, n_c, regressed, reps, seed + 1, label, policy,
                           rotate=m == 1)
            cal = ", ".join(f"{k} {v / sum(g.calibrations.values()):.0%}"
                            for k, v in g.calibrations.most_common())
            rows.append(f"{world.name:<11}{label:<56}{reps:>5}{g.p('deploy'):>8.3f}"
                        f"{g.p('manual'):>8.3f}{g.p('block'):>7.3f}{g.rejected / reps:>8.3f}"
                        f"{g.fingerprint_fail / reps:>8.3f}  {cal}")
    rows.append("(false+: repetitions where a test rejected after Holm, i.e. block or "
                "review caused by a pass-rate drop or a fingerprint shift; on unchanged data "
                "<= alpha is the claim. One regressed: P(deploy) <= beta is the claim. "
                "2,000 vs 50: the remaining manual share is 'too few runs to show "
                "non-inferiority', not a false positive)")
    return rows
