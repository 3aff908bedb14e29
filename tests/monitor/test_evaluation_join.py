"""Evaluations received as log events, joined to their runs (pipeline/join.py), and each
evaluator of a stream monitored as its own signal (engine + exporter).

The assembler's clock is a variable here, so "the trace closed", "the window passed" are
exact. Expected values are counts a reader can tally from the scenario.
"""

from __future__ import annotations

import gc
import random
from collections import OrderedDict

import numpy as np
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.analyzers.model import Outcome, Run, StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.page import status_page, stream_summary
from assaywatch.monitor.exporters.prometheus import MonitorCollector
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.join import LateEvaluation, _RunDigest
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.receivers.spans import (
    IngestCounters,
    SpanRecord,
    evaluation_record,
)
from tests.monitor.decoders import NATIVE_INSTALLED
from tests.monitor.spanfactory import SpanFactory, tool_agent


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _asm(clock: Clock, **kw: object) -> Assembler:
    return Assembler(clock=clock, grace_s=1.0, max_age_s=100.0, join_window_s=60.0,
                     **kw)  # type: ignore[arg-type]


def _run_spans(seed: int) -> list[SpanRecord]:
    return SpanFactory(seed=seed).agent_run(tool_agent(), "genai")


def _root(spans: list[SpanRecord]) -> SpanRecord:
    return next(s for s in spans if not s.parent_span_id)


def _eval(span: SpanRecord, name: str = "helpfulness", score: float | None = 0.8,
          label: str | None = None) -> SpanRecord:
    attrs: dict[str, object] = {"gen_ai.evaluation.name": name}
    if score is not None:
        attrs["gen_ai.evaluation.score.value"] = score
    if label is not None:
        attrs["gen_ai.evaluation.score.label"] = label
    return evaluation_record(span.trace_id, span.span_id, 0, attrs,  # type: ignore[arg-type]
                             {"service.name": "judge"})


def test_an_evaluation_arriving_while_its_trace_is_pending_is_on_the_run() -> None:
    clock = Clock()
    asm = _asm(clock)
    spans = _run_spans(1)
    asm.add(spans[:2])
    asm.add([_eval(_root(spans), score=0.2)])  # the root has not even arrived yet
    asm.add(spans[2:])
    clock.t = 2.0
    runs = asm.poll()
    assert len(runs) == 1
    assert runs[0].scores == {"helpfulness": 0.2}
    assert runs[0].outcome is Outcome.FAIL  # 0.2 < the 0.5 threshold, as on a span
    assert asm.join.counts["on_trace"] == 1
    assert asm.take_evaluations() == []


def test_an_evaluation_arriving_before_its_trace_waits_for_it() -> None:
    clock = Clock()
    asm = _asm(clock)
    spans = _run_spans(2)
    asm.add([_eval(_root(spans), score=0.9)])
    assert asm.join.waiting == 1 and asm.pending_traces == 0
    clock.t = 30.0  # within the 60 s window
    asm.add(spans)
    clock.t = 32.0
    runs = asm.poll()
    assert [r.scores for r in runs] == [{"helpfulness": 0.9}]
    assert asm.join.waiting == 0 and asm.join.counts["on_trace"] == 1


def test_a_late_evaluation_joins_its_closed_run_within_the_window_only() -> None:
    clock = Clock()
    asm = _asm(clock)
    a, b = _run_spans(3), _run_spans(4)
    asm.add(a + b)
    clock.t = 2.0
    runs = {r.trace_id: r for r in asm.poll()}
    assert len(runs) == 2
    clock.t = 40.0  # 38 s after the close: joins
    asm.add([_eval(_root(a), score=0.7), _eval(a[0], name="groundedness", score=3.0)])
    late = asm.take_evaluations()
    assert [(x.run_id, x.key, x.scores) for x in late] == [
        (runs[a[0].trace_id].run_id, runs[a[0].trace_id].key, {"helpfulness": 0.7}),
        (runs[a[0].trace_id].run_id, runs[a[0].trace_id].key, {"groundedness": 3.0})]
    clock.t = 63.0  # 61 s after the close: the digests are gone at the next poll
    asm.poll()
    asm.add([_eval(_root(b), score=0.1)])
    assert asm.take_evaluations() == []
    assert asm.join.waiting == 1  # waits as if its trace were still to come
    clock.t = 124.0
    asm.poll()
    assert asm.join.waiting == 0
    assert dict(asm.join.counts) == {"late": 2, "unmatched": 1}


