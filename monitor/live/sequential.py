"""The per-stream sequential decision of the live gate (SPEC.md 3.5, 7.2, 7.5).

One :class:`StreamTest` per candidate stream (agent, scenario) is fed each run as it
arrives and stops the stream at the first decision:

``sprt``
    Wald's SPRT on the pass rate, H0: p >= theta against H1: p <= theta - delta, theta the
    baseline's pass rate (the monitor's choice, ``--theta`` overrides it). It is
    **warm-started** from the baseline's runs by :class:`~assaywatch.analyzers.sprt.
    WarmStartSPRT` (SPEC 7.5 redesign): full weight when the baseline holds runs of the
    very version under test, a power-prior discount otherwise, and in every case an initial
    LLR capped so that the rigorous bounds exp(Lambda_0 - b) and exp(a - Lambda_0) stay
    within ``inflation`` (1.5) times alpha and beta, strictly inside (a, b): the warm start
    never decides by itself.
``fingerprint``
    A sequential behaviour test: the per-feature two-sided CUSUM of
    :class:`~assaywatch.analyzers.detectors.FingerprintCUSUM` on the fingerprint
    standardised by the baseline, tuned to detect a shift of ``fingerprint_shift`` baseline
    sd (default 1). A CUSUM is calibrated by its in-control ARL0; the gate needs instead a
    false-alarm probability over a *finite* horizon of n_plan runs. For Gaussian features
    the run length from a fresh start is close to geometric with mean ARL0, so
    P(alarm within n) ~ 1 - exp(-n / ARL0) and ARL0 = n_plan / -ln(1 - alpha_fp) would do.
    Real fingerprints are not Gaussian: step shares are discrete (a run without a tool has
    frac_llm = 1), ``any_error`` is binary, and the baseline's mean and sd are estimates.
    Measured on the skewed simulated runs of tests/analyzers/simagent.py with a 300-run
    baseline, that Gaussian calibration false-alarms in 28% of 232-run horizons at
    alpha_fp = 0.05. The gate therefore winsorises at 2.5 sd (``fingerprint_clip``) and
    calibrates for alpha_fp / ``fingerprint_safety`` (10): measured 3.2% (tests/live/
    test_live_sequential.py asserts <= alpha_fp). This is an empirical calibration, not a
    guarantee for every agent; a baseline built from span files could be bootstrapped
    instead (not done yet). A CUSUM has no accept boundary: "pass" means no alarm in the
    runs the SPRT needed.

``evaluation:<evaluator>``
    For each evaluator in the baseline (graded scores), the anytime-valid
    :class:`~assaywatch.analyzers.score_tests.SequentialScoreTest` (two betting
    e-processes: the mean dropped, or it is no worse than baseline - ``score_drop``), at
    alpha / m and beta like the SPRT. A graded score carries far more information per run
    than its pass/fail bit, so these decide in fewer runs (benchmark in README). With
    ``scores_decide`` (the default) a stream whose every evaluator has passed stops there:
    the SPRT, undecided at that point, is reported as superseded and does not send the
    gate to review; a Fail of either still blocks.

Stopping: SPRT Pass or Fail, a fingerprint alarm, an evaluation Fail, every evaluation
Pass (``scores_decide``), or the **planned maximum**
n_plan = min(n_max, max(n_fixed, n_budget)) with n_fixed the fixed-n design of SPEC Eq. 6
(a sequential test that runs past the fixed design's size has no reason to exist; the
truncation costs almost nothing: at theta = 0.9, delta = 0.1 it leaves 0.8% undecided at
p = theta and power 0.895) and n_budget the adaptive budget (SPEC 7.2) computed from the
baseline's own fingerprint variance on the natural scale, which only raises the cap for
volatile agents whose fingerprint test needs more runs. Undecided at n_plan: Inconclusive.

Multiplicity: with m streams each test runs at alpha / m (Bonferroni), so the live gate's
family-wise error over its streams stays at alpha as Holm keeps it for the offline gate
(SPEC 3.8): sequential tests have no final p-value to feed Holm.

:func:`simulate` runs the same decision vectorised over replicates, from the parameters
of a :class:`StreamTest`, for the Monte Carlo of Type I, power and runs spent.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.budget import budget_from_variance
from assaywatch.analyzers.detectors.fingerprint_cusum import FingerprintCUSUM
from assaywatch.analyzers.fingerprint import FIXED_FEATURES
from assaywatch.analyzers.hotelling import effective_dimension
from assaywatch.analyzers.model import Verdict
from assaywatch.analyzers.score_tests import SequentialScoreTest
from assaywatch.analyzers.sprt import SPRT, WarmStartSPRT
from assaywatch.analyzers.verdicts import sample_size

_COUNTS = (FIXED_FEATURES.index("max_depth"), FIXED_FEATURES.index("branches"))


@dataclass(frozen=True)
class LiveConfig:
    """Settings of the sequential decision (from the gate policy and the CLI).

    alpha, beta, delta:
        SPRT errors and the pass-rate drop that counts (family-wise alpha over streams).
    fingerprint_alpha:
        False-alarm probability of the fingerprint test over the planned horizon.
    theta:
        Pass rate to keep; None: the baseline's.
    n_max:
        Cap on candidate runs per stream.
    warm_start, fingerprint:
        Switch the warm start and the fingerprint test (benchmarks compare them).
    inflation, discount:
        Warm-start cap factor and power-prior weight of other-version runs (SPEC 7.5).
    fingerprint_shift:
        Shift in baseline sd the CUSUM is tuned to (k = shift / 2). 1 sd by default, not
        the monitor's 0.5: the gate's horizon is at most n_plan runs, and a CUSUM tuned to
        0.5 sd needs a threshold near twice as high (h = 18.6 against 10.1 for 17 features
        over 232 runs), so it would rarely decide within the runs the SPRT spends.
    fingerprint_clip, fingerprint_safety:
        Winsorising bound (sd) and the divisor of alpha_fp in the horizon calibration
        (module docstring: why both are needed on real, non-Gaussian fingerprints).
    delta_min:
        Natural-scale shift of the adaptive budget (SPEC 7.2).
    n_streams:
        m of the Bonferroni split.
    score_drop, scores, scores_decide, calibrate_scores:
        The evaluation tests: the drop of a mean score (fraction of its scale) that
        counts, whether they run, whether their unanimous Pass stops a stream, and whether
        their thresholds are calibrated on the baseline's law over the n_plan horizon
        (:meth:`SequentialScoreTest.calibrate`) rather than the anytime-valid ones.
    """

    alpha: float = 0.05
    beta: float = 0.1
    delta: float = 0.1
    fingerprint_alpha: float = 0.05
    theta: float | None = None
    n_max: int = 500
    warm_start: bool = True
    fingerprint: bool = True
    inflation: float = 1.5
    discount: float = 0.1
    fingerprint_shift: float = 1.0
    fingerprint_clip: float = 2.5
    fingerprint_safety: float = 10.0
    delta_min: float = 0.5
    n_streams: int = 1
    score_drop: float = 0.1
    scores: bool = True
    scores_decide: bool = True
    calibrate_scores: bool = True

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "delta", "fingerprint_alpha"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise ValueError(f"live gate: {name} must lie strictly between 0 and 1, got {v}")
        if self.n_max < 1 or self.n_streams < 1:
            raise ValueError(f"live gate: n_max and n_streams must be >= 1, got "
                             f"{self.n_max}, {self.n_streams}")


#: Calibrated thresholds of evaluation tests by (baseline id, evaluator, horizon, alpha,
#: beta, drop): a gate builds one test per stream, simulations and benchmarks many.
_SCORE_THRESHOLDS: dict[tuple[object, ...], tuple[float, float]] = {}


def horizon_arl0(n: int, alpha: float) -> float:
    """ARL0 giving a false-alarm probability <= alpha within n runs: n / -ln(1 - alpha)."""
    return n / -math.log1p(-alpha)


def clamp_theta(p: float, delta: float) -> float:
    """Keep theta and theta - delta inside (0, 1) so the SPRT's LLR steps are finite."""
    return float(min(max(p, delta + 0.01), 0.995))


