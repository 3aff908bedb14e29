"""Wald's sequential probability ratio test for a pass rate, cold and safely warm-started.

SPEC.md 3.5 and 7.5. The test runs H0: p >= theta against H1: p <= theta - delta on a
stream of pass/fail trials and stops as soon as the evidence suffices. The warm start of
the paper (Eq. 49) is unsafe as written; :class:`WarmStartSPRT` implements SPEC's redesign.
"""

from __future__ import annotations

import functools
import math
import operator

from scipy import stats

from assaywatch.analyzers.model import Verdict

#: Default power-prior weight of runs from a different version (see :func:`warm_start_llr`).
DEFAULT_DISCOUNT = 0.1


def validate_parameters(theta: float, delta: float, alpha: float, beta: float,
                        n_max: int | None) -> None:
    if not 0.0 < theta < 1.0:
        raise ValueError(f"theta must lie strictly between 0 and 1, got {theta!r}")
    if not 0.0 < delta < theta:
        raise ValueError(f"delta must satisfy 0 < delta < theta={theta!r}, got {delta!r}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    if alpha + beta >= 1.0:
        raise ValueError(f"alpha + beta must be < 1, got alpha={alpha!r}, beta={beta!r}")
    if n_max is not None and (isinstance(n_max, bool) or operator.index(n_max) < 1):
        raise ValueError(f"n_max must be None or an integer >= 1, got {n_max!r}")


def llr_steps(theta: float, delta: float) -> tuple[float, float]:
    """Per-trial LLR increments (on pass, on fail) of SPEC Eq. 7."""
    return math.log((theta - delta) / theta), math.log((1 - theta + delta) / (1 - theta))


def boundaries(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's boundaries a = log(beta/(1-alpha)) (Pass) and b = log((1-beta)/alpha) (Fail)."""
    return math.log(beta / (1 - alpha)), math.log((1 - beta) / alpha)


class SPRT:
    """Sequential probability ratio test of a pass rate.

    After k trials with s passes the log-likelihood ratio of H1: p = theta - delta to
    H0: p = theta is ``Lambda_k = s log((theta-delta)/theta) + (k-s) log((1-theta+delta)/
    (1-theta))`` (SPEC Eq. 7). The test stops with Pass when Lambda_k <= a =
    log(beta/(1-alpha)) and with Fail when Lambda_k >= b = log((1-beta)/alpha); at ``n_max``
    trials without a crossing it ends Inconclusive (the gate's truncation).

    Wald's inequalities bound the errors by alpha/(1-beta) and beta/(1-alpha); the
    overshoot makes the real ones smaller. At theta=0.9, delta=0.1, alpha=0.05, beta=0.1
    (untruncated; exact by :func:`~assaywatch.analyzers.sprt_operating.sprt_exact`,
    confirmed by 20,000 seeded replicates in
    tests/analyzers/test_sprt.py): Type I 0.039, power 0.903, mean N 56.9 at p = 0.9 and
    59.3 at p = 0.8, median 47 at both (SPEC's Monte Carlo figures 0.033, 0.893, 56.5, 59.3
    agree within their sampling error; Wald's approximations give 54.4 and 53.5), against
    215 runs per arm for the fixed-n design (Eq. 6).

    Parameters
    ----------
    theta:
        Pass rate the agent must keep (H0: p >= theta).
    delta:
        Drop that counts as a regression (H1: p <= theta - delta); 0 < delta < theta.
    alpha, beta:
        Target Type I (false Fail at p = theta) and Type II (false Pass at p = theta-delta).
    n_max:
        Truncation: Inconclusive after this many trials; None for Wald's open test.

    Notes
    -----
    Once decided the test is frozen: further :meth:`update` calls are ignored (counted in
    ``n_ignored``) rather than raising, because the monitor feeds it from a hot path that
    must not raise; call :meth:`reset` to start a new test. The LLR is computed from the
    pass/fail counts, not accumulated, so
    :func:`~assaywatch.analyzers.sprt_operating.simulate_sprt` reproduces it bit for bit.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(7)
    >>> test = SPRT(theta=0.9, delta=0.1)
    >>> while test.decision is None:
    ...     test.update(bool(rng.random() < 0.7))
    >>> test.decision, test.n
    (<Verdict.FAIL: 'fail'>, 9)

    References
    ----------
    Wald, A. (1945). Sequential tests of statistical hypotheses. Ann. Math. Stat. 16(2).
    """

    def __init__(
        self,
        theta: float,
        delta: float,
        alpha: float = 0.05,
        beta: float = 0.1,
        n_max: int | None = None,
    ) -> None:
        validate_parameters(theta, delta, alpha, beta, n_max)
        self.theta = theta
        self.delta = delta
        self.alpha = alpha
        self.beta = beta
        self.n_max = n_max
        self._step_pass, self._step_fail = llr_steps(theta, delta)
        self._a, self._b = boundaries(alpha, beta)
        self._llr0 = 0.0
        self._reset()

    def _reset(self) -> None:
        self._n_pass = 0
        self._n_fail = 0
        self._n_ignored = 0
        self._decision: Verdict | None = None

    def reset(self) -> None:
        """Forget all trials (a warm start returns to its initial LLR)."""
        self._reset()

    def update(self, passed: bool) -> None:
        """Add one trial; ignored (and counted) once the test has decided."""
        if self._decision is not None:
            self._n_ignored += 1
            return
        if passed:
            self._n_pass += 1
        else:
            self._n_fail += 1
        llr = self.llr
        if llr <= self._a:
            self._decision = Verdict.PASS
        elif llr >= self._b:
            self._decision = Verdict.FAIL
        elif self.n_max is not None and self.n >= self.n_max:
            self._decision = Verdict.INCONCLUSIVE

    @property
    def llr(self) -> float:
        """Current log-likelihood ratio Lambda_n (initial value plus the trials' evidence)."""
        return self._llr0 + self._n_pass * self._step_pass + self._n_fail * self._step_fail

    @property
    def lower(self) -> float:
        """Pass boundary a."""
        return self._a

    @property
    def upper(self) -> float:
        """Fail boundary b."""
        return self._b

    @property
    def n(self) -> int:
        """Trials counted towards the decision."""
        return self._n_pass + self._n_fail

    @property
    def n_ignored(self) -> int:
        """Trials received after the decision and ignored."""
        return self._n_ignored

    @property
    def decision(self) -> Verdict | None:
        """Pass, Fail, Inconclusive (truncated at n_max), or None while undecided."""
        return self._decision

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(theta={self.theta!r}, delta={self.delta!r}, "
            f"alpha={self.alpha!r}, beta={self.beta!r}, n_max={self.n_max!r})"
        )


@functools.lru_cache(maxsize=4096)  # pure; the monitor restarts its SPRT after each decision
def warm_start_llr(
    theta: float,
    delta: float,
    alpha: float,
    beta: float,
    prior_passes: int,
    prior_runs: int,
    same_version: bool,
    inflation: float = 1.5,
    discount: float = DEFAULT_DISCOUNT,
) -> float:
    """Initial LLR Lambda_0 of the safe warm start (SPEC 7.5 redesign).

    1. Power prior: prior runs count with weight w = 1 from the same version and
       w = ``discount`` from a different one, giving Beta(1 + w k0, 1 + w (n0 - k0)).
       The paper's Eq. 49, log Beta_pdf(theta-delta) / Beta_pdf(theta), then equals w times
       the SPRT LLR of the prior runs (the normalisers cancel). A version change is exactly
       what the test looks for, so old-version runs count for little: at 0.1, 100 of them
       weigh as 10 new runs.
    2. Cap. Started at Lambda_0, the likelihood-ratio martingale gives rigorously
       P(Fail | p=theta) <= exp(Lambda_0 - b) = alpha e^{Lambda_0} / (1-beta) and
       P(Pass | p=theta-delta) <= exp(a - Lambda_0) = beta e^{-Lambda_0} / (1-alpha).
       Keeping both within ``inflation`` times alpha and beta caps Lambda_0 to
       [-ln(inflation (1-alpha)), ln(inflation (1-beta))] = [-0.354, 0.300] at the
       defaults, whatever the prior's version; this is inside SPEC's |Lambda_0| <=
       ln(inflation) = 0.405, which bounds alpha e^{|Lambda_0|} but not Wald's actual
       constant alpha/(1-beta).
    3. The start is then clipped strictly inside (a, b), so a warm start never decides
       before a new trial.
    """
    validate_parameters(theta, delta, alpha, beta, None)
    k0, n0 = operator.index(prior_passes), operator.index(prior_runs)
    if n0 < 0 or not 0 <= k0 <= n0:
        raise ValueError(f"need 0 <= prior_passes <= prior_runs, got {k0} of {n0}")
    if not inflation >= 1.0:
        raise ValueError(f"inflation must be >= 1 (1 disables the warm start), got {inflation!r}")
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must lie in [0, 1], got {discount!r}")
    w = 1.0 if same_version else discount
    shape_a, shape_b = 1.0 + w * k0, 1.0 + w * (n0 - k0)
    raw = float(
        stats.beta.logpdf(theta - delta, shape_a, shape_b)
        - stats.beta.logpdf(theta, shape_a, shape_b)
    )
    a, b = boundaries(alpha, beta)
    lo = -max(0.0, math.log(inflation * (1 - alpha)))
    hi = max(0.0, math.log(inflation * (1 - beta)))
    llr0 = min(max(raw, lo), hi)
    return min(max(llr0, math.nextafter(a, 0.0)), math.nextafter(b, 0.0))


class WarmStartSPRT(SPRT):
    """:class:`SPRT` started at a capped, version-aware prior LLR (SPEC 7.5).

    The paper starts at Lambda_0 = log Beta_pdf(theta-delta)/Beta_pdf(theta) of the prior
    runs; with 90/100 prior passes at theta = 0.9 that is already past a, so the test
    passes before any new trial and never catches a regression. Here Lambda_0 comes from
    :func:`warm_start_llr`: old-version runs are discounted, |Lambda_0| is capped so the
    rigorous error bounds stay within ``inflation`` times alpha and beta, and the start lies
    strictly inside (a, b). Measured (tests/analyzers/test_sprt.py, 20,000 replicates per
    case) with same-version priors and with an older, better version's 95/100 when the
    truth fell to 0.8: Type I <= 1.5 alpha and power >= 1 - 1.5 beta.

    Parameters
    ----------
    theta, delta, alpha, beta, n_max:
        As for :class:`SPRT`.
    prior_passes, prior_runs:
        Earlier results k0 of n0.
    same_version:
        Whether the prior runs come from the version under test.
    inflation:
        Allowed factor on alpha and beta (>= 1; 1 disables the warm start).
    discount:
        Power-prior weight of different-version runs, in [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(3)
    >>> test = WarmStartSPRT(0.9, 0.1, 0.05, 0.1, 500, 90, 100, True)
    >>> round(test.llr, 3), test.decision
    (-0.354, None)
    >>> while test.decision is None:
    ...     test.update(bool(rng.random() < 0.9))
    >>> test.decision, test.n
    (<Verdict.PASS: 'pass'>, 30)
    """

    def __init__(
        self,
        theta: float,
        delta: float,
        alpha: float,
        beta: float,
        n_max: int | None,
        prior_passes: int,
        prior_runs: int,
        same_version: bool,
        inflation: float = 1.5,
        discount: float = DEFAULT_DISCOUNT,
    ) -> None:
        super().__init__(theta, delta, alpha, beta, n_max)
        self.prior_passes = prior_passes
        self.prior_runs = prior_runs
        self.same_version = same_version
        self.inflation = inflation
        self.discount = discount
        self._llr0 = warm_start_llr(
            theta, delta, alpha, beta, prior_passes, prior_runs, same_version,
            inflation, discount,
        )  # fmt: skip

    @property
    def llr0(self) -> float:
        """The capped initial LLR Lambda_0."""
        return self._llr0

    def __repr__(self) -> str:
        return (
            f"{super().__repr__()[:-1]}, prior_passes={self.prior_passes!r}, "
            f"prior_runs={self.prior_runs!r}, same_version={self.same_version!r}, "
            f"inflation={self.inflation!r}, discount={self.discount!r})"
        )
