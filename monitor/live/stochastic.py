"""``@assaywatch.stochastic(...)``: a test whose body is a stochastic trial.

The decorated test body is run as repeated trials with Wald's SPRT (SPEC.md 3.5) on its
pass rate, H0: p >= threshold against H1: p <= threshold - delta, and stops at the first
decision::

    import assaywatch

    @assaywatch.stochastic(threshold=0.9, delta=0.1, alpha=0.05, beta=0.1, max_runs=100)
    def test_refund_answer(agent):
        assert "refund" in agent.ask("I want my money back")

A trial passes when the body returns and fails when it raises ``AssertionError``
(``assert``, ``pytest.fail`` is not one: it ends the test). Any other exception is a bug
in the test or the agent, not a stochastic failure: it propagates at once, unchanged.

Verdicts: **Pass** (the test passes), **Fail** (it fails with the pass count, the 95%
Wilson interval and the runs spent), **Inconclusive** at ``max_runs`` without a decision:
skipped, xfailed or failed as ``inconclusive`` says (default from the plugin option
``--assaywatch-inconclusive``, else ``skip``). Fixtures are set up once and shared by the
trials of one test. With the plugin option ``--assaywatch-spans FILE`` each trial is one
agent run (an ``invoke_agent`` span named after the test, with the trial's outcome as its
evaluation) and the spans are appended to FILE as OTLP JSON Lines for ``assaywatch gate``.

This module imports neither pytest nor the statistics until a decorated test runs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

INCONCLUSIVE_MODES = ("skip", "xfail", "fail")


@dataclass
class StochasticResult:
    """What one decorated test found; the plugin lists these in pytest's summary."""

    name: str
    verdict: str  # pass | fail | inconclusive
    passes: int
    runs: int
    lower: float
    upper: float
    threshold: float
    delta: float
    llr: float
    max_runs: int
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        rate = self.passes / self.runs if self.runs else math.nan
        return (f"{self.verdict.upper():12s} {self.name}: {self.passes}/{self.runs} trials "
                f"passed ({rate:.3f}, 95% Wilson [{self.lower:.3f}, {self.upper:.3f}]); "
                f"SPRT p >= {self.threshold:g} vs p <= {self.threshold - self.delta:g}, "
                f"{self.runs} of at most {self.max_runs} runs")


#: Results of the decorated tests run in this process, in order (read by the plugin).
RESULTS: list[StochasticResult] = []
#: Set by the plugin: default Inconclusive mode and the spans file.
SETTINGS: dict[str, Any] = {"inconclusive": "skip", "spans": None, "current": None}


def _check(threshold: float, delta: float, alpha: float, beta: float, max_runs: int,
           inconclusive: str | None) -> None:
    if not 0 < threshold < 1 or not 0 < delta < threshold:
        raise ValueError(f"stochastic: need 0 < delta < threshold < 1, got threshold="
                         f"{threshold!r}, delta={delta!r}")
    if not (0 < alpha < 1 and 0 < beta < 1 and alpha + beta < 1):
        raise ValueError(f"stochastic: alpha and beta must lie in (0, 1) with alpha + beta "
                         f"< 1, got {alpha!r}, {beta!r}")
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"stochastic: max_runs must be an integer >= 1, got {max_runs!r}")
    if inconclusive is not None and inconclusive not in INCONCLUSIVE_MODES:
        raise ValueError(f"stochastic: inconclusive must be one of {INCONCLUSIVE_MODES}, "
                         f"got {inconclusive!r}")


def stochastic(threshold: float = 0.9, delta: float = 0.1, alpha: float = 0.05,
               beta: float = 0.1, max_runs: int = 100,
               inconclusive: str | None = None) -> Callable[[F], F]:
    """Run the decorated test as sequential trials (module docstring).

    Parameters
    ----------
    threshold:
        Pass rate the body must keep (H0: p >= threshold).
    delta:
        Drop that counts as failing (H1: p <= threshold - delta).
    alpha, beta:
        Probability of failing a body whose pass rate is ``threshold``, and of passing one
        whose pass rate is ``threshold - delta`` (Wald's bounds; the real rates are lower).
    max_runs:
        Truncation: Inconclusive after this many trials.
    inconclusive:
        ``skip``, ``xfail`` or ``fail``; None: the plugin option (default ``skip``).
    """
    _check(threshold, delta, alpha, beta, max_runs, inconclusive)

    def decorate(func: F) -> F:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"@stochastic does not support async tests ({func.__qualname__})")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            _run(func, args, kwargs, threshold, delta, alpha, beta, max_runs, inconclusive)

        wrapper._assaywatch_stochastic = True  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _trial(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           name: str, spans: bool) -> str | None:
    """One trial: None when it passed, the assertion message when it failed."""
    if not spans:
        try:
            func(*args, **kwargs)
        except AssertionError as exc:
            return str(exc) or "AssertionError"
        return None
    from assaywatch.instrumentation.manual import agent_run, record_evaluation

    with agent_run(name, scenario=name):
        try:
            func(*args, **kwargs)
        except AssertionError as exc:
            record_evaluation(passed=False)
            return str(exc) or "AssertionError"
        record_evaluation(passed=True)
    return None


def _run(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
         threshold: float, delta: float, alpha: float, beta: float, max_runs: int,
         inconclusive: str | None) -> None:
    import pytest

    from assaywatch.analyzers.model import Verdict
    from assaywatch.analyzers.sprt import SPRT
    from assaywatch.analyzers.verdicts import wilson_interval

    name = SETTINGS.get("current") or f"{func.__module__}.{func.__qualname__}"
    spans = SETTINGS.get("spans") is not None
    test = SPRT(threshold, delta, alpha, beta, n_max=max_runs)
    failures: list[str] = []
    passes = 0
    while test.decision is None:
        message = _trial(func, args, kwargs, name, spans)
        if message is None:
            passes += 1
        elif len(failures) < 3:
            failures.append(message)
        test.update(message is None)
    lo, hi = wilson_interval(passes, test.n, 0.05)
    res = StochasticResult(name, test.decision.value, passes, test.n, lo, hi, threshold,
                           delta, test.llr, max_runs, failures)
    RESULTS.append(res)
    text = "stochastic " + res.line()
    if failures:
        text += "\nfirst failed trials: " + " | ".join(failures)
    if test.decision is Verdict.PASS:
        return
    if test.decision is Verdict.FAIL:
        pytest.fail(text, pytrace=False)
    mode = inconclusive or SETTINGS.get("inconclusive") or "skip"
    if mode == "xfail":
        pytest.xfail(text)
    if mode == "fail":
        pytest.fail(text, pytrace=False)
    pytest.skip(text)