def baseline_budget(base: Baseline, alpha: float, beta: float, delta_min: float) -> int:
    """Adaptive budget n* (SPEC 7.2) from the baseline's fingerprint covariance.

    The natural scale of ``analyzers.budget``: the two count features are divided by
    max(1, mean), every other feature is unit-free already. sigma2 is the trace of the
    rescaled covariance, d_eff its effective dimension, k the baseline's size.
    """
    if base.n_runs < 2:
        return 0
    unit = np.ones(len(base.mean))
    for j in _COUNTS:
        unit[j] = max(1.0, abs(float(base.mean[j])))
    cov = base.cov / np.outer(unit, unit)
    d_eff = effective_dimension(cov) if float(np.trace(cov)) > 0 else 0
    return budget_from_variance(float(np.trace(cov)), d_eff, base.n_runs, alpha, beta,
                                delta_min)[1]


class StreamTest:
    """The sequential decision of one candidate stream (module docstring).

    Parameters
    ----------
    baseline:
        The stream's baseline (pass counts, fingerprint mean and sd, version).
    config:
        The live gate's settings.
    candidate_version:
        The version under test: baseline runs of the same version count fully in the warm
        start, others are discounted.
    """

    def __init__(self, baseline: Baseline, config: LiveConfig, candidate_version: str) -> None:
        self.baseline = baseline
        self.config = config
        self.candidate_version = candidate_version
        m = config.n_streams
        self.alpha = config.alpha / m
        self.fingerprint_alpha = config.fingerprint_alpha / m
        n_b = baseline.passes + baseline.fails
        p_b = baseline.pass_rate
        raw_theta = config.theta if config.theta is not None else (p_b if p_b is not None else 0.9)
        self.theta = clamp_theta(raw_theta, config.delta)
        self.same_version = baseline.key.version == candidate_version
        self.sprt: SPRT
        if config.warm_start and n_b:
            self.sprt = WarmStartSPRT(self.theta, config.delta, self.alpha, config.beta, None,
                                      baseline.passes, n_b, self.same_version,
                                      config.inflation, config.discount)
        else:
            self.sprt = SPRT(self.theta, config.delta, self.alpha, config.beta)
        self.llr0 = self.sprt.llr
        self.n_fixed = sample_size(self.theta, config.delta, self.alpha, config.beta)
        self.n_budget = baseline_budget(baseline, self.alpha, config.beta, config.delta_min)
        self.n_plan = min(config.n_max, max(self.n_fixed, self.n_budget))
        self.detector: FingerprintCUSUM | None = None
        if config.fingerprint and baseline.n_runs >= 2:
            self.detector = FingerprintCUSUM(
                mean=baseline.mean, sd=baseline.sd, k=config.fingerprint_shift / 2,
                arl0=horizon_arl0(self.n_plan,
                                  self.fingerprint_alpha / config.fingerprint_safety),
                feature_names=list(baseline.feature_names), clip=config.fingerprint_clip)
        self.score_tests: dict[str, SequentialScoreTest] = {}
        if config.scores:
            for name, summary in sorted(baseline.evaluators.items()):
                if summary.n >= 2:
                    test = SequentialScoreTest(name, summary, alpha=self.alpha,
                                               beta=config.beta, drop=config.score_drop)
                    if config.calibrate_scores:
                        key = (baseline.baseline_id, name, self.n_plan, test.alpha,
                               test.beta, test.drop)
                        known = _SCORE_THRESHOLDS.get(key)
                        if known is None:
                            test.calibrate(self.n_plan, seed=zlib.crc32(
                                f"{baseline.baseline_id}:{name}".encode()))
                            known = _SCORE_THRESHOLDS[key] = (test.h_fail, test.h_pass)
                        test.h_fail, test.h_pass = known
                        test.calibrated = True
                    self.score_tests[name] = test
        self.n_runs = 0
        self.passes = 0
        self.fails = 0
        self.unknown = 0
        self.ignored = 0
        self.alarm_at: int | None = None
        self.alarm_features: list[str] = []
        self.llr_path: list[float] = []

    # -- feeding ----------------------------------------------------------------------
    def update(self, passed: bool | None, fingerprint: NDArray[np.float64] | None,
               scores: Mapping[str, float] | None = None) -> None:
        """Add one run: its outcome (None: unknown), fingerprint (None: none) and graded
        scores by evaluator."""
        if self.done:
            self.ignored += 1
            return
        self.n_runs += 1
        if passed is None:
            self.unknown += 1
        else:
            self.passes += bool(passed)
            self.fails += not passed
            self.sprt.update(bool(passed))
        self.llr_path.append(float(self.sprt.llr))
        for name, score in (scores or {}).items():
            test = self.score_tests.get(name)
            if test is not None:
                test.update(score)
        if self.detector is not None and fingerprint is not None:
            self.detector.update(fingerprint)
            if self.detector.drift_detected and self.alarm_at is None:
                self.alarm_at = self.n_runs
                self.alarm_features = list(self.detector.features_alarmed)

    # -- state ------------------------------------------------------------------------
    @property
    def sprt_decision(self) -> Verdict | None:
        return self.sprt.decision

    @property
    def scores_failed(self) -> bool:
        return any(t.decision is Verdict.FAIL for t in self.score_tests.values())

    @property
    def scores_passed(self) -> bool:
        """Every evaluation test passed (False without any)."""
        return bool(self.score_tests) and all(t.decision is Verdict.PASS
                                              for t in self.score_tests.values())

    @property
    def sprt_superseded(self) -> bool:
        """The evaluations decided the stream before the SPRT (``scores_decide``)."""
        return (self.config.scores_decide and self.sprt.decision is None
                and self.scores_passed)

    @property
    def done(self) -> bool:
        if self.score_tests and self.sprt.decision is Verdict.PASS:
            # the pass rate held; the graded evaluators still have to decide
            return (self.alarm_at is not None or self.scores_failed or self.scores_passed
                    or self.n_runs >= self.n_plan)
        return (self.sprt.decision is not None or self.alarm_at is not None
                or self.scores_failed or self.sprt_superseded
                or self.n_runs >= self.n_plan)

    @property
    def stopped_by(self) -> str:
        """What ended (or will end) the stream: sprt, fingerprint, evaluation,
        planned_maximum, running."""
        if self.scores_failed or (self.score_tests and self.scores_passed):
            return "evaluation"
        if self.sprt.decision is not None:
            return "sprt"
        if self.alarm_at is not None:
            return "fingerprint"
        return "planned_maximum" if self.n_runs >= self.n_plan else "running"

    @property
    def bounds(self) -> tuple[float, float]:
        return self.sprt.lower, self.sprt.upper

    def sprt_verdict(self) -> tuple[Verdict, str]:
        """The pass-rate verdict with a one-line reason."""
        d, n = self.sprt.decision, self.sprt.n
        h1 = self.theta - self.config.delta
        if d is Verdict.FAIL:
            return d, (f"SPRT: pass rate below {h1:.3f} rather than at least {self.theta:.3f} "
                       f"after {n} runs (LLR {self.sprt.llr:.2f} >= {self.sprt.upper:.2f})")
        if d is Verdict.PASS:
            return d, (f"SPRT: pass rate at least {self.theta:.3f} rather than below {h1:.3f} "
                       f"after {n} runs (LLR {self.sprt.llr:.2f} <= {self.sprt.lower:.2f})")
        if self.alarm_at is not None:
            why = f"stopped by the fingerprint alarm after {self.n_runs} runs"
        elif self.n_runs >= self.n_plan:
            why = f"planned maximum of {self.n_plan} runs reached"
        else:
            why = f"stopped after {self.n_runs} runs (budget cap or interrupt)"
        return Verdict.INCONCLUSIVE, f"SPRT undecided: {why} (LLR {self.sprt.llr:.2f})"

    def fingerprint_verdict(self) -> tuple[Verdict, str] | None:
        if self.detector is None:
            return None
        if self.alarm_at is not None:
            return Verdict.FAIL, (f"behaviour shifted: fingerprint CUSUM alarm at run "
                                  f"{self.alarm_at} on {', '.join(self.alarm_features[:3])}")
        return Verdict.PASS, (f"no behaviour shift detected in {self.n_runs} runs (CUSUM "
                              f"{self.detector.statistic:.2f} < h {self.detector.threshold:.2f})")


