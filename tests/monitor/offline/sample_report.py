"""Realistic :class:`GateReport` fixtures for the writer tests (JUnit, Markdown, HTML).

The numbers are not typed in: each stream is simulated with a seeded numpy Generator and
put through the project's own statistics (Wilson intervals, one-sided Fisher with planned
power, Hotelling T^2 on simulated fingerprints, Wald's SPRT), then Holm-adjusted across
streams and decided with SPEC.md's gate rule, so the reports look like what ``assaywatch
gate`` produces: a deploy, a block (0.90 -> 0.75 pass-rate drop), a manual review (tool-mix
shift at an unchanged pass rate, plus a 15-run candidate that is Inconclusive), and a live
gate with an SPRT path. ``hostile_report`` adds names that need escaping in every format.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from assaywatch.analyzers.hotelling import hotelling_from_samples
from assaywatch.analyzers.sprt import SPRT
from assaywatch.analyzers.verdicts import regression_verdict, wilson_interval
from assaywatch.monitor.offline.report import GateReport, StreamResult, TestResult

CONFIG: dict[str, Any] = {
    "alpha": 0.05, "beta": 0.1, "delta": 0.1, "theta": 0.85, "c_min": 0.6, "n_max": 400,
    "fingerprint_shift": 0.5, "policy": {"behaviour_shift": "manual"},
}
FEATURES = ["steps", "depth", "branches", "output_len", "frac_tool", "tool:search",
            "tool:lookup", "tool:refund", "err", "recovery", "cost", "mean_step_cost"]
#: Holm adjusts the pass-rate p-values of these streams together.
_ALPHA = float(CONFIG["alpha"])


def _fingerprints(rng: np.random.Generator, n: int, shift: dict[str, float]) -> np.ndarray:
    base = rng.normal(size=(n, len(FEATURES)))
    for name, s in shift.items():
        base[:, FEATURES.index(name)] += s
    return base


def _stream(
    rng: np.random.Generator,
    scenario: str,
    p_b: float,
    p_c: float,
    n_b: int = 100,
    n_c: int = 100,
    shift: dict[str, float] | None = None,
    coverage: dict[str, float] | None = None,
    agent: str = "support-bot",
) -> tuple[StreamResult, float]:
    """One stream's results; returns the stream and its raw pass-rate p-value for Holm."""
    k_b, k_c = int(rng.binomial(n_b, p_b)), int(rng.binomial(n_c, p_c))
    rv = regression_verdict(k_b, n_b, k_c, n_c, alpha=_ALPHA, beta=0.1, delta=0.1)
    st = StreamResult(agent=agent, version="v2.1.0", scenario=scenario,
                      baseline_version="v2.0.3")
    st.pass_rates = {
        "baseline": (k_b / n_b, *wilson_interval(k_b, n_b), n_b),
        "candidate": (k_c / n_c, *wilson_interval(k_c, n_c), n_c),
    }
    st.tests.append(TestResult("pass_rate", rv.verdict.value, {
        "test": rv.test, "k_baseline": k_b, "n_baseline": n_b, "k_candidate": k_c,
        "n_candidate": n_c, "p_value": rv.p_value, "p_value_holm": None, "power": rv.power,
        "difference": rv.effects.difference, "cohens_h": rv.effects.cohens_h,
        "odds_ratio": rv.effects.odds_ratio, "effect": rv.effects.label,
        "n_required": rv.n_required,
    }))
    xb = _fingerprints(rng, n_b, {})
    xc = _fingerprints(rng, n_c, shift or {})
    hr = hotelling_from_samples(xb, xc, alpha=_ALPHA, feature_names=FEATURES)
    st.feature_shifts = [(s.name, s.shift) for s in hr.shifts]
    top = ", ".join(f"{s.name} {s.shift:+.2f}" for s in hr.shifts[:3])
    st.tests.append(TestResult(
        "fingerprint", "fail" if hr.reject else "pass",
        {"t2": hr.t2, "f": hr.f, "df1": hr.df1, "df2": hr.df2, "p_value": hr.p_value,
         "d_eff": hr.d_eff, "mahalanobis": hr.mahalanobis, "top_features": top},
        f"behaviour {'shifted' if hr.reject else 'unchanged'} (Hotelling p={hr.p_value:.3g});"
        f" largest moves: {top}"))
    st.coverage = coverage or {"tool": 1.0, "path": 0.82, "state": 0.91, "boundary": 0.75,
                               "model": 1.0}
    if "overall" not in st.coverage:
        vals = np.array(list(st.coverage.values()))
        st.coverage["overall"] = float(np.exp(np.log(np.maximum(vals, 1e-300)).mean()))
    ok = st.coverage["overall"] >= float(CONFIG["c_min"])
    st.tests.append(TestResult("coverage", "pass" if ok else "inconclusive",
                               {"overall": st.coverage["overall"], "c_min": CONFIG["c_min"]},
                               f"coverage {st.coverage['overall']:.2f} vs C_min "
                               f"{CONFIG['c_min']}"))
    return st, rv.p_value


