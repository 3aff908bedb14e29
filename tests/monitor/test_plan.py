"""``assaywatch plan``: candidate runs per stream from a baseline (exact powers, budget)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.baseline import build_baseline
from assaywatch.analyzers.baseline_file import baselines_to_json
from assaywatch.analyzers.budget import adaptive_budget
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.hotelling import hotelling_power
from assaywatch.analyzers.verdicts import candidate_sample_size, planning_rate
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.commands.plan import plan_stream, smallest_n
from assaywatch.monitor.offline.gate import GatePolicy
from tests.analyzers.simagent import simulate_runs

POLICY = GatePolicy()


@pytest.fixture(scope="module")
def runs() -> list:
    return simulate_runs(400, np.random.default_rng(12))


def test_pass_rate_n_is_the_gates_design_at_the_holm_level(runs: list) -> None:
    """plan's pass-rate size is the gate's own planner for one stream (two tests in the
    Holm family: pass rate and fingerprint), and at that size the one-sided Fisher test at
    alpha / 2 detects a drop of delta from the planning rate with power >= 1 - beta."""
    base = build_baseline(runs)
    plan = plan_stream(base, POLICY, 0.5)
    n, n_b = plan["n_pass_rate"], base.passes + base.fails
    assert n == candidate_sample_size(base.passes, n_b, POLICY.delta, POLICY.alpha,
                                      POLICY.beta, POLICY.test, tests=2)
    # Monte Carlo with scipy's hypergeometric (Fisher's one-sided p-value), the baseline's
    # counts fixed as in the plan: 20,000 draws give a standard error of 0.0021 at 0.9.
    p_plan = planning_rate(base.passes, n_b, POLICY.delta, POLICY.alpha)
    rng = np.random.default_rng(5)
    kc = rng.binomial(n, p_plan - POLICY.delta, size=20_000)
    p = stats.hypergeom.cdf(kc, n_b + n, base.passes + kc, n)
    assert np.mean(p < POLICY.alpha / 2) >= 1 - POLICY.beta - 0.01
    # and a plan for 20 streams (40 tests) needs more runs than for one
    assert plan_stream(base, POLICY, 0.5, n_streams=20)["n_pass_rate"] > n


def test_fingerprint_n_uses_the_exact_hotelling_power(runs: list) -> None:
    base = build_baseline(runs)
    plan = plan_stream(base, POLICY, 0.5)
    n, d = plan["n_fingerprint"], plan["d"]
    assert d >= 1
    assert hotelling_power(base.n_runs, n, d, 0.5, POLICY.fingerprint_alpha) >= 0.9
    assert hotelling_power(base.n_runs, n - 1, d, 0.5, POLICY.fingerprint_alpha) < 0.9
    assert plan["n_fingerprint_eq30"] > 0
    # a larger shift needs fewer runs; a small baseline cannot reach the power at all
    assert plan_stream(base, POLICY, 1.0)["n_fingerprint"] < n
    tiny = build_baseline(runs[:30])
    small = plan_stream(tiny, POLICY, 0.2)
    assert small["n_fingerprint"] is None and any("record more" in x for x in small["notes"])
    assert plan["recommended"] == max(plan["n_pass_rate"], n)


def test_more_baseline_runs_never_need_more_candidate_runs(runs: list) -> None:
    more = simulate_runs(1_200, np.random.default_rng(13))
    ns = [plan_stream(build_baseline(more[:k]), POLICY, 0.5) for k in (300, 600, 1_200)]
    # both are exact powers with n_b fixed; the baseline's rate moves a little with k, so
    # compare the fingerprint n (no rate) strictly and the pass-rate n loosely
    fp = [p["n_fingerprint"] for p in ns]
    assert fp == sorted(fp, reverse=True)
    assert ns[-1]["n_pass_rate"] <= ns[0]["n_pass_rate"] * 1.1


def test_variance_class_from_the_baseline_matches_the_natural_scale(runs: list) -> None:
    """The plan derives sigma2 from the stored covariance; it must equal the budget's
    natural-scale variance of the very runs the baseline was built from."""
    base = build_baseline(runs)
    plan = plan_stream(base, POLICY, 0.5)
    direct = adaptive_budget(fingerprint_matrix(runs, base.tools))
    assert plan["sigma2_natural"] == pytest.approx(direct.sigma2_natural, rel=1e-9)
    assert plan["variance_class"] == direct.variance_class
    assert plan["sigma2_source"] == "baseline covariance"


def test_volatile_calibration_asks_for_more_runs(runs: list) -> None:
    base = build_baseline(runs)
    rng = np.random.default_rng(14)
    calm = simulate_runs(20, rng)
    wild = [r for s in (0.2, 1.0, 5.0, 25.0) for r in simulate_runs(
        5, rng, token_scale=s, latency_scale=s, output_length_mean=400 * s, error_rate=0.5)]
    p_calm = plan_stream(base, POLICY, 0.5, calm)
    p_wild = plan_stream(base, POLICY, 0.5, wild)
    assert p_calm["sigma2_source"].startswith("calibration (20")
    assert p_wild["variance_class"] == "volatile" and p_calm["variance_class"] != "volatile"
    assert p_wild["n_budget"] > p_calm["n_budget"]


def test_smallest_n_finds_the_threshold() -> None:
    assert smallest_n(lambda n: float(n >= 137), 1.0) == 137
    assert smallest_n(lambda n: 0.0, 0.5, limit=1_000) is None


def test_plan_command_table_and_json(runs: list, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(baselines_to_json([build_baseline(runs)]))
    cfg = tmp_path / "gate.yaml"
    cfg.write_text("alpha: 0.01\n")
    assert main(["plan", "--baseline", str(path), "--json", "--config", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (s,) = doc["streams"]
    assert doc["settings"]["alpha"] == 0.01
    assert s["stream"] == "support-agent@1.0/refund"
    # a smaller alpha needs more runs than the default plan
    assert s["n_pass_rate"] > plan_stream(build_baseline(runs), POLICY, 0.5)["n_pass_rate"]
    assert main(["plan", "--baseline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "recommended" in out and "support-agent@1.0/refund" in out
    assert main(["plan", "--baseline", str(path), "--shift", "0"]) == 3
    assert "--shift" in capsys.readouterr().err