class SPRTOutcomes:
    """Rates of the SPRT decisions ``sprt`` (+1 Fail, -1 Pass, 0 undecided) of replicates."""

    sprt: NDArray[np.int8]

    @property
    def fail_rate(self) -> float:
        return float(np.mean(self.sprt == 1))

    @property
    def pass_rate(self) -> float:
        return float(np.mean(self.sprt == -1))


@dataclass(frozen=True)
class Simulation(SPRTOutcomes):
    """Replicates of :func:`simulate`.

    ``sprt``: +1 Fail, -1 Pass, 0 undecided; ``alarm``: the fingerprint test alarmed
    before the stream stopped (possibly on the run the SPRT decided); ``n``: runs spent.
    """

    sprt: NDArray[np.int8]
    alarm: NDArray[np.bool_]
    n: NDArray[np.int64]

    @property
    def alarm_rate(self) -> float:
        return float(np.mean(self.alarm))


#: Draws (n_rep,) outcomes and (n_rep, d) fingerprints for one step: (rng, n_rep) -> both.
Sampler = Callable[[np.random.Generator, int], tuple[NDArray[np.bool_], NDArray[np.float64]]]


def simulate(test: StreamTest, sample: Sampler, n_rep: int,
             rng: np.random.Generator) -> Simulation:
    """The decision of ``test`` (its parameters, not its state) over ``n_rep`` replicates.

    Same LLR (initial value plus counts times steps), same boundaries, same fingerprint
    CUSUM kernel (the detector's own vectorised step), same stopping order as
    :meth:`StreamTest.update`: a run is added to both tests, then the SPRT decision is
    checked before the alarm. Replicates that have stopped keep drawing but are masked.
    """
    s = test.sprt
    step_p, step_f = math.log((s.theta - s.delta) / s.theta), math.log(
        (1 - s.theta + s.delta) / (1 - s.theta))
    a, b = s.lower, s.upper
    llr = np.full(n_rep, test.llr0)
    sprt = np.zeros(n_rep, dtype=np.int8)
    alarm = np.zeros(n_rep, dtype=bool)
    n = np.full(n_rep, test.n_plan, dtype=np.int64)
    running = np.ones(n_rep, dtype=bool)
    det = test.detector
    state = det._batch_init(n_rep) if det is not None else None
    for t in range(1, test.n_plan + 1):
        passed, fp = sample(rng, n_rep)
        llr = np.where(running, llr + np.where(passed, step_p, step_f), llr)
        fired = (det._batch_step(state, fp) if det is not None
                 else np.zeros(n_rep, dtype=bool))
        dec_fail = running & (llr >= b)
        dec_pass = running & (llr <= a)
        sprt[dec_fail] = 1
        sprt[dec_pass] = -1
        hit = running & fired
        alarm[hit] = True
        stop = dec_fail | dec_pass | hit
        n[stop] = t
        running &= ~stop
        if not running.any():
            break
    return Simulation(sprt, alarm, n)
