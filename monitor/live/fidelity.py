"""Multi-fidelity for the live gate: ``gate --run CMD --proxy-run CMD2`` (SPEC.md 7.4).

A proxy (the candidate on a cheaper model, a smaller context, ...) whose pass/fail tracks
the target's on the same input can stand in for some target runs. The design:

**Pairing.** Every target run of scenario S with trial index i is followed by a proxy run
of the same scenario and index: both get ``ASSAYWATCH_SCENARIO=S``, ``ASSAYWATCH_RUN_INDEX=i``
and ``ASSAYWATCH_TRIAL_INDEX=i`` (the proxy also ``ASSAYWATCH_PROXY=1``), so an agent that
derives its input or seed from the index runs both on the same input. *Extra* proxy runs,
on fresh inputs, get indices from :data:`EXTRA_INDEX_OFFSET` up, which no target run uses.

**Cost.** Per run: the reported ``cost_usd`` of its steps when every paired run reports one,
else its tokens. The cost ratio kappa = c_c / c_e is the ratio of the mean proxy and target
costs over the paired runs so far, or ``--proxy-cost-ratio``.

**The estimate: control variates.** With n target outcomes y_e (mean ybar_e), k of them
paired with a proxy outcome (paired proxy mean ybar_cP) and m extra proxy outcomes (mean
ybar_cE), N = k + m:

    p_hat = ybar_e - g (ybar_cP - ybar_cE),   g = b k m / (n N),   b = rho s_e / s_c

``ybar_cP - ybar_cE`` has mean 0 whatever the proxy's own pass rate, so p_hat is unbiased
for the target's pass rate, and no proxy baseline is needed (a Stouffer combination of two
*regression* p-values would need one: the proxy's pass rate under the good version). g is
the variance-minimising coefficient, and then Var(p_hat) = f s_e^2 / n with
f = 1 - rho^2 k m / (n N): the multi-fidelity Monte Carlo estimator of Peherstorfer et al.
(2018), which the paper's proof adapts; with k = n it is the paper's n_eff = n / f.

**The decision** stays Wald's SPRT of the stream (same H0: p >= theta, H1: p <= theta -
delta, same warm start Lambda_0, same boundaries a, b, same planned maximum), on the
evidence of n_eff = n / f target-run equivalents with pass fraction p_hat:

    Lambda = Lambda_0 + n_eff (p_hat log((theta-delta)/theta)
                               + (1 - p_hat) log((1-theta+delta)/(1-theta)))

With no extra proxy run (m = 0) this *is* the target-only SPRT, exactly, so switching the
proxy on mid-test is continuous, and a proxy that does not pay costs only its paired runs.
With m > 0 Lambda has the mean and variance of a Bernoulli SPRT's LLR after n_eff runs (a
Gaussian approximation of the CV estimate), so Wald's error bounds carry over
approximately; tests/live/test_live_fidelity.py measures Type I <= 1.5 alpha and power
>= 1 - 1.5 beta (the warm start's tolerance) by seeded Monte Carlo at rho = 0, 0.5, 0.9.

**Stouffer (the report).** The same evidence is Stouffer's weighted Z of two correlated
one-sided z-scores, which is what SPEC 7.4 asks to report: the target's regression score
z_e = (theta - ybar_e) sqrt(n) / s_e and the proxy's z_c = (ybar_cP - ybar_cE) /
(s_c sqrt(1/k + 1/m)) (positive when the inputs the target saw were easier for the proxy
than fresh ones, i.e. the target's sample was lucky), with weights w_e = s_e / sqrt(n),
w_c = g s_c sqrt(1/k + 1/m) and correlation -rho sqrt(k m / (n N)):
``analyzers.fidelity.combined_z`` of them equals (theta - p_hat) / sqrt(Var(p_hat))
(tested). Control variates is therefore not an alternative to Stouffer but its
correlation-aware form with the optimal weights; the report prints z_e, z_c, the combined
Z and its fixed-sample p-value (nominal: the decision is the sequential boundary).

**rho** is the correlation of *paired per-run* pass/fail (the phi coefficient), because
the variance reduction of a pass-rate estimate depends on exactly that; the correlation
of paired fingerprints (``analyzers.fidelity.paired_correlation``, SPEC's rho) is reported
beside it. Estimated from few failures, phi is overconfident (one coincident failure in
ten pairs gives 1.0), so the test uses a shrunk value rho_u: phi of the 2x2 table with 0.5
added to each cell, then the Fisher-z lower bound tanh(atanh(phi) - shrink / sqrt(k - 3)),
floored at 0. Using rho_u <= rho in g and f is conservative: the true variance of p_hat is
then at most f s_e^2 / n.

**Allocation and "only when it pays".** Calibration: paired runs only (m = 0, the
target-only SPRT). From :data:`CAL_MIN` pairs on, after each pair: r = n_c / n_e =
max(1, ``allocation_ratio``(rho_u, c_e, c_c, s_e^2, s_c^2)) (SPEC 7.4; n_c counts every
proxy run, so r < 1 would mean no extra run and no gain), and the predicted cost per unit
of evidence relative to the target alone, R = (1 - rho_u^2 (1 - 1/r)) (1 + r kappa). If
R <= :data:`PAY_BELOW` the proxy is switched on with that r: from then on each target run
brings its paired proxy run and enough extra proxy runs to keep N = r k. If no pair up to
:data:`CAL_MAX` makes it pay, the proxy is stopped and the target-only SPRT goes on (the
report says so, with rho_u and R). The SPEC ratio is not the MFMC optimum
sqrt(kappa^-1 rho^2 / (1 - rho^2)) (6.5 instead of 2.8 at rho = 0.9, kappa = 0.1); it spends
fewer proxy runs and costs about 15% more per unit of evidence there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

from assaywatch.analyzers.fidelity import combined_z, paired_correlation
from assaywatch.analyzers.model import Run, Verdict
from assaywatch.analyzers.sprt import SPRT, llr_steps
from assaywatch.monitor.live.fidelity_evidence import (
    Evidence,
    FArr,
    choose_ratio,
    evidence,
    predicted_cost,
    sd_hat,
    shrunk_phi,
)
from assaywatch.monitor.live.sequential import SPRTOutcomes
from assaywatch.monitor.offline.report import TestResult

#: Pairs before the first pays-check, and the last pair at which the proxy may start.
CAL_MIN = 10
CAL_MAX = 30
#: The proxy is used only if it is predicted to cost at most this share of the target alone.
PAY_BELOW = 0.9
#: Fisher-z standard errors subtracted from atanh(phi) (a one-sided ~69% lower bound).
SHRINK = 0.5
#: Trial indices of extra (unpaired) proxy runs start here.
EXTRA_INDEX_OFFSET = 500_000

@dataclass(frozen=True)
class FidelityConfig:
    """Multi-fidelity settings; ``cost_ratio`` None: estimated from the paired runs."""

    cost_ratio: float | None = None
    cal_min: int = CAL_MIN
    cal_max: int = CAL_MAX
    pay_below: float = PAY_BELOW
    shrink: float = SHRINK

    def __post_init__(self) -> None:
        if self.cost_ratio is not None and not self.cost_ratio > 0:
            raise ValueError(f"--proxy-cost-ratio must be > 0, got {self.cost_ratio}")
        if not 4 <= self.cal_min <= self.cal_max:
            raise ValueError(f"need 4 <= cal_min <= cal_max, got {self.cal_min}, {self.cal_max}")


def run_cost(run: Run) -> tuple[float, int]:
    """(reported cost in USD, tokens) of one run."""
    return sum(s.cost_usd or 0.0 for s in run.steps), run.total_tokens


@dataclass
class _Counts:
    n: int = 0
    s_e: int = 0
    k: int = 0
    s_eP: int = 0
    s_cP: int = 0
    s_ecP: int = 0
    m: int = 0
    s_cE: int = 0

    def arrays(self) -> tuple[FArr, ...]:
        return tuple(np.array(float(v)) for v in (self.n, self.s_e, self.k, self.s_eP,
                                                   self.s_cP, self.s_ecP, self.m, self.s_cE))


@dataclass
class _Costs:
    usd: list[tuple[float, float]] = field(default_factory=list)
    tokens: list[tuple[int, int]] = field(default_factory=list)


class FidelitySPRT(SPRT):
    """The stream's SPRT fed with target runs, their paired proxies and extra proxies.

    A drop-in for the :class:`~assaywatch.analyzers.sprt.SPRT` of a
    :class:`~assaywatch.monitor.live.sequential.StreamTest` (same theta, delta, alpha,
    beta, initial LLR): call :meth:`stage_pair` with the paired proxy's outcome before the
    stream's ``update`` of its target run, and :meth:`add_extra` for each extra proxy run.
    """

    def __init__(self, base: SPRT, config: FidelityConfig) -> None:
        super().__init__(base.theta, base.delta, base.alpha, base.beta, None)
        self._llr0 = base.llr
        self.config = config
        self.counts = _Counts()
        self.costs = _Costs()
        self.mode = "calibrating"
        self.ratio = 1.0
        self.kappa: float | None = config.cost_ratio
        self.predicted = float("nan")
        self.switch_pair: int | None = None
        self.note = ""
        self._staged: bool | None = None
        self.extra_index = EXTRA_INDEX_OFFSET  # last trial index handed to an extra run
        self.extras_pending = 0  # extra runs dispatched, not yet recorded (the runner's)
        self.fingerprints: list[tuple[FArr, FArr]] = []  # paired (target, proxy)
        self._step_p, self._step_f = llr_steps(base.theta, base.delta)

    # -- feeding ----------------------------------------------------------------------
    @property
    def wants_proxy(self) -> bool:
        return self.mode != "fallback" and self._decision is None

    def stage_pair(self, proxy_passed: bool | None, costs: tuple[Run, Run] | None) -> None:
        """The paired proxy's outcome (None: unknown) for the next target update."""
        self._staged = proxy_passed
        if costs is not None:
            (ue, te), (uc, tc) = run_cost(costs[0]), run_cost(costs[1])
            self.costs.usd.append((ue, uc))
            self.costs.tokens.append((te, tc))

    def unstage(self) -> None:
        self._staged = None

    def extras_wanted(self) -> int:
        """Extra proxy runs needed now to keep N = r k."""
        if self.mode != "active" or self._decision is not None:
            return 0
        c = self.counts
        return max(0, math.ceil(self.ratio * c.k - 1e-9) - (c.k + c.m))

    def add_extra(self, passed: bool) -> None:
        if self._decision is not None:
            self._n_ignored += 1
            return
        self.counts.m += 1
        self.counts.s_cE += bool(passed)
        self._decide()

    def update(self, passed: bool) -> None:
        if self._decision is not None:
            self._n_ignored += 1
            return
        c = self.counts
        c.n += 1
        c.s_e += bool(passed)
        proxy, self._staged = self._staged, None
        if proxy is not None and self.mode != "fallback":
            c.k += 1
            c.s_eP += bool(passed)
            c.s_cP += bool(proxy)
            c.s_ecP += bool(passed and proxy)
            if self.mode == "calibrating":
                self._check_pays()
        self._decide()

    # -- state ------------------------------------------------------------------------
    def cost_ratio(self) -> float | None:
        """kappa: given, else mean proxy / mean target cost (USD if all report it)."""
        if self.config.cost_ratio is not None:
            return self.config.cost_ratio
        usd = np.array(self.costs.usd, dtype=np.float64).reshape(-1, 2)
        tok = np.array(self.costs.tokens, dtype=np.float64).reshape(-1, 2)
        for pairs in (usd, tok):
            if len(pairs) and (pairs > 0).all():
                return float(pairs[:, 1].mean() / pairs[:, 0].mean())
        return None

    def evidence(self) -> Evidence:
        return evidence(*self.counts.arrays(), theta=self.theta, shrink=self.config.shrink)

    def _check_pays(self) -> None:
        c, cfg = self.counts, self.config
        if c.k < cfg.cal_min:
            return
        self.kappa = self.cost_ratio()
        if self.kappa is None:
            if c.k >= cfg.cal_max:
                self.mode = "fallback"
                self.note = ("proxy not used: no cost on the runs' spans (no cost_usd, no "
                             "tokens); give --proxy-cost-ratio")
            return
        rho = shrunk_phi(*(np.array(float(v)) for v in (c.k, c.s_eP, c.s_cP, c.s_ecP)),
                         shrink=cfg.shrink)
        sd_e, sd_c = sd_hat(np.array(float(c.s_eP)), np.array(float(c.k))), sd_hat(
            np.array(float(c.s_cP)), np.array(float(c.k)))
        r = choose_ratio(rho, np.array(self.kappa), sd_e, sd_c)
        self.predicted = float(predicted_cost(rho, np.array(self.kappa), r))
        if self.predicted <= cfg.pay_below:
            self.mode, self.ratio, self.switch_pair = "active", float(r), c.k
            self.note = (f"proxy used from pair {c.k}: rho_u {float(rho):.2f}, cost ratio "
                         f"{self.kappa:.3f}, r = n_c/n_e {self.ratio:.2f}, predicted cost "
                         f"{self.predicted:.2f} of the target alone")
        elif c.k >= cfg.cal_max:
            self.mode = "fallback"
            self.note = (f"proxy not used: rho_u {float(rho):.2f} after {c.k} pairs (cost "
                         f"ratio {self.kappa:.3f}) predicts {self.predicted:.2f} of the "
                         f"target-alone cost (> {cfg.pay_below}); target-only SPRT")

    def _decide(self) -> None:
        llr = self.llr
        if llr <= self._a:
            self._decision = Verdict.PASS
        elif llr >= self._b:
            self._decision = Verdict.FAIL

    @property
    def llr(self) -> float:
        c = self.counts
        if c.m == 0:  # exactly the target-only SPRT
            return self._llr0 + c.s_e * self._step_p + (c.n - c.s_e) * self._step_f
        ev = self.evidence()
        n_eff = c.n / float(ev.f)
        p = float(ev.p_hat)
        return self._llr0 + n_eff * (p * self._step_p + (1 - p) * self._step_f)

    @property
    def n(self) -> int:
        return self.counts.n


