"""The live gate's streams -> the gate report the offline writers already read.

Per stream: ``sprt`` (the sequential pass-rate verdict, with its LLR path and bounds),
``fingerprint`` (the sequential behaviour test) and ``coverage``; the decision follows the
offline gate's policy (monitor/offline/gate.py): a pass-rate regression blocks, a behaviour
shift asks for manual review (or blocks with ``behaviour_shift: block``), anything
Inconclusive or short coverage asks for manual review, otherwise deploy. ``spend`` holds the
runs, tokens and money spent, and what the fixed-n design of SPEC Eq. 6 would have spent.
"""

from __future__ import annotations

import math
from typing import Any

from assaywatch.analyzers.model import Verdict
from assaywatch.analyzers.score_tests import SequentialScoreTest
from assaywatch.analyzers.verdicts import wilson_interval
from assaywatch.monitor.live.fidelity import FidelitySPRT, fidelity_result
from assaywatch.monitor.live.runner import LiveGate
from assaywatch.monitor.live.streams import Stream
from assaywatch.monitor.offline.gate import (
    DEPLOY,
    EVALUATION_TEST,
    EXIT_CODES,
    MANUAL,
    GatePolicy,
    add_coverage_test,
    decision,
)
from assaywatch.monitor.offline.report import GateReport, StreamResult, TestResult


def _rate(k: int, n: int) -> tuple[float, float, float, int]:
    lo, hi = wilson_interval(k, n, 0.05) if n else (0.0, 1.0)
    return (k / n if n else float("nan"), lo, hi, n)


def stream_result(st: Stream, policy: GatePolicy) -> StreamResult:
    base, t = st.baseline, st.test
    version = st.runs[0].key.version if st.runs else (t.candidate_version if t else "")
    sr = StreamResult(agent=st.key.agent, version=version, scenario=st.key.scenario,
                      baseline_version=base.key.version if base else "")
    if base is None:
        sr.tests.append(TestResult("baseline", Verdict.INCONCLUSIVE.value, {},
                                   "no baseline for this agent and scenario"))
        return sr
    if t is None:
        sr.tests.append(TestResult("sprt", Verdict.INCONCLUSIVE.value, {},
                                   "the candidate produced no runs for this baseline stream"))
        return sr
    sr.pass_rates = {"baseline": _rate(base.passes, base.passes + base.fails),
                     "candidate": _rate(t.passes, t.passes + t.fails)}
    verdict, msg = t.sprt_verdict()
    if t.sprt_superseded:
        msg = (f"{msg}; superseded: every graded evaluator passed its sequential test "
               "first (scores_decide), so the pass/fail bit is not waited for")
    sr.tests.append(TestResult("sprt", verdict.value, {
        "superseded_by_evaluations": t.sprt_superseded,
        "runs": t.n_runs, "passes": t.passes, "fails": t.fails, "unknown": t.unknown,
        "crashes": st.crashes, "llr": t.sprt.llr, "llr0": t.llr0, "lower": t.sprt.lower,
        "upper": t.sprt.upper, "theta": t.theta, "theta1": t.theta - t.config.delta,
        "alpha": t.alpha, "beta": t.config.beta, "warm_start": type(t.sprt).__name__,
        "same_version": t.same_version, "n_plan": t.n_plan, "n_fixed": t.n_fixed,
        "n_budget": t.n_budget, "stopped_by": t.stopped_by, "ignored_runs": t.ignored},
        msg))
    if isinstance(t.sprt, FidelitySPRT):
        sr.tests[-1] = fidelity_result(sr.tests[-1], t.sprt)
    sr.sprt_path = list(t.llr_path)
    sr.sprt_bounds = t.bounds
    fv = t.fingerprint_verdict()
    if fv is not None and t.detector is not None:
        stats: dict[str, float | int | str | None] = {
            "statistic": t.detector.statistic, "threshold": t.detector.threshold,
            "alarm_at": t.alarm_at, "alpha": t.fingerprint_alpha,
            "shift_sd": t.config.fingerprint_shift}
        for i, f in enumerate(t.alarm_features[:5], 1):
            stats[f"moved_{i}"] = f
        sr.tests.append(TestResult("fingerprint", fv[0].value, stats, fv[1]))
    for name, test in t.score_tests.items():
        sr.tests.append(_evaluation_result(name, test))
    if st.runs:
        add_coverage_test(sr, st.runs, base.tools, policy.c_min)
    return sr