def test_in_a_trace_of_two_runs_the_evaluated_span_names_the_run() -> None:
    clock = Clock()
    asm = _asm(clock)
    f = SpanFactory(seed=5)
    spans = f.http_request([tool_agent(name="a"), tool_agent(name="b")], "genai")
    asm.add(spans)
    clock.t = 2.0
    runs = asm.poll()
    assert len(runs) == 2
    second = max(runs, key=lambda r: r.start_ns)
    step = second.steps[1]
    target = next(s for s in spans if s.span_id == step.span_id)
    stranger = SpanRecord(trace_id=target.trace_id, span_id="ffffffffffffffff",
                          parent_span_id="", name="x", start_ns=0, end_ns=0)
    asm.add([_eval(target, score=0.4), _eval(stranger, score=0.4)])
    late = asm.take_evaluations()
    assert [x.run_id for x in late] == [second.run_id]
    assert dict(asm.join.counts) == {"late": 1, "unmatched": 1}


def test_closed_runs_digests_are_not_walked_by_the_garbage_collector() -> None:
    # Up to max_closed traces' digests live for the join window: as plain tuples of
    # strings and ints the collector stops tracking them (a full collection never walks
    # them); one and two runs per trace.
    clock = Clock()
    asm = _asm(clock)
    f = SpanFactory(seed=5)
    one = _run_spans(3)
    two = f.http_request([tool_agent(name="a"), tool_agent(name="b")], "genai")
    asm.add(one + two)
    clock.t = 2.0
    runs = asm.poll()
    assert len(runs) == 3
    entries = list(asm.join._closed.values())
    assert len(entries) == 2
    parts = [x for _, digests in entries for d in digests for x in (d, d[4])
             if x is not None]
    assert len(parts) == 3 + 2  # 3 digests, the span ids of the two-run trace's 2
    if NATIVE_INSTALLED:  # untracked as they are made: no collection walks them even once
        assert not any(gc.is_tracked(e) for e in [*entries, *parts])
    for _ in range(4):  # a tuple is untracked once its items are: a level per collection
        gc.collect()
    assert not any(gc.is_tracked(e) for e in [*entries, *parts])
    # still whole: late evaluations of either trace name their runs
    second = max((r for r in runs if r.trace_id == two[0].trace_id), key=lambda r: r.start_ns)
    root_b = next(sp for sp in two if sp.span_id == second.root_span_id)
    asm.add([_eval(_root(one), score=0.3), _eval(root_b, score=0.4)])
    late = [x.run_id for x in asm.take_evaluations()]
    first = next(r for r in runs if r.trace_id == one[0].trace_id)
    assert late == [first.run_id, second.run_id]


def test_digests_of_a_checkpoint_written_before_they_were_tuples_still_join() -> None:
    clock = Clock()
    asm = _asm(clock)
    a = _run_spans(3)
    f_two = SpanFactory(seed=5).http_request([tool_agent(name="a"), tool_agent(name="b")],
                                             "genai")
    asm.add(a + f_two)
    clock.t = 2.0
    runs = asm.poll()
    # the former form: a frozen dataclass per run, with its StreamKey and a frozenset
    asm.join._closed = OrderedDict(
        (tid, (t, tuple(_RunDigest(rid, StreamKey(ag, ver, sc),
                                   None if ids is None else frozenset(ids), start)
                        for rid, ag, ver, sc, ids, start in d)))
        for tid, (t, d) in asm.join._closed.items())
    asm.join.restamp(clock.t)
    second = max((r for r in runs if r.trace_id == f_two[0].trace_id),
                 key=lambda r: r.start_ns)
    target = next(s for s in f_two if s.span_id == second.steps[1].span_id)
    asm.add([_eval(_root(a), score=0.7), _eval(target, score=0.4)])
    late = asm.take_evaluations()
    first = next(r for r in runs if r.trace_id == a[0].trace_id)
    assert [(x.run_id, x.key, x.scores) for x in late] == [
        (first.run_id, first.key, {"helpfulness": 0.7}),
        (second.run_id, second.key, {"helpfulness": 0.4})]


