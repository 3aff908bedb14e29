from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.fidelity import (
    allocation_ratio,
    combine_paired,
    combined_z,
    paired_correlation,
    stouffer,
)
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from tests.analyzers.simagent import simulate_runs

TOOLS = ["calc", "lookup", "search"]


@pytest.mark.parametrize(
    ("p", "w"),
    [
        ([0.01, 0.2, 0.5], None),
        ([0.03, 0.4], [2.0, 1.0]),
        ([0.9, 0.8, 0.2, 0.001], [1, 2, 3, 4]),
        ([1e-12, 0.999], [0.5, 0.5]),
    ],
)
def test_stouffer_matches_scipy(p: list[float], w: list[float] | None) -> None:
    z, pv = stouffer(p, w)
    ref = stats.combine_pvalues(p, method="stouffer", weights=w)
    assert z == pytest.approx(ref.statistic, rel=1e-10)
    assert pv == pytest.approx(ref.pvalue, rel=1e-9)


def test_stouffer_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stouffer([1.2])
    with pytest.raises(ValueError, match="weights"):
        stouffer([0.1, 0.2], [1.0])


def test_combine_paired_reduces_to_stouffer_when_independent() -> None:
    z, p = combine_paired(0.02, 0.1, rho=0.0, w_target=2.0, w_proxy=1.0)
    ref = stats.combine_pvalues([0.02, 0.1], method="stouffer", weights=[2.0, 1.0])
    assert z == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def test_combine_paired_controls_type_one_error_under_correlation() -> None:
    # z-scores with correlation 0.8 under H0, 100000 draws (vectorised core): the corrected
    # combination rejects at alpha (3 binomial sd = 0.002), the naive Stouffer (rho = 0 in
    # the formula) at the closed-form 0.110.
    rng = np.random.default_rng(1)
    rho, reps, alpha = 0.8, 100_000, 0.05
    zz = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=reps)
    crit = stats.norm.isf(alpha)
    corrected = float(np.mean(combined_z(zz[:, 0], zz[:, 1], rho) > crit))
    naive = float(np.mean(combined_z(zz[:, 0], zz[:, 1], 0.0) > crit))
    assert abs(corrected - alpha) <= 3 * math.sqrt(alpha * (1 - alpha) / reps)
    naive_exact = stats.norm.sf(crit * math.sqrt(2 / (2 + 2 * rho)))
    assert abs(naive - naive_exact) <= 3 * math.sqrt(naive_exact * (1 - naive_exact) / reps)
    assert naive_exact > 0.1
    # the scalar API is the same computation on p-values
    for a, b in zz[:20]:
        z, p = combine_paired(float(stats.norm.sf(a)), float(stats.norm.sf(b)), rho)
        assert z == pytest.approx(float(combined_z(a, b, rho)), rel=1e-8, abs=1e-10)
        assert p == pytest.approx(float(stats.norm.sf(z)))


def test_unrelated_agents_score_near_zero_and_noisy_copy_high() -> None:
    rng = np.random.default_rng(2)
    target = fingerprint_matrix(simulate_runs(300, rng), TOOLS)
    unrelated = fingerprint_matrix(
        simulate_runs(
            300, rng, tool_weights={"search": 0.2, "lookup": 0.2, "calc": 0.6}, token_scale=0.3
        ),
        TOOLS,
    )
    # the released code's mean-vector correlation calls these agents near-identical
    assert np.corrcoef(target.mean(0), unrelated.mean(0))[0, 1] > 0.9
    assert abs(paired_correlation(target, unrelated)) < 0.2
    sd = target.std(axis=0)
    proxy = target + rng.normal(0.0, 0.3 * sd + 1e-12, target.shape)
    assert paired_correlation(target, proxy) > 0.8
    assert paired_correlation(target, target) == pytest.approx(1.0)
    assert paired_correlation(target, -target) == pytest.approx(-1.0)


def test_paired_correlation_edge_cases() -> None:
    assert paired_correlation(np.ones((5, 3)), np.ones((5, 3))) == 0.0
    with pytest.raises(ValueError, match="same"):
        paired_correlation(np.ones((5, 3)), np.ones((4, 3)))


def test_allocation_ratio_formula() -> None:
    # rho sqrt(c_e s_c^2 / (c_c s_e^2)) with c_e = 10, c_c = 1, equal variances: 0.8 sqrt(10)
    assert allocation_ratio(0.8, 10.0, 1.0, 1.0, 1.0) == pytest.approx(0.8 * math.sqrt(10))
    assert allocation_ratio(0.5, 4.0, 1.0, 1.0, 4.0) == pytest.approx(0.5 * 4.0)
    assert allocation_ratio(0.0, 10.0, 1.0, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="costs"):
        allocation_ratio(0.5, 0.0, 1.0, 1.0, 1.0)
