"""A labelling evaluator (labels, no scores: "correct" / "partial" / "incorrect") is its
own signal: its labels reach the run (on the trace) or the engine (late), its label counts
are learned into the baseline and written to the baseline JSON, and a shift of its labels
alarms as ``detector="evaluation"`` with the evaluator named, while an unchanged stream
does not."""

from __future__ import annotations

import dataclasses

import numpy as np

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.receivers.spans import SpanRecord, evaluation_record
from tests.analyzers.simagent import simulate_runs
from tests.monitor.spanfactory import SpanFactory, tool_agent

KEY = StreamKey("support-agent", "1.0", "refund")
TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}
LABELS = ["correct", "partial", "incorrect"]
BEFORE = [0.7, 0.2, 0.1]
AFTER = [0.5, 0.2, 0.3]  # 0.2 of probability moved to "incorrect"


def _labelled(n: int, probs: list[float], seed: int) -> list[Run]:
    rng = np.random.default_rng(seed)
    runs = simulate_runs(n, rng, key=KEY, tool_weights=TOOLS)
    picks = rng.choice(len(LABELS), size=n, p=probs)
    return [dataclasses.replace(r, labels={"correctness": LABELS[i]})
            for r, i in zip(runs, picks, strict=True)]


def _engine() -> Engine:
    return Engine(DetectorConfig(learn_runs=400))


def _eval_alarms(engine: Engine, runs: list[Run]) -> list[int]:
    out = []
    for i, r in enumerate(runs):
        for e in engine.process(r):
            if e.detector == "evaluation":
                assert e.evaluator == "correctness"
                out.append(i)
    return out


def test_labels_are_learned_into_the_baseline_and_its_json() -> None:
    engine = _engine()
    for r in _labelled(400, BEFORE, seed=1):
        engine.process(r)
    st = engine.stream(KEY)
    assert st is not None and st.baseline is not None
    counts = st.baseline.labels["correctness"].counts
    assert sum(counts.values()) == 400 and set(counts) <= set(LABELS)
    assert 0.6 < counts["correct"] / 400 < 0.8  # 0.7 +- 5 sd
    assert "correctness" not in st.baseline.evaluators  # no scores
    again = Baseline.from_dict(st.baseline.to_dict())
    assert again.labels == st.baseline.labels and again.baseline_id == st.baseline.baseline_id
    ev = st.evaluators["correctness"]
    assert st.watch_of("correctness") is not None
    assert ev.count == 400 and ev.recent_mean is None


def test_a_shift_of_labels_alarms_and_an_unchanged_stream_does_not() -> None:
    engine = _engine()
    for r in _labelled(400, BEFORE, seed=2):
        engine.process(r)
    # 1,500 more in-control runs: the evaluator's share of a 10,000-run ARL0 budget
    # (half the budget, one evaluator: ARL0 >= 20,000) makes a false alarm here unlikely
    assert _eval_alarms(engine, _labelled(1_500, BEFORE, seed=3)) == []
    changed = _engine()
    for r in _labelled(400, BEFORE, seed=2):
        changed.process(r)
    fired = _eval_alarms(changed, _labelled(1_500, AFTER, seed=4))
    # a shift of 0.2 onto "incorrect" (0.1 -> 0.3): a few dozen runs of evidence, well
    # within 300
    assert fired and fired[0] < 300, fired[:3]
    st = changed.stream(KEY)
    assert st is not None
    onset = st.alarm_onsets["evaluation:correctness"]
    assert onset["moved"] == ["correctness label incorrect"]


def test_a_label_on_the_trace_reaches_the_run_and_a_late_one_the_engine() -> None:
    t = [0.0]
    asm = Assembler(clock=lambda: t[0], grace_s=1.0, max_age_s=100.0, join_window_s=60.0)
    first: list[SpanRecord] = SpanFactory(seed=1).agent_run(tool_agent(), "genai")
    root = next(s for s in first if not s.parent_span_id)

    def label(span: SpanRecord, value: str) -> SpanRecord:
        return evaluation_record(span.trace_id, span.span_id, 0,
                                 {"gen_ai.evaluation.name": "correctness",
                                  "gen_ai.evaluation.score.label": value},
                                 {"service.name": "judge"})

    asm.add([*first, label(root, "incorrect")])
    t[0] = 2.0
    (run,) = asm.poll()
    assert run.labels == {"correctness": "incorrect"} and run.scores == {}
    second = SpanFactory(seed=2).agent_run(tool_agent(), "genai")
    asm.add(second)
    t[0] = 4.0
    asm.poll()
    asm.add([label(next(s for s in second if not s.parent_span_id), "correct")])
    (late,) = asm.take_evaluations()
    assert isinstance(late, LateEvaluation)
    assert late.labels == {"correctness": "correct"} and late.scores == {}

    engine = Engine(DetectorConfig(learn_runs=400))
    engine.process(run)
    engine.process_evaluation(dataclasses.replace(late, key=run.key))
    st = engine.stream(run.key)
    assert st is not None and st.evaluators["correctness"].count == 2
    assert st.builder is not None
    base = st.builder.freeze()
    assert base.labels["correctness"].counts == {"correct": 1, "incorrect": 1}


def test_an_evaluator_with_scores_is_monitored_by_its_scores_not_its_labels() -> None:
    ev = [Evaluation(name="helpfulness", label="good", score=0.9),
          Evaluation(name="safety", label="safe")]
    from assaywatch.monitor.pipeline.runs import labels_of, scores_of

    assert scores_of(ev) == {"helpfulness": 0.9}
    assert labels_of(ev) == {"safety": "safe"}
