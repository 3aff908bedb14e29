"""The live gate with a graded evaluator (monitor/live/sequential.py): the evaluation tests
decide a stream, and spend fewer runs than the pass/fail SPRT on the same runs.

Runs come from the simulated agent (tests/analyzers/simagent.py), each with a judge's
lumpy helpfulness score (tests/analyzers/test_score_tests.py ``lumpy``) and the outcome
"score >= 0.7 passes": the pass rate is the score's own coarsening (0.70 before, 0.60
after a drop of 0.1 of the mean), as when the oracle thresholds the judge.
"""

from __future__ import annotations

import numpy as np

from assaywatch.analyzers.baseline import build_baseline
from assaywatch.analyzers.fingerprint import fingerprint
from assaywatch.analyzers.model import Outcome, Run, Verdict
from assaywatch.monitor.live.sequential import LiveConfig, StreamTest
from assaywatch.monitor.offline.gate import GatePolicy, decision
from tests.analyzers.simagent import simulate_runs
from tests.analyzers.test_score_tests import lumpy


def _runs(rng: np.random.Generator, n: int, regressed: bool) -> list[Run]:
    runs = simulate_runs(n, rng)
    for r, s in zip(runs, lumpy(rng, (n,), regressed), strict=True):
        r.scores = {"helpfulness": float(s)}
        r.outcome = Outcome.PASS if s >= 0.7 else Outcome.FAIL
    return runs


def _spend(test: StreamTest, runs: list[Run]) -> int:
    base = test.baseline
    for r in runs:
        if test.done:
            break
        test.update(r.outcome is Outcome.PASS, fingerprint(r, base.tools), r.scores)
    return test.n_runs


def test_evaluations_decide_a_stream_in_fewer_runs_than_the_sprt() -> None:
    rng = np.random.default_rng(20261202)
    base = build_baseline(_runs(rng, 400, False))
    with_scores = LiveConfig(fingerprint=False)
    bits_only = LiveConfig(fingerprint=False, scores=False)
    spent: dict[tuple[bool, bool], list[int]] = {}
    verdicts: dict[tuple[bool, bool], list[str]] = {}
    for regressed in (False, True):
        for scores in (True, False):
            spent[(regressed, scores)] = []
            verdicts[(regressed, scores)] = []
        for _ in range(60):
            runs = _runs(rng, 600, regressed)
            for scores, cfg in ((True, with_scores), (False, bits_only)):
                t = StreamTest(base, cfg, "1.0")
                spent[(regressed, scores)].append(_spend(t, runs))
                # a stream ends failed when either test failed, passed when the tests
                # that decide it passed (the SPRT alone, or every evaluation)
                failed = t.sprt.decision is Verdict.FAIL or t.scores_failed
                passed = (t.scores_passed if scores else t.sprt.decision is Verdict.PASS)
                verdicts[(regressed, scores)].append(
                    "fail" if failed else "pass" if passed else "none")
    for regressed in (False, True):
        mean_scores = float(np.mean(spent[(regressed, True)]))
        mean_bits = float(np.mean(spent[(regressed, False)]))
        print(f"regressed={regressed}: runs spent with the evaluation test {mean_scores:.1f}, "
              f"SPRT on the pass/fail bit {mean_bits:.1f} (x{mean_bits / mean_scores:.2f})")
        assert mean_scores < mean_bits
    # right answers, nearly always (alpha 0.05, beta 0.1 bound the wrong ones)
    for scores in (True, False):
        print(f"scores={scores}: unchanged {dict(_count(verdicts[(False, scores)]))}, "
              f"regressed {dict(_count(verdicts[(True, scores)]))}")
    # the regression is a drop of exactly score_drop: the evaluation test may pass it with
    # probability beta = 0.1 (6 of 60, binomial sd 2.3; at most 13 allowed), and an
    # unchanged candidate fails with probability about alpha (3 of 60; at most 9)
    assert verdicts[(False, True)].count("pass") >= 51
    assert verdicts[(True, True)].count("fail") >= 47


def _count(xs: list[str]) -> dict[str, int]:
    return {k: xs.count(k) for k in sorted(set(xs))}


def test_a_stream_decided_by_its_evaluations_deploys_without_the_sprt() -> None:
    from assaywatch.monitor.offline.report import StreamResult, TestResult

    rng = np.random.default_rng(5)
    base = build_baseline(_runs(rng, 400, False))
    runs = _runs(rng, 600, False)
    t = StreamTest(base, LiveConfig(fingerprint=False), "1.0")
    _spend(t, runs)
    assert t.done and t.stopped_by == "evaluation" and t.scores_passed
    assert t.sprt.decision is None and t.sprt_superseded
    sr = StreamResult("support-agent", "1.0", "refund", "1.0", tests=[
        TestResult("sprt", Verdict.INCONCLUSIVE.value, {"superseded_by_evaluations": True}),
        TestResult("evaluation:helpfulness", Verdict.PASS.value)])
    assert decision([sr], GatePolicy())[0] == "deploy"
    waits = StreamTest(base, LiveConfig(fingerprint=False, scores_decide=False), "1.0")
    n = _spend(waits, runs)
    assert n > t.n_runs and waits.sprt.decision is not None