def test_invalid_evaluations_and_limits_are_counted() -> None:
    clock = Clock()
    asm = _asm(clock, max_waiting_evaluations=2, max_closed_runs=1)
    spans = [_run_spans(10 + i) for i in range(3)]
    asm.add([_eval(_root(spans[0]), score=None)])  # neither score nor label nor flag
    for s in spans:
        asm.add([_eval(_root(s))])  # three wait, room for two
    assert asm.join.counts["invalid"] == 1 and asm.join.counts["waiting_limit"] == 1
    asm.add(spans[0] + spans[1])
    clock.t = 2.0
    assert len(asm.poll()) == 2
    assert asm.join.counts["digest_evicted"] == 1  # room for one closed trace
    assert asm.join.digests == 1


def test_offline_assembly_joins_evaluations_found_anywhere_in_the_file() -> None:
    from assaywatch.monitor.pipeline.assemble import assemble_all

    spans = _run_spans(20)
    counters = IngestCounters()
    runs = assemble_all([_eval(_root(spans), score=0.6), *spans], counters=counters)
    assert [r.scores for r in runs] == [{"helpfulness": 0.6}]


# -- the engine: each evaluator a signal ---------------------------------------------------
KEY = StreamKey("support-agent", "1.0", "refund")


def _runs(n: int, rng: random.Random, start: int = 0) -> list[Run]:
    return [Run(trace_id=f"{start + i:032x}", root_span_id=f"{start + i:016x}", key=KEY,
                outcome=Outcome.PASS, start_ns=(start + i) * 10**9,
                end_ns=(start + i) * 10**9 + rng.randint(1, 9) * 10**8)
            for i in range(n)]


def _helpfulness(rng: random.Random, drop: float = 0.0) -> float:
    """Lumpy: 40% exactly 1.0, the rest spread over [0.4, 1.0]; ``drop`` moves each
    score down (clipped at 0)."""
    x = 1.0 if rng.random() < 0.4 else 0.4 + 0.6 * rng.random()
    return max(0.0, x - drop)


def _engine(**kw: object) -> Engine:
    cfg = DetectorConfig(learn_runs=300, arl0=2_000.0, **kw)  # type: ignore[arg-type]
    return Engine(cfg)


def test_an_evaluator_is_learned_into_the_baseline_and_alarms_on_a_drop_only() -> None:
    rng = random.Random(7)
    eng = _engine()
    learn = _runs(300, rng)
    for r in learn[:150]:
        r.scores = {"helpfulness": _helpfulness(rng)}  # on the trace
    for r in learn:
        eng.process(r)
    for r in learn[150:]:  # late: after their runs closed (the baseline froze meanwhile)
        eng.process_evaluation(LateEvaluation(r.run_id, KEY, Evaluation(name="helpfulness"),
                                              {"helpfulness": _helpfulness(rng)}))
    st = eng.stream(KEY)
    assert st is not None and st.baseline is not None
    summary = st.baseline.evaluators["helpfulness"]
    assert summary.n == 150 and (summary.lo, summary.hi) == (0.0, 1.0)
    ev = st.evaluators["helpfulness"]
    assert st.watch_of("helpfulness") is not None and ev.count == 300
    # 1,000 in-control scores: no alarm (the detector's ARL0 is >= 2,000 / 3 shares)
    quiet = _runs(1_000, rng, start=10_000)
    alarms = []
    for r in quiet:
        r.scores = {"helpfulness": _helpfulness(rng)}
        alarms += eng.process(r)
    assert [a for a in alarms if a.detector == "evaluation"] == []
    # the mean drops by 0.1 (the pass rate does not move: outcome stays PASS)
    worse = _runs(1_000, rng, start=20_000)
    fired_at = None
    for i, r in enumerate(worse):
        got = eng.process_evaluation(LateEvaluation(
            r.run_id, KEY, Evaluation(name="helpfulness"),
            {"helpfulness": _helpfulness(rng, drop=0.1)}))
        if got:
            fired_at = i
            assert [(a.detector, a.evaluator) for a in got] == [("evaluation", "helpfulness")]
            assert got[0].to_dict()["evaluator"] == "helpfulness"
            break
    assert fired_at is not None and fired_at < 600
    summary = stream_summary(st, hold=200)
    assert summary["alarms"] == [{
        "detector": "evaluation", "evaluator": "helpfulness",
        "fired_at": summary["alarms"][0]["fired_at"], "run_index": 1_000,
        "run_id": worse[fired_at].run_id, "moved": ["helpfulness score"]}]
    (listed,) = summary["evaluators"]
    assert listed["name"] == "helpfulness" and listed["monitored"]
    assert listed["scores"] == 300 + 1_000 + fired_at + 1
    assert listed["baseline"]["n"] == 150
    assert "helpfulness: recent" in status_page([summary], {})