def _holm(streams: list[StreamResult], pvalues: list[float]) -> None:
    """Holm-Bonferroni step-down across streams; fills p_value_holm and the verdicts."""
    m = len(pvalues)
    order = np.argsort(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        test = next(t for t in streams[i].tests if t.name == "pass_rate")
        test.statistics["p_value_holm"] = running
        drop = float(test.statistics["difference"] or 0.0)
        power = float(test.statistics["power"] or 0.0)
        if running < _ALPHA and drop >= 0.1 - 1e-12:
            test.verdict = "fail"
        elif running >= _ALPHA and power >= 0.9:
            test.verdict = "pass"
        else:
            test.verdict = "inconclusive"
        test.message = (f"pass rate {streams[i].pass_rates['baseline'][0]:.2f} -> "
                        f"{streams[i].pass_rates['candidate'][0]:.2f}, one-sided Fisher "
                        f"p={pvalues[i]:.3g} (Holm {running:.3g}), planned power "
                        f"{power:.2f} at delta 0.1")


def _decide(streams: list[StreamResult], inputs: dict[str, object]) -> GateReport:
    verdicts = [(s, t) for s in streams for t in s.tests]
    failed = [f"{s.name} {t.name}" for s, t in verdicts if t.verdict == "fail"]
    regress = [x for x in failed if x.endswith("pass_rate")]
    open_ = [f"{s.name} {t.name}" for s, t in verdicts if t.verdict == "inconclusive"]
    if regress:
        return GateReport("block", 1, f"pass-rate regression in {', '.join(regress)}",
                          dict(CONFIG), streams, inputs)
    if failed or open_:
        what = ", ".join(failed + open_)
        return GateReport("manual", 2, f"needs review: {what}", dict(CONFIG), streams, inputs)
    return GateReport("deploy", 0, f"all {len(streams)} streams pass with coverage >= C_min",
                      dict(CONFIG), streams, inputs)


def _inputs(skipped: list[str]) -> dict[str, object]:
    return {"baseline_files": ["baseline/spans-2024-06-01.jsonl.gz"],
            "candidate_files": ["candidate/spans.jsonl", "candidate/spans-2.pb"],
            "spans_read": 48213, "runs": {"baseline": 300, "candidate": 300},
            "lines_skipped": len(skipped), "skipped": skipped}


def deploy_report(seed: int = 11) -> GateReport:
    """Three unchanged scenarios, enough runs for power: deploy."""
    rng = np.random.default_rng(seed)
    pairs = [_stream(rng, s, 0.9, 0.9, 300, 300) for s in ("refund", "billing", "search")]
    streams = [p[0] for p in pairs]
    _holm(streams, [p[1] for p in pairs])
    return _decide(streams, _inputs([]))


def block_report(seed: int = 12) -> GateReport:
    """A 0.90 -> 0.75 drop on one scenario of three: block."""
    rng = np.random.default_rng(seed)
    pairs = [_stream(rng, "refund", 0.9, 0.75, 300, 300),
             _stream(rng, "billing", 0.9, 0.9, 300, 300),
             _stream(rng, "search|web", 0.85, 0.85, 300, 300)]
    streams = [p[0] for p in pairs]
    _holm(streams, [p[1] for p in pairs])
    return _decide(streams, _inputs([
        "candidate/spans.jsonl:17: not JSON (Expecting ',' delimiter: column 88)",
        "candidate/spans.jsonl:912: span without traceId"]))


def manual_report(seed: int = 13) -> GateReport:
    """Tool-mix shift at an unchanged pass rate, and a 15-run candidate: manual review."""
    rng = np.random.default_rng(seed)
    pairs = [_stream(rng, "refund", 0.9, 0.9, 300, 300,
                     shift={"tool:search": -1.2, "tool:lookup": 1.1}),
             _stream(rng, "billing", 0.9, 0.9, 200, 15,
                     coverage={"tool": 0.5, "path": 0.3, "state": 0.6, "boundary": 0.4,
                               "model": 1.0})]
    streams = [p[0] for p in pairs]
    _holm(streams, [p[1] for p in pairs])
    return _decide(streams, _inputs([]))


def sprt_report(seed: int = 14) -> GateReport:
    """A live gate: Wald's SPRT on candidate runs with p = 0.72 decides Fail early."""
    rng = np.random.default_rng(seed)
    theta, delta = float(CONFIG["theta"]), float(CONFIG["delta"])
    st, p = _stream(rng, "refund", 0.9, 0.72, 200, 120)
    sprt = SPRT(theta, delta, alpha=0.05, beta=0.1, n_max=400)
    path: list[float] = []
    for passed in rng.random(400) < 0.72:
        sprt.update(bool(passed))
        path.append(sprt.llr)
        if sprt.decision is not None:
            break
    st.sprt_path, st.sprt_bounds = path, (sprt.lower, sprt.upper)
    verdict = sprt.decision.value if sprt.decision is not None else "inconclusive"
    st.tests.insert(0, TestResult(
        "sprt", verdict, {"llr": sprt.llr, "lower": sprt.lower, "upper": sprt.upper,
                          "n": sprt.n, "theta": theta, "delta": delta},
        f"SPRT reached {'the Fail' if verdict == 'fail' else 'a'} boundary after "
        f"{sprt.n} runs (LLR {sprt.llr:.2f})"))
    other, p2 = _stream(rng, "billing", 0.9, 0.9, 200, 120)
    streams = [st, other]
    _holm(streams, [p, p2])
    report = _decide(streams, _inputs([]))
    report.spend = {"runs": sprt.n + 120, "tokens": 1_234_567, "fixed_n_runs": 2 * 215,
                    "fixed_n_tokens": 2_460_000}
    return report


def hostile_report() -> GateReport:
    """Names and messages that break naive writers: pipes, markup, quotes, control chars."""
    report = block_report()
    st = report.streams[0]
    st.agent = 'bot<script>alert("x")</script>&co'
    st.scenario = "a|b|c 'quoted' \x01ctl"
    st.tests[0].message = "drop <b>bold</b> | piped & \"quoted\" \x0b"
    st.feature_shifts = [("tool:<img src=x onerror=alert(1)>", 3.0), *st.feature_shifts[1:]]
    report.reason = "block because <i>x</i> | y"
    report.inputs["skipped"] = ["evil|file.jsonl:3: bad <json>"]
    return report


def degenerate_report() -> GateReport:
    """Edge cases: a stream with no candidate runs, an infinite shift, no streams at all."""
    empty = StreamResult("bot", "v2", "", "v1", [
        TestResult("pass_rate", "inconclusive", {"n_baseline": 50, "n_candidate": 0},
                   "no candidate runs for this stream"),
        TestResult("fingerprint", "fail", {"p_value": 0.0, "t2": float("inf")},
                   "depth constant at 1 in the baseline and 2 in the candidate")])
    empty.pass_rates = {"baseline": (0.9, 0.79, 0.96, 50), "candidate": (float("nan"), 0.0,
                                                                          1.0, 0)}
    empty.feature_shifts = [("depth", float("inf")), ("steps", float("nan")), ("cost", -0.2)]
    empty.sprt_path = [0.1, float("nan"), -0.3]
    return GateReport("manual", 2, "no candidate runs for bot/-", {}, [empty], {}, {})


ALL = {"deploy": deploy_report, "block": block_report, "manual": manual_report,
       "sprt": sprt_report}
