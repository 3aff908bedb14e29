"""Multi-fidelity live gate (monitor/live/fidelity.py): statistics by seeded Monte Carlo,
then one real ``gate --run --proxy-run`` through the CLI with the simulated agent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.fidelity import combine_paired, combined_z
from assaywatch.analyzers.sprt import SPRT
from assaywatch.monitor.live.fidelity import FidelityConfig, FidelitySPRT, simulate_fidelity
from assaywatch.monitor.live.fidelity_evidence import evidence

ALPHA, BETA, THETA, DELTA, N_PLAN, KAPPA = 0.05, 0.1, 0.9, 0.1, 232, 0.1
N_REP = 6000
AGENT = Path(__file__).with_name("sim_agent.py")
CMD = f"{sys.executable} {AGENT}"


def _arr(*v: float) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in v]


def test_stouffer_combination_is_the_control_variates_z() -> None:
    rng = np.random.default_rng(11)
    n = rng.integers(20, 200, 50).astype(float)
    k = np.floor(n * rng.uniform(0.5, 1.0, 50))
    m = rng.integers(1, 300, 50).astype(float)
    s_eP = np.floor(k * rng.uniform(0.6, 0.95, 50))
    s_e = s_eP + np.floor((n - k) * 0.8)
    s_cP = np.floor(k * rng.uniform(0.6, 0.95, 50))
    s_ecP = np.minimum(s_eP, s_cP) - 1
    s_cE = np.floor(m * 0.8)
    ev = evidence(n, s_e, k, s_eP, s_cP, s_ecP, m, s_cE, THETA, 0.5)
    assert (ev.rho_u > 0).all()
    se = ev.w_target * np.sqrt(ev.f * n) / np.sqrt(n)  # sd_e sqrt(f / n)
    for i in range(50):
        z = combined_z(ev.z_target[i], ev.z_proxy[i], float(ev.corr[i]),
                       float(ev.w_target[i]), float(ev.w_proxy[i]))
        assert float(z) == pytest.approx((THETA - ev.p_hat[i]) / se[i], rel=1e-9)
    # The same through p-values (scipy's normal): combine_paired of the two one-sided p's.
    z, p = combine_paired(float(stats.norm.sf(ev.z_target[0])),
                          float(stats.norm.sf(ev.z_proxy[0])), float(ev.corr[0]),
                          float(ev.w_target[0]), float(ev.w_proxy[0]))
    assert z == pytest.approx(float((THETA - ev.p_hat[0]) / se[0]), rel=1e-6)
    assert p == pytest.approx(float(stats.norm.sf(z)))


def test_control_variates_variance_is_reduced_and_not_understated() -> None:
    # Fixed design n = k = 40 pairs, m = 80 extra proxy runs, pass/fail correlation 0.9.
    rng = np.random.default_rng(5)
    rep, n, m, p, q = 20000, 40, 80, 0.8, 0.9
    u = rng.random((rep, n))
    v = np.where(rng.random((rep, n)) < q, u, rng.random((rep, n)))
    ye, yc = u < p, v < p
    s_e = ye.sum(1).astype(float)
    ev = evidence(*_arr(np.full(rep, n), s_e, np.full(rep, n), s_e, yc.sum(1),
                        (ye & yc).sum(1), np.full(rep, m), rng.binomial(m, p, rep)),
                  theta=THETA, shrink=0.5)
    var_cv, var_plain = float(ev.p_hat.var()), p * (1 - p) / n
    # MFMC: Var = sigma^2/n (1 - rho^2 m/N) = 0.46 sigma^2/n at the true rho. The estimate
    # uses the shrunk rho_u, so it does a little worse but still halves the variance.
    assert var_cv < 0.6 * var_plain
    # Unbiased but for the O(1/n) bias of an estimated CV coefficient: measured +0.005 at
    # n = 40 (SE of the mean 0.0003), upwards, i.e. towards fewer false Fails.
    assert float(ev.p_hat.mean()) == pytest.approx(p, abs=0.01)
    # The claimed variance f sigma^2/n must not understate the real one (rel. SE of a
    # variance from 20,000 replicates: 1%).
    assert var_cv <= 1.05 * float(np.mean(ev.f)) * var_plain


def test_without_extra_runs_it_is_exactly_the_target_sprt() -> None:
    rng = np.random.default_rng(3)
    plain, fid = SPRT(THETA, DELTA, ALPHA, BETA), FidelitySPRT(
        SPRT(THETA, DELTA, ALPHA, BETA), FidelityConfig(cost_ratio=KAPPA, pay_below=-1.0))
    while plain.decision is None:
        y = bool(rng.random() < 0.85)
        fid.stage_pair(bool(rng.random() < 0.85), None)
        plain.update(y)
        fid.update(y)
        assert fid.llr == pytest.approx(plain.llr, abs=1e-12)
    assert fid.decision is plain.decision and fid.n == plain.n


def _feed(fid: FidelitySPRT, rng: np.random.Generator, rho: float, pairs: int) -> None:
    for _ in range(pairs):
        u = rng.random()
        v = u if rng.random() < rho else rng.random()
        fid.stage_pair(bool(v < 0.7), None)
        fid.update(bool(u < 0.7))


def test_proxy_switches_on_only_when_it_pays() -> None:
    cfg = FidelityConfig(cost_ratio=KAPPA)
    on = FidelitySPRT(SPRT(0.7, 0.1, 1e-6, 1e-6), cfg)  # tiny errors: no decision here
    _feed(on, np.random.default_rng(1), 1.0, 12)
    assert on.mode == "active" and on.ratio > 1 and on.extras_wanted() > 0
    assert "proxy used" in on.note
    off = FidelitySPRT(SPRT(0.7, 0.1, 1e-6, 1e-6), cfg)
    _feed(off, np.random.default_rng(2), 0.0, 30)
    assert off.mode == "fallback" and off.extras_wanted() == 0 and not off.wants_proxy
    assert "proxy not used" in off.note and "target-only SPRT" in off.note
    # A proxy as expensive as the target never pays, however correlated.
    dear = FidelitySPRT(SPRT(0.7, 0.1, 1e-6, 1e-6), FidelityConfig(cost_ratio=1.0))
    _feed(dear, np.random.default_rng(1), 1.0, 30)
    assert dear.mode == "fallback"


@pytest.fixture(scope="module")
def target_only() -> float:
    s = simulate_fidelity(SPRT(THETA, DELTA, ALPHA, BETA), N_PLAN, THETA, THETA, 0.0, KAPPA,
                          N_REP, np.random.default_rng(99),
                          FidelityConfig(cost_ratio=KAPPA, pay_below=-1.0))
    return float(s.cost(0.0).mean())  # target runs only: no proxy after calibration cost


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_type_one_and_power_within_spec_at_each_correlation(rho: float,
                                                            target_only: float) -> None:
    rng = np.random.default_rng(int(rho * 10) + 1)
    sprt = SPRT(THETA, DELTA, ALPHA, BETA)
    h0 = simulate_fidelity(sprt, N_PLAN, THETA, THETA, rho, KAPPA, N_REP, rng)
    h1 = simulate_fidelity(sprt, N_PLAN, THETA - DELTA, THETA - DELTA, rho, KAPPA, N_REP, rng)
    # Tolerance x1.5 as for the warm start (SPEC 7.5); binomial SE at 6,000 replicates is
    # 0.003 for Type I and 0.004 for power, well inside the margins.
    assert h0.fail_rate <= 1.5 * ALPHA
    assert h1.fail_rate >= 1 - 1.5 * BETA
    if rho == 0.0:  # an unrelated proxy is (almost) never used
        assert h0.active.mean() < 0.02 and h1.active.mean() < 0.02
    if rho == 0.9:  # a correlated proxy at 1/10 the cost pays: >= 10% cheaper on average
        assert h0.active.mean() > 0.4
        assert float(h0.cost(KAPPA).mean()) < 0.9 * target_only  # SE of the mean ~0.5 run


def test_type_one_holds_when_the_proxy_passes_less_often() -> None:
    # The CV correction has mean 0 whatever the proxy's own rate (module docstring).
    # p_proxy 0.85 against 0.9: pass/fail correlation 0.71 with the shared latent 90% of
    # the time, so the proxy is switched on in a good share of replicates.
    s = simulate_fidelity(SPRT(THETA, DELTA, ALPHA, BETA), N_PLAN, THETA, 0.85, 0.9, KAPPA,
                          N_REP, np.random.default_rng(7))
    assert s.fail_rate <= 1.5 * ALPHA and s.active.mean() > 0.1


# -- through the CLI -----------------------------------------------------------------

def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SIM_"))}
    return {**env, "SIM_PASS_RATE": "0.9", "SIM_TOOLS": "search:0.5,lookup:0.5",
            "SIM_SEED": "1", **kw}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fidelity")
    spans = d / "base.jsonl"
    subprocess.run([sys.executable, str(AGENT), "--spans", str(spans), "200", "refund"],
                   env=_env(SIM_SEED="100"), check=True)
    out = d / "baseline.json"
    subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "baseline", "build",
                    str(spans), "-o", str(out)], check=True, capture_output=True)
    return out


def _gate(baseline: Path, proxy: str, *extra: str,
          env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                           "--baseline", str(baseline), "--run", CMD, "--proxy-run", proxy,
                           "--loop", *extra], env=env, capture_output=True, text=True,
                          timeout=180)


def test_cli_correlated_proxy_is_used_and_cuts_target_runs(baseline: Path,
                                                           tmp_path: Path) -> None:
    junit = tmp_path / "g.xml"
    r = _gate(baseline, f"SIM_PROXY=1 SIM_PROXY_CORR=0.95 {CMD}", "--junit", str(junit),
              env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "multi-fidelity SPRT" in r.stdout and "Stouffer Z" in r.stdout
    import xml.etree.ElementTree as ET

    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert int(props["spend.proxy_runs"]) > int(props["spend.runs"])  # extra proxy runs
    # Cost measured from the spans: the proxy's tokens are a tenth of the target's.
    ratio = int(props["spend.proxy_tokens"]) / int(props["spend.proxy_runs"]) / (
        int(props["spend.tokens"]) / int(props["spend.runs"]))
    assert 0.07 < ratio < 0.13
    assert float(props["spend.total_cost_ratio_to_fixed_n"]) < 0.5


def test_cli_uncorrelated_proxy_falls_back_and_says_so(baseline: Path) -> None:
    r = _gate(baseline, f"SIM_PROXY=1 SIM_PROXY_CORR=0 {CMD}", "--proxy-cost-ratio", "0.1",
              env=_env(SIM_PASS_RATE="0.75"))
    assert r.returncode == 1, r.stdout + r.stderr  # the regression still blocks
    assert "sprt         fail" in r.stdout and "proxy not used" in r.stdout


def test_cli_proxy_flags_need_run(baseline: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                        "--baseline",
                        str(baseline), "--candidate", str(baseline), "--proxy-run", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "--proxy-run" in r.stderr and "Traceback" not in r.stderr
