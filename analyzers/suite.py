"""Suite verdict with Holm's multiplicity correction, and the deployment gate.

SPEC.md 3.8 (suite verdict, Algorithm 2) and 6.2 (deployment gate, config Gamma).
A suite of m scenarios tested each at level alpha blocks an unchanged agent with
probability up to 1 - (1 - alpha)^m (64% at m = 20); Holm's step-down procedure keeps the
family-wise rate of a false Fail at alpha while rejecting at least as much as Bonferroni.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, Literal, Protocol

import numpy as np

from assaywatch.analyzers.model import Verdict
from assaywatch.analyzers.verdicts import (
    REGRESSION_TESTS,
    candidate_sample_size,
    decide_regression,
    planned_power,
)

Correction = Literal["holm", "none"]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    With the p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value is
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``; rejecting where it is < alpha is Holm's
    step-down test, which controls the family-wise error rate at alpha under any
    dependence. (``scipy.stats.false_discovery_control`` is Benjamini-Hochberg, an FDR
    procedure, and is not this.)
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must be a flat sequence of numbers in [0, 1], got {p_values}")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return [float(x) for x in adjusted]


class ScenarioResult(Protocol):
    """What :func:`suite_verdict` reads from each scenario (a ``RegressionVerdict``)."""

    @property
    def p_value(self) -> float: ...
    @property
    def ni_p_value(self) -> float: ...
    @property
    def p_b(self) -> float: ...
    @property
    def p_c(self) -> float: ...
    @property
    def n_b(self) -> int: ...
    @property
    def n_c(self) -> int: ...
    @property
    def beta(self) -> float: ...
    @property
    def delta(self) -> float: ...
    @property
    def test(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SuiteVerdict:
    """Outcome of :func:`suite_verdict`; per-scenario tuples are in the input order."""

    verdict: Verdict
    scenario_verdicts: tuple[Verdict, ...]
    adjusted_p_values: tuple[float, ...]
    powers: tuple[float, ...]
    correction: str
    alpha: float
    n_required: tuple[int | None, ...] = ()


def suite_verdict(
    results: Sequence[ScenarioResult], alpha: float = 0.05, correction: Correction = "holm"
) -> SuiteVerdict:
    """Suite verdict over scenario regression results (SPEC 3.8, with the errata).

    Each scenario is re-decided on its Holm-adjusted p-value (``decide_regression``): Fail
    if the adjusted p < alpha and non-inferiority is not shown; Pass if non-inferiority is
    shown at the scenario's beta and the adjusted p >= alpha; else Inconclusive. The suite
    fails if any scenario fails, is Inconclusive if none fails and any is Inconclusive, and
    passes if all pass.

    What is exact. (1) P(some Fail | no scenario changed) <= alpha: Holm controls the
    family-wise error under any dependence (Fisher's p-values are valid, conservative).
    (2) P(Pass | some scenario regressed by >= delta) <= beta: the suite passes only if
    that scenario passes its non-inferiority test, whose size is beta (an
    intersection-union test: no correction is needed, the score test's size is
    asymptotic, its exact value is computed by ``noninferiority_power``). (3) The power
    to Fail one scenario regressed by delta among m is at least that of its own test at
    the Bonferroni level alpha/m (Holm rejects at least what Bonferroni rejects); ``powers``
    reports it, and ``n_required`` the candidate runs (:func:`candidate_sample_size` with
    ``tests = m``) at which it reaches 1 - beta and an unchanged scenario passes with
    probability >= 1 - alpha/m, so that an unchanged suite is held back only by a Holm
    rejection or a rare outcome between the two tests' regions. With
    ``correction="none"`` p-values and power are used at alpha as they are (for comparison
    only: an unchanged 20-scenario suite then rarely deploys).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    if correction not in ("holm", "none"):
        raise ValueError(f"correction must be 'holm' or 'none', got {correction!r}")
    m = len(results)
    if m == 0:
        raise ValueError("suite_verdict needs at least one scenario result")
    raw = [r.p_value for r in results]
    adjusted = holm(raw) if correction == "holm" else [float(p) for p in raw]
    tests = m if correction == "holm" else 1
    verdicts: list[Verdict] = []
    powers: list[float] = []
    needed: list[int | None] = []
    for r, p_adj in zip(results, adjusted, strict=True):
        if r.test not in REGRESSION_TESTS:
            raise ValueError(f"scenario test must be one of {REGRESSION_TESTS}, got {r.test!r}")
        test = "fisher" if r.test == "fisher" else "z"
        powers.append(planned_power(r.p_b, r.n_b, r.n_c, r.delta, alpha / tests, test))
        verdict = decide_regression(p_adj, r.ni_p_value, alpha, r.beta)
        verdicts.append(verdict)
        k_b = round(r.p_b * r.n_b)
        needed.append(
            candidate_sample_size(k_b, r.n_b, r.delta, alpha, r.beta, test, tests)
            if verdict is Verdict.INCONCLUSIVE and r.ni_p_value >= r.beta else 0
        )
    if Verdict.FAIL in verdicts:
        overall = Verdict.FAIL
    elif Verdict.INCONCLUSIVE in verdicts:
        overall = Verdict.INCONCLUSIVE
    else:
        overall = Verdict.PASS
    return SuiteVerdict(overall, tuple(verdicts), tuple(adjusted), tuple(powers), correction,
                        alpha, tuple(needed))


class GateDecision(Enum):
    """Deployment decision (SPEC 6.2) with the CLI's exit code."""

    DEPLOY = "deploy"
    BLOCK = "block"
    MANUAL = "manual"

    @property
    def exit_code(self) -> int:
        """0 deploy, 1 block, 2 manual review."""
        return {"deploy": 0, "block": 1, "manual": 2}[self.value]


def gate_decision(suite: Verdict, coverage_overall: float | None, c_min: float) -> GateDecision:
    """Deploy if the suite passes and coverage >= c_min; block if it fails; else manual.

    An unknown coverage (None) satisfies only c_min = 0: a required coverage that was not
    measured is "coverage short", so it goes to manual review rather than deploying.
    """
    if not 0.0 <= c_min <= 1.0:
        raise ValueError(f"c_min must lie in [0, 1], got {c_min!r}")
    if suite is Verdict.FAIL:
        return GateDecision.BLOCK
    covered = c_min <= 0.0 or (coverage_overall is not None and coverage_overall >= c_min)
    if suite is Verdict.PASS and covered:
        return GateDecision.DEPLOY
    return GateDecision.MANUAL


@dataclass(frozen=True, slots=True)
class GateConfig:
    """The gate's configuration Gamma = (alpha, beta, delta, theta, C_min, n_max, t_max).

    Attributes
    ----------
    alpha, beta:
        Type I and Type II error targets, each in (0, 1) with alpha + beta < 1.
    delta:
        Smallest pass-rate drop that counts as a regression, 0 < delta < theta.
    theta:
        Pass threshold of single-version verdicts and the SPRT, in (0, 1).
    c_min:
        Minimum overall coverage for a deploy, in [0, 1] (0 disables the requirement).
    n_max:
        Trial budget per scenario (SPRT truncation), an integer >= 1.
    t_max_seconds:
        Wall-time budget, > 0, or None for none.
    """

    alpha: float = 0.05
    beta: float = 0.1
    delta: float = 0.1
    theta: float = 0.85
    c_min: float = 0.0
    n_max: int = 500
    t_max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "delta", "theta", "c_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"gate config {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"gate config {name} must be finite, got {value!r}")
        for name in ("alpha", "beta", "theta"):
            if not 0.0 < getattr(self, name) < 1.0:
                value = getattr(self, name)
                raise ValueError(f"gate config {name} must lie in (0, 1), got {value!r}")
        if self.alpha + self.beta >= 1.0:
            raise ValueError(f"gate config needs alpha + beta < 1, got {self.alpha} + {self.beta}")
        if not 0.0 < self.delta < self.theta:
            raise ValueError(
                f"gate config delta must satisfy 0 < delta < theta={self.theta}, got {self.delta!r}"
            )
        if not 0.0 <= self.c_min <= 1.0:
            raise ValueError(f"gate config c_min must lie in [0, 1], got {self.c_min!r}")
        if isinstance(self.n_max, bool) or not isinstance(self.n_max, int) or self.n_max < 1:
            raise ValueError(f"gate config n_max must be an integer >= 1, got {self.n_max!r}")
        t = self.t_max_seconds
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 < t < math.inf
        ):
            raise ValueError(f"gate config t_max_seconds must be > 0 or null, got {t!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateConfig:
        """Build from a mapping (a parsed config file section); unknown keys are an error."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"unknown gate config key(s) {', '.join(map(repr, unknown))}; "
                f"valid keys are {', '.join(known)}"
            )
        values = dict(data)
        n_max = values.get("n_max")
        if isinstance(n_max, float) and n_max.is_integer():  # "500.0" from a JSON writer
            values["n_max"] = int(n_max)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form; ``GateConfig.from_dict(c.to_dict()) == c``."""
        return asdict(self)