@dataclass(frozen=True)
class FidelitySimulation(SPRTOutcomes):
    """Replicates of :func:`simulate_fidelity`: ``sprt`` +1 Fail, -1 Pass, 0 undecided;
    runs spent on each side; whether the proxy was switched on."""

    sprt: NDArray[np.int8]
    n_target: NDArray[np.int64]
    n_proxy: NDArray[np.int64]
    active: NDArray[np.bool_]

    def cost(self, kappa: float) -> NDArray[np.float64]:
        """Cost in target-run units: n_target + kappa n_proxy."""
        out: NDArray[np.float64] = self.n_target + kappa * self.n_proxy
        return out


def simulate_fidelity(sprt: SPRT, n_plan: int, p_target: float, p_proxy: float, rho: float,
                      kappa: float, n_rep: int, rng: np.random.Generator,
                      config: FidelityConfig | None = None) -> FidelitySimulation:
    """:class:`FidelitySPRT` vectorised over replicates, on simulated paired Bernoulli runs.

    Each input has a latent uniform u; the target passes iff u < p_target, the proxy iff
    v < p_proxy with v = u with probability ``rho`` and a fresh uniform otherwise, so the
    pass/fail correlation is ``rho`` when p_target = p_proxy. Extra proxy runs are fresh
    inputs (binomial counts). Same statistic, same pays rule and the same order as the
    runner (the target run and its pair, a decision check, then the block's extra runs,
    another check), truncated at ``n_plan`` target runs. ``sprt`` gives theta, delta, the
    boundaries and Lambda_0 (its current LLR).
    """
    cfg = config or FidelityConfig(cost_ratio=kappa)
    a, b = sprt.lower, sprt.upper
    sp, sf = llr_steps(sprt.theta, sprt.delta)
    z = np.zeros(n_rep)
    n, s_e, k, s_eP, s_cP, s_ecP, m, s_cE = (z.copy() for _ in range(8))
    mode = np.zeros(n_rep, dtype=np.int8)  # 0 calibrating, 1 active, 2 fallback
    ratio = np.ones(n_rep)
    out = np.zeros(n_rep, dtype=np.int8)
    n_t = np.full(n_rep, n_plan, dtype=np.int64)
    running = np.ones(n_rep, dtype=bool)

    def check(llr: FArr) -> None:
        nonlocal running
        fail, ok = running & (llr >= b), running & (llr <= a)
        out[fail], out[ok] = 1, -1
        n_t[fail | ok] = n[fail | ok].astype(np.int64)
        running = running & ~(fail | ok)

    def llr_now() -> FArr:
        ev = evidence(n, s_e, k, s_eP, s_cP, s_ecP, m, s_cE, sprt.theta, cfg.shrink)
        exact = sprt.llr + s_e * sp + (n - s_e) * sf
        n_eff = n / ev.f
        cv = sprt.llr + n_eff * (ev.p_hat * sp + (1 - ev.p_hat) * sf)
        res: FArr = np.where(m > 0, cv, exact)
        return res

    for _ in range(n_plan):
        u = rng.random(n_rep)
        v = np.where(rng.random(n_rep) < rho, u, rng.random(n_rep))
        ye, yc = (u < p_target) & running, (v < p_proxy) & running
        paired = running & (mode != 2)
        n += running
        s_e += ye
        k += paired
        s_eP += ye & paired
        s_cP += yc & paired
        s_ecP += ye & yc & paired
        cal = paired & (mode == 0) & (k >= cfg.cal_min)
        if cal.any():
            i = np.flatnonzero(cal)
            rho_u = shrunk_phi(k[i], s_eP[i], s_cP[i], s_ecP[i], cfg.shrink)
            kap = np.full(i.size, kappa)
            r = choose_ratio(rho_u, kap, sd_hat(s_eP[i], k[i]), sd_hat(s_cP[i], k[i]))
            pays = predicted_cost(rho_u, kap, r) <= cfg.pay_below
            ratio[i[pays]] = r[pays]
            mode[i[pays]] = 1
            mode[i[~pays & (k[i] >= cfg.cal_max)]] = 2
        check(llr_now())
        need = np.where(running & (mode == 1),
                        np.maximum(0, np.ceil(ratio * k - 1e-9) - (k + m)), 0).astype(np.int64)
        if need.any():
            m += need
            s_cE += rng.binomial(need, p_proxy)
            check(llr_now())
        if not running.any():
            break
    return FidelitySimulation(out, n_t, (k + m).astype(np.int64), mode == 1)


