"""The pre-deploy gate (SPEC.md 3.4, 3.8, 6.2; Theorem 7.1): baselines vs candidate runs.

Per stream (agent, scenario; the candidate's version is compared with the baseline's):

``pass_rate``
    Regression verdict of the candidate's pass rate against the baseline's
    (analyzers/verdicts.py): Fail when the one-sided Fisher test (Holm-adjusted) shows a
    drop and non-inferiority is not shown; Pass when the non-inferiority test shows the
    candidate no worse than baseline - delta at level beta and no significant drop; else
    Inconclusive, with the candidate runs the plan asks for (``n_required``, at the level
    alpha / m of the Holm family of m tests, the smallest level a stream can face).
``fingerprint``
    Hotelling T^2 of the candidate's fingerprints against the baseline's mean and
    covariance on the projected (effective) dimensions; reports which features moved and
    by how many baseline standard deviations. Calibrated by resampling when the samples
    are unbalanced or small (``calibration="auto"``): a permutation test when the baseline
    came as span files (its rows are known), else a bootstrap of the candidate.
``evaluation:<evaluator>``
    For each evaluator in the baseline (graded scores, ``gen_ai.evaluation.score.value``),
    the candidate's mean score against the baseline's (analyzers/score_tests.py): Fail when
    a drop is significant (Holm-adjusted) and a drop of ``score_drop`` (a fraction of the
    evaluator's scale) is not ruled out; Pass when non-inferiority at ``baseline -
    score_drop`` is shown at level beta and no drop is significant; else Inconclusive with
    the candidate scores needed. A Fail blocks, like a pass-rate regression.
``label:<evaluator>``
    For each evaluator in the baseline that labels runs without scoring them (correct /
    partial / incorrect), the candidate's labels against the baseline's counts
    (analyzers/label_tests.py: chi-square of the 2 x K table, exact conditional p-value
    by seeded Monte Carlo). Fail (a label shift) when its Holm-adjusted p-value is below
    alpha, reporting the category that gained most; else Pass. Labels have no known order,
    so a shift cannot say worse or better: it asks for manual review, never blocks nor
    deploys. Fewer than ``MIN_CANDIDATE_LABELS`` candidate labels: no test (reported,
    Inconclusive with ``not_tested``, which does not hold the gate).
``coverage``
    The candidate's coverage against ``c_min``.

The p-values of every stream's pass-rate, fingerprint, evaluation and label tests form
one Holm-Bonferroni family, so the chance that an unchanged candidate is held back by a false
positive is at most alpha (when ``fingerprint_alpha`` equals ``alpha``; each test is
judged against its own level on the adjusted p-value).

What is guaranteed (tests/realworld/test_gate_rates.py measures it): an unchanged
candidate is blocked, or sent to review by a test that rejected, with probability at most
alpha (one Holm family over every stream's two tests); a candidate with one stream
regressed by delta or more deploys with probability at most beta, at any number of runs
(every stream must pass its non-inferiority test at level beta). At the planned number of
runs (``planned_sample_size`` with ``tests`` = the family size) an unchanged suite also
deploys with probability about 1 - alpha; with fewer runs the price is Inconclusive
("record more runs"), never a false deploy.

Decision (SPEC 6.2 with our default policy): a significant pass-rate regression blocks; a
significant behaviour shift without a pass-rate regression asks for manual review
(``behaviour_shift: block`` makes it block); a label shift asks for manual review (it never
softens a block); an Inconclusive test, a missing baseline or
short coverage asks for manual review; otherwise deploy.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.coverage import coverage
from assaywatch.analyzers.detectors.label import LabelSummary
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.hotelling import hotelling_two_sample
from assaywatch.analyzers.label_tests import MIN_CANDIDATE_LABELS, LabelTestResult, label_test
from assaywatch.analyzers.model import Outcome, Run, StreamKey, Verdict
from assaywatch.analyzers.score_tests import ScoreTestResult, score_verdict
from assaywatch.analyzers.suite import holm
from assaywatch.analyzers.verdicts import (
    candidate_sample_size,
    planned_power,
    regression_verdict,
    wilson_interval,
)
from assaywatch.monitor.offline.report import GateReport, StreamResult, TestResult

DEPLOY, BLOCK, MANUAL = "deploy", "block", "manual"
EXIT_CODES = {DEPLOY: 0, BLOCK: 1, MANUAL: 2}
COVERAGE_DIMENSIONS = ("tool", "path", "state", "boundary", "model", "overall")


def _f(default: Any, doc: str) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=type(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class GatePolicy:
    """The gate configuration: SPEC.md's Gamma plus the decision policy (``--config``)."""

    alpha: float = _f(0.05, "Significance level of each test, family-wise over streams "
                      "(Holm-Bonferroni).")
    beta: float = _f(0.1, "1 - required power at a pass-rate drop of delta; a design with "
                     "less power cannot Pass (Inconclusive).")
    delta: float = _f(0.1, "Smallest pass-rate drop that counts as a regression.")
    theta: float = _f(0.85, "Pass-rate threshold of the single-version verdict (live gate).")
    c_min: float = _f(0.0, "Minimum overall coverage of the candidate to deploy.")
    n_max: int = _f(500, "Largest number of candidate runs the live gate spends per stream.")
    t_max_seconds: float = _f(0.0, "Wall-time cap of the live gate (0: none).")
    test: str = _f("fisher", "Pass-rate test: fisher (exact) or z (two-proportion).")
    behaviour_shift: str = _f("manual", "What a significant fingerprint shift without a "
                              "pass-rate regression does: manual or block.")
    fingerprint_alpha: float = _f(0.05, "Significance level of the Hotelling T^2 test.")
    evaluation_threshold: float = _f(0.5, "An evaluation score at or above this is a pass.")
    score_drop: float = _f(0.1, "Smallest drop of an evaluator's mean score, as a fraction "
                           "of its scale (0.1 on 0-1 scores, 0.4 on a 1-5 rubric), that "
                           "counts as a regression (evaluation tests).")
    key_attributes: list[str] = _f([], "Extra stream key attributes, as the monitor's "
                                   "streams.key_attributes: set both alike so baselines and "
                                   "candidates are split the same way.")
    scores_decide: bool = _f(True, "Live gate: a stream whose every graded evaluator passed "
                             "its sequential test stops there, without waiting for the "
                             "pass/fail SPRT (reported as superseded); false waits for both.")
    contracts: dict[str, Any] = _f({}, "Contract rules deciding outcomes of runs that carry "
                                   "no evaluation (max_steps, required_tools, ...); also "
                                   "checked as a trace-first test (violation rate).")
    relations: list[Any] = _f([], "Metamorphic relations judged from the traces (format "
                              "compliance, constraint preservation, marked pairs); see "
                              "monitor/offline/tracefirst.py.")
    violation_eps: float = _f(0.05, "Tolerated violation rate of a contract or relation "
                              "when the baseline's own rate is unknown (baseline JSON).")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "gate config") -> GatePolicy:
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(names)}")
        pol = cls(**{k: (float(v) if isinstance(getattr(cls(), k), float)
                         and isinstance(v, int) and not isinstance(v, bool) else v)
                     for k, v in data.items()})
        pol.validate(where)
        return pol

    def validate(self, where: str = "gate config") -> None:
        for name in ("alpha", "beta", "delta", "fingerprint_alpha", "score_drop"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"{where}: {name} must lie strictly between 0 and 1, got {v!r}")
        if not 0 <= self.c_min <= 1:
            raise ValueError(f"{where}: c_min must lie in [0, 1], got {self.c_min!r}")
        if self.test not in ("fisher", "z"):
            raise ValueError(f"{where}: test must be fisher or z, got {self.test!r}")
        if not isinstance(self.scores_decide, bool):
            raise ValueError(f"{where}: scores_decide must be true or false, "
                             f"got {self.scores_decide!r}")
        if self.behaviour_shift not in ("manual", "block"):
            raise ValueError(f"{where}: behaviour_shift must be manual or block, "
                             f"got {self.behaviour_shift!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def match_baseline(key: StreamKey, baselines: Mapping[StreamKey, Baseline]) -> Baseline | None:
    """The baseline of the same stream, else of the same agent and scenario (any version)."""
    if key in baselines:
        return baselines[key]
    same = [b for k, b in baselines.items() if k.agent == key.agent and k.scenario == key.scenario]
    if len(same) == 1:
        return same[0]
    if same:  # several versions: the most recent one
        return max(same, key=lambda b: b.last_start_ns or 0)
    return None


def _rate(k: int, n: int) -> tuple[float, float, float, int]:
    lo, hi = wilson_interval(k, n, 0.05) if n else (0.0, 1.0)
    return (k / n if n else float("nan"), lo, hi, n)


def decide(baselines: Sequence[Baseline], candidate_runs: Iterable[Run],
           policy: GatePolicy, inputs: dict[str, Any] | None = None,
           baseline_runs: Sequence[Run] | None = None) -> GateReport:
    """The gate decision; ``baseline_runs`` (when the baseline came as span files) lets the
    trace-first checks compare violation rates with the baseline's own, and the fingerprint
    test calibrate by permutation."""
    by_key = {b.key: b for b in baselines}
    groups: dict[StreamKey, list[Run]] = defaultdict(list)
    candidate_runs = list(candidate_runs)
    for run in candidate_runs:
        groups[run.key].append(run)
    base_groups: dict[StreamKey, list[Run]] = defaultdict(list)
    for run in baseline_runs or ():
        base_groups[run.key].append(run)
    streams: list[StreamResult] = []
    pr_raw: list[tuple[int, Any]] = []
    fp_raw: list[tuple[int, Any]] = []
    ev_raw: list[tuple[int, ScoreTestResult]] = []
    lab_in: list[tuple[int, str, LabelSummary, list[str]]] = []
    matched: set[StreamKey] = set()
    for key in sorted(groups):
        runs = groups[key]
        base = match_baseline(key, by_key)
        sr = StreamResult(agent=key.agent, version=key.version, scenario=key.scenario,
                          baseline_version=base.key.version if base else "")
        streams.append(sr)
        if base is None:
            sr.tests.append(TestResult("baseline", Verdict.INCONCLUSIVE.value, {},
                                       "no baseline for this agent and scenario"))
            continue
        matched.add(base.key)
        k_c = sum(r.outcome is Outcome.PASS for r in runs)
        n_c = sum(r.outcome is not Outcome.UNKNOWN for r in runs)
        rows = base_groups.get(base.key, [])
        X_b = fingerprint_matrix(rows, base.tools) if len(rows) == base.n_runs >= 2 else None
        res, h = stream_statistics(sr, base, k_c, n_c, fingerprint_matrix(runs, base.tools),
                                   policy, X_b)
        if res is not None:
            pr_raw.append((len(streams) - 1, res))
        if h is not None:
            fp_raw.append((len(streams) - 1, h))
        ev_raw.extend((len(streams) - 1, r) for r in evaluation_statistics(base, runs, policy,
                                                                          rows))
        lab_in.extend((len(streams) - 1, *x) for x in label_inputs(sr, base, runs))
        add_coverage_test(sr, runs, base.tools, policy.c_min)
    # B of the Monte Carlo p-values from the smallest level Holm can test them at
    level = policy.alpha / max(1, len(pr_raw) + len(fp_raw) + len(ev_raw) + len(lab_in))
    lab_raw = [(i, label_test(name, summary, labels, level=level))
               for i, name, summary, labels in lab_in]
    judge(streams, pr_raw, fp_raw, policy, ev_raw, lab_raw)
    _trace_first(streams, baseline_runs, candidate_runs, policy)
    for b in baselines:
        if b.key not in matched and not any(
                s.agent == b.key.agent and s.scenario == b.key.scenario for s in streams):
            sr = StreamResult(agent=b.key.agent, version="", scenario=b.key.scenario,
                              baseline_version=b.key.version)
            sr.tests.append(TestResult("pass_rate", Verdict.INCONCLUSIVE.value, {},
                                       "the candidate has no runs for this baseline stream"))
            streams.append(sr)
    verdict, reason = decision(streams, policy)
    return GateReport(decision=verdict, exit_code=EXIT_CODES[verdict], reason=reason,
                      config=policy.to_dict(), streams=streams, inputs=inputs or {})


def stream_statistics(sr: StreamResult, base: Baseline, k_c: int, n_c: int,
                      X: NDArray[np.float64], policy: GatePolicy,
                      X_b: NDArray[np.float64] | None = None) -> tuple[Any, Any]:
    """The raw pass-rate verdict and Hotelling result of one stream (None when a test has
    nothing to compare), from counts and fingerprint matrices; records the pass rates and
    feature shifts on ``sr``. :func:`judge` then decides them as one Holm family."""
    n_b = base.passes + base.fails
    sr.pass_rates = {"baseline": _rate(base.passes, n_b), "candidate": _rate(k_c, n_c)}
    res = h = None
    if n_b and n_c:
        res = regression_verdict(base.passes, n_b, k_c, n_c, alpha=policy.alpha,
                                 beta=policy.beta, delta=policy.delta, test=policy.test)
    else:
        sr.tests.append(TestResult("pass_rate", Verdict.INCONCLUSIVE.value,
                                   {"n_baseline": n_b, "n_candidate": n_c},
                                   "no decided outcomes to compare"))
    if X.shape[0] >= 2 and base.n_runs >= 2:
        # Seeded by the stream, so the same inputs give the same report.
        h = hotelling_two_sample(base.mean, base.cov, base.n_runs, X,
                                 alpha=policy.fingerprint_alpha,
                                 feature_names=base.feature_names, X_b=X_b,
                                 calibration="auto", seed=zlib.crc32(str(base.key).encode()))
        sr.feature_shifts = [(n, float(v)) for n, v in h.feature_shifts]
    return res, h


def evaluation_statistics(base: Baseline, runs: Sequence[Run], policy: GatePolicy,
                          baseline_runs: Sequence[Run] = ()) -> list[ScoreTestResult]:
    """One score comparison per evaluator of the baseline that scored candidate runs
    (its runs' own scores when the baseline came as span files)."""
    out = []
    for name, summary in sorted(base.evaluators.items()):
        cand = [r.scores[name] for r in runs if name in r.scores]
        if not cand:
            continue
        own = [r.scores[name] for r in baseline_runs if name in r.scores]
        out.append(score_verdict(name, summary, cand, policy.score_drop,
                                 own if len(own) == summary.n else None))
    return out


def judge(streams: list[StreamResult], pr_raw: list[tuple[int, Any]],
          fp_raw: list[tuple[int, Any]], policy: GatePolicy,
          ev_raw: Sequence[tuple[int, ScoreTestResult]] = (),
          lab_raw: Sequence[tuple[int, LabelTestResult]] = ()) -> None:
    """Decide every stream's pass-rate, fingerprint, evaluation and label tests as one
    Holm-Bonferroni family (indices into ``streams``), adding their TestResults."""
    # One family over every test that can stop a deploy (the pass-rate, the fingerprint,
    # the evaluation and the label tests of every stream), so an unchanged suite is held
    # back by a false positive with probability at most alpha, however many streams and
    # tests it has.
    adjusted = holm([r.p_value for _, r in pr_raw] + [float(h.p_value) for _, h in fp_raw]
                    + [r.p_value for _, r in ev_raw] + [r.p_value for _, r in lab_raw])
    family = len(adjusted)
    n_pr, n_fp, n_ev = len(pr_raw), len(fp_raw), len(ev_raw)
    _pass_rate_tests(streams, pr_raw, adjusted[:n_pr], policy, family)
    _fingerprint_tests(streams, fp_raw, adjusted[n_pr:n_pr + n_fp], policy)
    _evaluation_tests(streams, ev_raw, adjusted[n_pr + n_fp:n_pr + n_fp + n_ev], policy,
                      family)
    _label_tests(streams, lab_raw, adjusted[n_pr + n_fp + n_ev:], policy, family)


def label_inputs(sr: StreamResult, base: Baseline, runs: Sequence[Run]
                 ) -> list[tuple[str, LabelSummary, list[str]]]:
    """(evaluator, baseline labels, candidate labels) of each labelling evaluator of the
    baseline with enough candidate labels to test; the others get a TestResult saying why
    not (Inconclusive, ``not_tested``: it does not hold the gate). An evaluator that scores
    is tested by its scores."""
    out = []
    for name, summary in sorted(base.labels.items()):
        if name in base.evaluators:
            continue
        labels = [r.labels[name] for r in runs if name in r.labels]
        if summary.n >= 1 and len(labels) >= MIN_CANDIDATE_LABELS:
            out.append((name, summary, labels))
            continue
        why = (f"the candidate has no labels of {name}" if not labels else
               f"only {len(labels)} candidate labels of {name} (a test needs "
               f"{MIN_CANDIDATE_LABELS})" if summary.n else "the baseline has no labels")
        sr.tests.append(TestResult(
            f"{LABEL_TEST}{name}", Verdict.INCONCLUSIVE.value,
            {"n_baseline": summary.n, "n_candidate": len(labels), "not_tested": True},
            f"{name}: {why} (baseline {summary.n}): no label test"))
    return out


def _label_tests(streams: list[StreamResult], raw: Sequence[tuple[int, LabelTestResult]],
                 adjusted: list[float], policy: GatePolicy, family: int) -> None:
    for (i, r), p_adj in zip(raw, adjusted, strict=True):
        cat, share_b, share_c = r.gained
        moved = f"{cat!r} {share_b:.2f} -> {share_c:.2f}"
        if p_adj < policy.alpha:
            verdict, msg = Verdict.FAIL, (
                f"{r.evaluator}: label shift (Holm p = {p_adj:.2g}): {moved}; labels of "
                "unknown order cannot say worse or better: review")
        else:
            verdict, msg = Verdict.PASS, (
                f"{r.evaluator}: no label shift detected (Holm p = {p_adj:.2g}); gained "
                f"most: {moved}")
        stats = {"p_value": r.p_value, "p_value_holm": p_adj, "family_size": family,
                 "chi_square": r.statistic, "categories": len(r.categories),
                 "n_baseline": r.n_b, "n_candidate": r.n_c, "gained": cat,
                 "share_baseline": share_b, "share_candidate": share_c,
                 "difference": share_c - share_b, "new_labels": len(r.new_labels),
                 "folded": r.folded, "baseline_folded": r.baseline_folded,
                 "mc_draws": r.draws}
        streams[i].tests.append(TestResult(f"{LABEL_TEST}{r.evaluator}", verdict.value,
                                           stats, msg))


def _evaluation_tests(streams: list[StreamResult], raw: Sequence[tuple[int, ScoreTestResult]],
                      adjusted: list[float], policy: GatePolicy, family: int) -> None:
    for (i, r), p_adj in zip(raw, adjusted, strict=True):
        worse, within = p_adj < policy.alpha, r.ni_p_value < policy.beta
        drop = f"{policy.score_drop:g} of the scale"
        n_required = 0
        if worse and not within:
            verdict, msg = Verdict.FAIL, (
                f"{r.evaluator} score fell from {r.mean_b:.3f} to {r.mean_c:.3f} (of 1; Holm "
                f"p = {p_adj:.2g} < {policy.alpha}); a drop of {drop} is not ruled out "
                f"(non-inferiority p = {r.ni_p_value:.2g})")
        elif within and not worse:
            verdict, msg = Verdict.PASS, (
                f"{r.evaluator}: no worse than baseline - {drop} (non-inferiority p = "
                f"{r.ni_p_value:.2g} < {policy.beta}), no significant drop (Holm p = "
                f"{p_adj:.2g})")
        elif worse:
            verdict, msg = Verdict.INCONCLUSIVE, (
                f"{r.evaluator}: a real drop from {r.mean_b:.3f} to {r.mean_c:.3f} (Holm p = "
                f"{p_adj:.2g}), shown smaller than {drop}")
        else:
            n_required = r.n_required(policy.alpha / max(1, family), policy.beta) or 0
            need = (f"about {n_required} candidate scores are needed" if n_required else
                    f"the baseline's {r.n_b} scores are too few: record more baseline runs")
            verdict, msg = Verdict.INCONCLUSIVE, (
                f"{r.evaluator}: not enough scores: no significant drop (Holm p = "
                f"{p_adj:.2g}) but a drop of {drop} not ruled out (non-inferiority p = "
                f"{r.ni_p_value:.2g} >= {policy.beta}); {need}")
        stats = {"p_value": r.p_value, "p_value_holm": p_adj,
                 "p_value_noninferiority": r.ni_p_value, "family_size": family,
                 "mean_baseline": r.mean_b, "mean_candidate": r.mean_c,
                 "difference": r.difference, "n_baseline": r.n_b, "n_candidate": r.n_c,
                 "score_drop": policy.score_drop, "n_required": n_required}
        streams[i].tests.append(TestResult(f"{EVALUATION_TEST}{r.evaluator}", verdict.value,
                                           stats, msg))


def add_coverage_test(sr: StreamResult, runs: Sequence[Run], tools: Sequence[str],
                      c_min: float) -> None:
    """The candidate's coverage per dimension, and its test against ``c_min``."""
    cov = coverage(runs, tools)
    sr.coverage = {d: float(getattr(cov, d)) for d in COVERAGE_DIMENSIONS}
    ok = sr.coverage["overall"] >= c_min
    sr.tests.append(TestResult(
        "coverage", Verdict.PASS.value if ok else Verdict.FAIL.value,
        {**{f"coverage_{d}": v for d, v in sr.coverage.items()}, "c_min": c_min},
        f"overall coverage {sr.coverage['overall']:.3f} {'>=' if ok else '<'} c_min {c_min}"))


def _pass_rate_tests(streams: list[StreamResult], raw: list[tuple[int, Any]],
                     adjusted: list[float], policy: GatePolicy, family: int) -> None:
    level = policy.alpha / max(1, family)
    for (i, r), p_adj in zip(raw, adjusted, strict=True):
        worse, within = p_adj < policy.alpha, r.ni_p_value < policy.beta
        power = planned_power(r.p_b, r.n_b, r.n_c, policy.delta, level, r.test)
        n_required = 0
        if worse and not within:
            verdict, msg = Verdict.FAIL, (
                f"pass rate fell from {r.p_b:.3f} to {r.p_c:.3f} (Holm-adjusted p = "
                f"{p_adj:.2g} < {policy.alpha}); a drop of {policy.delta} is not ruled out "
                f"(non-inferiority p = {r.ni_p_value:.2g})")
        elif within and not worse:
            verdict, msg = Verdict.PASS, (
                f"no regression: no worse than baseline - {policy.delta} (non-inferiority "
                f"p = {r.ni_p_value:.2g} < {policy.beta}), no significant drop (Holm p = "
                f"{p_adj:.2g})")
        elif worse:
            verdict, msg = Verdict.INCONCLUSIVE, (
                f"a real drop from {r.p_b:.3f} to {r.p_c:.3f} (Holm p = {p_adj:.2g}), shown "
                f"smaller than delta {policy.delta} (non-inferiority p = {r.ni_p_value:.2g})")
        else:
            n_required = candidate_sample_size(r.k_b, r.n_b, policy.delta, policy.alpha,
                                               policy.beta, r.test, max(1, family)) or 0
            need = (f"about {n_required} candidate runs are needed" if n_required else
                    f"the baseline's {r.n_b} decided runs are too few at any candidate size: "
                    "record more baseline runs")
            verdict, msg = Verdict.INCONCLUSIVE, (
                f"not enough runs: no significant drop (Holm p = {p_adj:.2g}) but a drop of "
                f"{policy.delta} not ruled out (non-inferiority p = {r.ni_p_value:.2g} >= "
                f"{policy.beta}; power {power:.2f} at alpha/{family}); {need}")
        e = r.effects
        stats = {"p_value": r.p_value, "p_value_holm": p_adj, "p_value_noninferiority":
                 r.ni_p_value, "power": power, "family_size": family,
                 "p_baseline": r.p_b, "p_candidate": r.p_c, "difference": e.difference,
                 "cohens_h": e.cohens_h, "odds_ratio": e.odds_ratio, "effect": e.label,
                 "n_required": n_required, "test": r.test}
        streams[i].tests.insert(0, TestResult("pass_rate", verdict.value, stats, msg))


def _fingerprint_tests(streams: list[StreamResult], raw: list[tuple[int, Any]],
                       adjusted: list[float], policy: GatePolicy) -> None:
    for (i, h), p_adj in zip(raw, adjusted, strict=True):
        moved = ", ".join(f"{n} {v:+.2f} sd" for n, v in list(h.feature_shifts)[:3])
        if p_adj < policy.fingerprint_alpha:
            verdict, msg = Verdict.FAIL, (f"behaviour shifted (Hotelling p = {p_adj:.2g}); "
                                          f"moved most: {moved}")
        else:
            verdict, msg = Verdict.PASS, f"no behaviour shift detected (p = {p_adj:.2g})"
        stats = {"t2": float(h.t2), "f": float(h.f), "df1": int(h.df1), "df2": float(h.df2),
                 "p_value": float(h.p_value), "p_value_holm": p_adj, "d_eff": int(h.d_eff),
                 "mahalanobis": float(h.mahalanobis), "calibration": h.calibration,
                 "p_value_f": float(h.p_value_f)}
        for rank, (name, v) in enumerate(list(h.feature_shifts)[:5], 1):
            stats[f"moved_{rank}"] = f"{name} {float(v):+.3f}"
        pos = 1 if streams[i].tests and streams[i].tests[0].name == "pass_rate" else 0
        streams[i].tests.insert(pos, TestResult("fingerprint", verdict.value, stats, msg))


#: Tests that judge the pass rate: the offline regression verdict, the live gate's SPRT.
PASS_RATE_TESTS = ("pass_rate", "sprt")
TRACE_FIRST_EXEMPT = ("baseline", *PASS_RATE_TESTS, "fingerprint", "coverage")
#: Name prefix of the evaluation tests (``evaluation:helpfulness``).
EVALUATION_TEST = "evaluation:"
#: Name prefix of the label tests (``label:correctness``).
LABEL_TEST = "label:"


def _trace_first(streams: list[StreamResult], baseline_runs: Sequence[Run] | None,
                 candidate_runs: Sequence[Run], policy: GatePolicy) -> None:
    """Contract and metamorphic-relation checks on the stored traces (zero token cost)."""
    if not policy.contracts and not policy.relations:
        return
    from assaywatch.monitor.offline.tracefirst import relations_from_config, trace_first_by_stream
    from assaywatch.monitor.pipeline.outcome import ContractRules

    rules = ContractRules.from_dict(policy.contracts) if policy.contracts else None
    relations = relations_from_config(policy.relations)
    found = trace_first_by_stream(baseline_runs, candidate_runs, rules, relations, policy,
                                  eps=policy.violation_eps)
    for sr in streams:
        sr.tests.extend(found.get((sr.agent, sr.scenario), []))


def decision(streams: list[StreamResult], policy: GatePolicy,
             all_passed: str = "every stream passed: no regression, no behaviour shift, "
                               "coverage met") -> tuple[str, str]:
    """Deploy / block / manual and why, from the streams' test results (SPEC 6.2 with the
    policy of the module docstring); shared by the offline and the live gate."""
    def find(names: tuple[str, ...], verdict: str) -> list[str]:
        return sorted({s.name for s in streams for t in s.tests
                       if t.name in names and t.verdict == verdict})

    if not streams:
        return MANUAL, "no candidate runs and no baseline streams to compare"
    regressed = find(PASS_RATE_TESTS, "fail")
    if regressed:
        return BLOCK, f"pass-rate regression in {', '.join(regressed)}"
    scored = sorted({f"{s.name} ({t.name.removeprefix(EVALUATION_TEST)})" for s in streams
                     for t in s.tests
                     if t.name.startswith(EVALUATION_TEST) and t.verdict == "fail"})
    if scored:
        return BLOCK, f"evaluation score regression in {', '.join(scored)}"
    broken = sorted({f"{s.name} ({t.name})" for s in streams for t in s.tests
                     if t.name not in TRACE_FIRST_EXEMPT and t.verdict == "fail"
                     and not t.name.startswith((EVALUATION_TEST, LABEL_TEST))})
    if broken:
        return BLOCK, f"contract or relation violations rose in {', '.join(broken)}"
    shifted = find(("fingerprint",), "fail")
    if shifted and policy.behaviour_shift == "block":
        return BLOCK, f"behaviour shift in {', '.join(shifted)} (policy: block)"
    reasons = []
    if shifted:
        reasons.append(f"behaviour shift without a pass-rate regression in {', '.join(shifted)}")
    labelled = sorted({f"{s.name} ({t.name.removeprefix(LABEL_TEST)}: {t.statistics['gained']!r} "
                       f"{t.statistics['share_baseline']:.2f} -> "
                       f"{t.statistics['share_candidate']:.2f})" for s in streams
                       for t in s.tests if t.name.startswith(LABEL_TEST) and t.verdict == "fail"})
    if labelled:
        reasons.append(f"label shift (labels of unknown order: review) in {', '.join(labelled)}")
    short = find(("coverage",), "fail")
    if short:
        reasons.append(f"coverage below c_min in {', '.join(short)}")
    unsure = sorted({s.name for s in streams for t in s.tests if t.verdict == "inconclusive"
                     and not t.statistics.get("superseded_by_evaluations")
                     and not t.statistics.get("not_tested")})
    if unsure:
        reasons.append(f"inconclusive in {', '.join(unsure)}")
    if reasons:
        return MANUAL, "; ".join(reasons)
    return DEPLOY, all_passed