def _evaluation_result(name: str, test: SequentialScoreTest) -> TestResult:
    s = test.summary
    w = s.hi - s.lo
    drop = f"{test.drop * w:g} ({test.drop:g} of the scale)"
    if test.decision is Verdict.FAIL:
        verdict, msg = Verdict.FAIL, (
            f"{name} score fell below the baseline's {s.mean:.3f} after {test.n} scores "
            f"(e-value {math.exp(test.log_fail):.3g} >= {2 / test.alpha:g})")
    elif test.decision is Verdict.PASS:
        verdict, msg = Verdict.PASS, (
            f"{name} score no worse than baseline - {drop} after {test.n} scores "
            f"(e-value {math.exp(test.log_pass):.3g} >= {2 / test.beta:g})")
    else:
        verdict, msg = Verdict.INCONCLUSIVE, (
            f"{name}: undecided after {test.n} scores (e-values {math.exp(test.log_fail):.3g}"
            f" for a drop, {math.exp(test.log_pass):.3g} for no drop of {drop})")
    return TestResult(f"{EVALUATION_TEST}{name}", verdict.value, {
        "scores": test.n, "baseline_mean": s.mean, "baseline_scores": s.n,
        "log_e_fail": test.log_fail, "log_e_pass": test.log_pass,
        "threshold_fail": math.log(2 / test.alpha), "threshold_pass": math.log(2 / test.beta),
        "alpha": test.alpha, "beta": test.beta, "score_drop": test.drop}, msg)


def spend(gate: LiveGate) -> dict[str, Any]:
    """Runs, tokens, money and time spent, beside the fixed-n design's requirement."""
    sp = gate.spend
    tests = [s.test for s in gate.streams.values() if s.test is not None]
    fixed = sum(t.n_fixed for t in tests)
    per_run = sp.tokens / sp.runs if sp.runs else 0.0
    out: dict[str, Any] = {
        "runs": sp.runs, "runs_used": sum(t.n_runs for t in tests),
        "invocations": sp.invocations, "tokens": sp.tokens,
        "cost_usd": round(sp.cost_usd, 6), "seconds": round(gate.seconds, 3),
        "fixed_n_runs": fixed, "fixed_n_tokens_estimate": round(fixed * per_run),
        "fixed_n_ratio": round(fixed / sp.runs, 2) if sp.runs else None,
        "failed_invocations": len(sp.crashed),
        "exit_codes": ", ".join(f"{i}:{c}" for i, c in sp.crashed[:10]),
        "unattributed_runs": sp.unattributed, "jobs": gate.jobs, "loop": gate.loop,
        "interrupted": gate.interrupted, "stopped": sp.stopped,
    }
    if gate.proxy_command:
        base_cost = fixed * per_run
        out.update({
            "proxy_runs": sp.proxy_runs, "proxy_invocations": sp.proxy_invocations,
            "proxy_tokens": sp.proxy_tokens, "proxy_cost_usd": round(sp.proxy_cost_usd, 6),
            "total_cost_ratio_to_fixed_n": (round((sp.tokens + sp.proxy_tokens) / base_cost, 3)
                                            if base_cost else None)})
    return out


def live_report(gate: LiveGate, policy: GatePolicy, inputs: dict[str, Any]) -> GateReport:
    streams = [stream_result(st, policy) for _, st in sorted(gate.streams.items())]
    dec, reason = decision(streams, policy,
                           all_passed="every stream passed its sequential tests and coverage")
    if gate.interrupted and dec == DEPLOY:  # never deploy on a cut-short run
        dec, reason = MANUAL, "interrupted before every stream was decided"
    if gate.interrupted:
        reason = f"interrupted (Ctrl-C): {reason}"
    return GateReport(decision=dec, exit_code=EXIT_CODES[dec], reason=reason,
                      config=policy.to_dict(), streams=streams, inputs=inputs,
                      spend=spend(gate))