def test_an_evaluator_first_seen_after_the_freeze_is_listed_but_not_monitored() -> None:
    rng = random.Random(8)
    eng = _engine()
    for r in _runs(300, rng):
        eng.process(r)
    r = _runs(1, rng, start=500)[0]
    r.scores = {"tone": 0.5}
    eng.process(r)
    st = eng.stream(KEY)
    assert st is not None
    ev = st.evaluators["tone"]
    assert st.watch_of("tone") is None and "not in the baseline" in ev.disabled
    assert ev.count == 1


def test_the_evaluation_share_splits_the_budget_only_when_evaluators_exist() -> None:
    rng = random.Random(9)
    with_scores, without = _engine(), _engine()
    for r in _runs(300, rng):
        without.process(r)
    for r in _runs(300, rng, start=1_000):
        r.scores = {"helpfulness": _helpfulness(rng), "groundedness": _helpfulness(rng)}
        with_scores.process(r)
    st0, st1 = without.stream(KEY), with_scores.stream(KEY)
    assert st0 is not None and st1 is not None
    assert st0.baseline is not None and st1.baseline is not None
    # default shares 0.5 / 0.5 / 0.5: without evaluators the fingerprint gets 1/2 of the
    # budget, with two it gets 1/3 and each evaluator 1/6
    assert without._share("cusum_fingerprint", st0.baseline) == 0.5
    assert np.isclose(with_scores._share("cusum_fingerprint", st1.baseline), 1 / 3)
    arl0s = {w.labels[1]: w.detector.arl0 for w in st1.watches.values()
             if w.labels[0] == "evaluation"}
    assert arl0s == {"helpfulness": 12_000.0, "groundedness": 12_000.0}


def test_metrics_name_each_evaluator() -> None:
    rng = random.Random(10)
    eng = _engine()
    for r in _runs(300, rng):
        r.scores = {"helpfulness": 0.5 + 0.5 * rng.random()}
        eng.process(r)
    registry = CollectorRegistry()
    registry.register(MonitorCollector(eng, IngestCounters()))
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    labels = (("agent", "support-agent"), ("evaluator", "helpfulness"),
              ("scenario", "refund"), ("version", "1.0"))
    assert samples[("assaywatch_evaluations_total", labels)] == 300
    assert 0.5 < samples[("assaywatch_evaluation_score", labels)] < 1.0
    alarm = (("agent", "support-agent"), ("detector", "evaluation"),
             ("evaluator", "helpfulness"), ("scenario", "refund"), ("version", "1.0"))
    assert samples[("assaywatch_alarm", alarm)] == 0
    fp_alarm = (("agent", "support-agent"), ("detector", "cusum_fingerprint"),
                ("evaluator", ""), ("scenario", "refund"), ("version", "1.0"))
    assert samples[("assaywatch_alarm", fp_alarm)] == 0
    # the evaluator's watch exports its statistic and threshold like the other charts
    stream = (("agent", "support-agent"), ("scenario", "refund"), ("version", "1.0"))
    watch = eng.stream(KEY).watch_of("helpfulness")  # type: ignore[union-attr]
    assert watch is not None
    stat = tuple(sorted((*stream, ("feature", "evaluation:helpfulness"))))
    thr = tuple(sorted((*stream, ("detector", "evaluation:helpfulness"))))
    assert samples[("assaywatch_cusum_statistic", stat)] == 0.0  # 300 learning runs
    assert samples[("assaywatch_cusum_threshold", thr)] == watch.detector.h > 0
    pass_thr = tuple(sorted((*stream, ("detector", "cusum_pass_rate"))))
    assert samples[("assaywatch_cusum_threshold", pass_thr)] > 0