def fidelity_result(sprt_result: TestResult, fid: FidelitySPRT) -> TestResult:
    """The stream's ``sprt`` test result with the multi-fidelity figures and Stouffer Z."""
    c, ev = fid.counts, fid.evidence()
    z = float(combined_z(ev.z_target, ev.z_proxy, float(ev.corr), float(ev.w_target),
                         float(ev.w_proxy)))
    rho_fp = (paired_correlation(np.array([a for a, _ in fid.fingerprints]),
                                 np.array([b for _, b in fid.fingerprints]))
              if len(fid.fingerprints) >= 3 else None)
    stats: dict[str, float | int | str | None] = dict(sprt_result.statistics)
    stats.update({
        "proxy_mode": fid.mode, "proxy_pairs": c.k, "proxy_extra_runs": c.m,
        "rho_passfail": float(ev.rho_u), "rho_fingerprint": rho_fp,
        "cost_ratio": fid.kappa, "allocation_ratio": fid.ratio,
        "predicted_cost": None if math.isnan(fid.predicted) else round(fid.predicted, 3),
        "n_eff": round(c.n / float(ev.f), 2), "p_hat_cv": float(ev.p_hat),
        "z_target": float(ev.z_target), "z_proxy": float(ev.z_proxy),
        "z_corr": float(ev.corr), "stouffer_z": z, "stouffer_p": float(norm.sf(z))})
    note = fid.note
    if fid.mode == "calibrating":
        note = (f"proxy not used: the target-only SPRT stopped during calibration "
                f"({c.k} pairs)")
    if fid.mode == "active":
        msg = (f"multi-fidelity {sprt_result.message}; {c.k} paired + {c.m} extra proxy "
               f"runs, n_eff {c.n / float(ev.f):.1f}; Stouffer Z {z:.2f} (target z "
               f"{float(ev.z_target):.2f}, proxy z {float(ev.z_proxy):.2f}, corr "
               f"{float(ev.corr):.2f}); {note}")
    else:
        msg = f"{sprt_result.message}; {note}"
    return TestResult(sprt_result.name, sprt_result.verdict, stats, msg)