def test_a_late_score_of_a_learning_run_after_the_freeze_is_set_aside() -> None:
    """The judge answered after the baseline froze for a run the baseline learned from: it
    is neither learned (frozen) nor fed to the detector (an in-control score diluting a
    change), only counted; a later run's score is monitored."""
    rng = random.Random(12)
    eng = _engine()
    learn = _runs(300, rng)
    for r in learn[:200]:
        r.scores = {"helpfulness": _helpfulness(rng)}
    for r in learn:
        eng.process(r)
    st = eng.stream(KEY)
    assert st is not None and st.baseline is not None
    late = learn[250]
    eng.process_evaluation(LateEvaluation(late.run_id, KEY, Evaluation(name="helpfulness"),
                                          {"helpfulness": 0.1}, late.start_ns))
    assert eng.dropped["evaluation_of_learning_run"] == 1
    assert st.evaluators["helpfulness"].count == 200
    after = _runs(1, rng, start=5_000)[0]
    eng.process(after)
    eng.process_evaluation(LateEvaluation(after.run_id, KEY, Evaluation(name="helpfulness"),
                                          {"helpfulness": 0.9}, after.start_ns))
    assert st.evaluators["helpfulness"].count == 201


def test_late_evaluations_nobody_takes_are_bounded_and_counted(monkeypatch) -> None:
    import assaywatch.monitor.pipeline.join as join_mod

    monkeypatch.setattr(join_mod, "MAX_LATE_PENDING", 2)
    clock = Clock()
    asm = _asm(clock)
    runs = [_run_spans(30 + i) for i in range(3)]
    asm.add([s for r in runs for s in r])
    clock.t = 2.0
    assert len(asm.poll()) == 3
    asm.add([_eval(_root(r)) for r in runs])
    assert len(asm.take_evaluations()) == 2
    assert asm.join.counts["late_not_taken"] == 1 and asm.join.counts["late"] == 3


def test_late_verdicts_reach_the_pass_rate_tests_and_missing_ones_time_out() -> None:
    """A judge that answers after the run closes decides its pass/fail too: once a stream
    has received one late verdict, its runs not judged on the trace wait for theirs (up to
    the join window, by the runs' end times) before the pass-rate tests count them."""
    rng = random.Random(13)
    eng = Engine(DetectorConfig(learn_runs=300, arl0=2_000.0), verdict_window_s=60.0)
    for r in _runs(300, rng):
        eng.process(r)  # outcome PASS at close (no evaluation on the trace)
    st = eng.stream(KEY)
    assert st is not None and st.baseline is not None and not st.late_verdicts
    first = _runs(1, rng, start=1_000)[0]
    eng.process(first)  # counted at close: the stream has no late judge yet
    eng.process_evaluation(LateEvaluation(first.run_id, KEY, Evaluation(label="fail"), {},
                                          first.start_ns))
    assert st.late_verdicts and not st.held and len(st.recent_outcomes) == 1
    fired: list = []
    for i in range(400):
        r = _runs(1, rng, start=2_000 + i)[0]
        eng.process(r)
        assert r.run_id in st.held  # waits for its verdict
        verdict = "fail" if rng.random() < 0.5 else "pass"
        fired += eng.process_evaluation(LateEvaluation(r.run_id, KEY, Evaluation(
            label=verdict), {}, r.start_ns))
        assert r.run_id not in st.held
        if any(a.detector == "cusum_pass_rate" for a in fired):
            break
    # outcomes PASS at close, half of them FAIL by the judge: the pass-rate CUSUM alarms
    assert any(a.detector == "cusum_pass_rate" for a in fired)
    assert 0.3 < 1 - sum(st.recent_outcomes) / len(st.recent_outcomes) < 0.7
    quiet = _runs(1, rng, start=10_000)[0]
    eng.process(quiet)
    assert quiet.run_id in st.held
    later = _runs(1, rng, start=10_061)[0]  # 61 s later: past the 60 s window
    eng.process(later)
    assert quiet.run_id not in st.held and later.run_id in st.held
    assert eng.dropped["late_verdict_missed"] == 1
