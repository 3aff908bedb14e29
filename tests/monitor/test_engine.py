"""The assay engine on simulated runs: baselines learned and frozen, alarms on regressions,
silence on unchanged streams, previous-version baselines, re-baselining, stream limits."""

from __future__ import annotations

import numpy as np
import pytest

from assaywatch.analyzers.model import Outcome, StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.service import statecodec
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")
TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}


def _cfg(**kw: object) -> DetectorConfig:
    base = {"learn_runs": 150, "hotelling_window": 100, "hotelling_every": 20}
    base.update(kw)
    return DetectorConfig(**base)  # type: ignore[arg-type]


def _feed(engine: Engine, runs: list) -> list:
    events = []
    for r in runs:
        events.extend(engine.process(r))
    return events


def test_baseline_is_learned_then_frozen_and_detectors_start() -> None:
    rng = np.random.default_rng(1)
    eng = Engine(_cfg())
    _feed(eng, simulate_runs(149, rng, key=KEY, tool_weights=TOOLS))
    st = eng.stream(KEY)
    assert st is not None and st.baseline is None and not st.watches
    assert st.sprt is None
    _feed(eng, simulate_runs(1, rng, key=KEY, tool_weights=TOOLS))
    assert st.baseline is not None and st.baseline.n_runs == 150
    assert st.baseline_origin == "learned"
    assert st.sprt is not None
    assert set(st.watches) == {"cusum_pass_rate", "cusum_fingerprint"}
    assert st.watches["cusum_pass_rate"].signal == "outcome"
    assert st.watches["cusum_fingerprint"].signal == "fingerprint"


def test_unchanged_stream_stays_quiet() -> None:
    rng = np.random.default_rng(2)
    eng = Engine(_cfg())
    events = _feed(eng, simulate_runs(150 + 1500, rng, key=KEY, tool_weights=TOOLS))
    st = eng.stream(KEY)
    assert st is not None
    assert events == [], [(e.detector, e.run_index, e.evidence) for e in events]
    assert sum(st.outcomes.values()) == 1650


@pytest.mark.parametrize("change, detectors", [
    ({"pass_rate": 0.6}, {"sprt", "cusum_pass_rate"}),
    ({"tool_weights": {"search": 0.05, "lookup": 0.75, "calc": 0.2}},
     {"cusum_fingerprint", "hotelling"}),
])
def test_regressions_alarm_within_bounded_runs(change: dict, detectors: set[str]) -> None:
    rng = np.random.default_rng(3)
    eng = Engine(_cfg())
    _feed(eng, simulate_runs(150, rng, key=KEY, tool_weights=TOOLS))
    kw = {"tool_weights": TOOLS, **change}
    events = _feed(eng, simulate_runs(200, rng, key=KEY, **kw))  # type: ignore[arg-type]
    fired = {e.detector for e in events}
    assert fired & detectors, fired
    first = min(e.run_index for e in events if e.detector in detectors)
    assert first <= 150
    for e in events:
        assert e.baseline_id and e.evidence["baseline_runs"] == 150
        assert e.stream_run == 150 + e.run_index


def test_new_version_is_compared_with_previous_versions_baseline() -> None:
    rng = np.random.default_rng(4)
    eng = Engine(_cfg())
    _feed(eng, simulate_runs(150, rng, key=KEY, tool_weights=TOOLS))
    v2 = StreamKey(KEY.agent, "2.0", KEY.scenario)
    events = _feed(eng, simulate_runs(200, rng, key=v2, tool_weights=TOOLS, pass_rate=0.55))
    st2 = eng.stream(v2)
    assert st2 is not None and st2.baseline_origin == "previous-version"
    assert st2.baseline is eng.stream(KEY).baseline  # type: ignore[union-attr]
    assert {e.detector for e in events} & {"sprt", "cusum_pass_rate"}


def test_rebaseline_learns_again_and_stream_limit_counts_drops() -> None:
    rng = np.random.default_rng(5)
    eng = Engine(_cfg(), max_streams=1)
    _feed(eng, simulate_runs(160, rng, key=KEY, tool_weights=TOOLS))
    assert eng.rebaseline(KEY)
    st = eng.stream(KEY)
    assert st is not None and st.baseline is None
    other = StreamKey("other-agent")
    _feed(eng, simulate_runs(3, rng, key=other, tool_weights=TOOLS))
    assert eng.stream(other) is None and eng.dropped["stream_limit"] == 3
    assert not eng.rebaseline(other)


def test_unknown_outcomes_skip_pass_rate_detectors() -> None:
    rng = np.random.default_rng(6)
    eng = Engine(_cfg())
    _feed(eng, simulate_runs(150, rng, key=KEY, tool_weights=TOOLS))
    runs = simulate_runs(50, rng, key=KEY, tool_weights=TOOLS)
    for r in runs:
        r.outcome = Outcome.UNKNOWN
    _feed(eng, runs)
    st = eng.stream(KEY)
    assert st is not None and st.watches["cusum_pass_rate"].detector.n == 0
    assert st.outcomes["unknown"] == 50


def test_engine_state_survives_the_checkpoint_codec() -> None:
    rng = np.random.default_rng(8)
    eng = Engine(_cfg())
    runs = simulate_runs(300, rng, key=KEY, tool_weights=TOOLS)
    _feed(eng, runs[:250])
    clone = Engine(_cfg())
    clone._streams.update(statecodec.loads(statecodec.dumps(eng._streams)))
    a = _feed(eng, runs[250:])
    b = _feed(clone, runs[250:])
    assert [(e.detector, e.run_index) for e in a] == [(e.detector, e.run_index) for e in b]
    sa, sb = eng.stream(KEY), clone.stream(KEY)
    assert sa is not None and sb is not None
    assert sa.watches["cusum_pass_rate"].statistics() == sb.watches["cusum_pass_rate"].statistics()


def test_recommended_trials_follow_the_adaptive_budget() -> None:
    rng = np.random.default_rng(9)
    eng = Engine(_cfg())
    _feed(eng, simulate_runs(150 + 40, rng, key=KEY, tool_weights=TOOLS))
    st = eng.stream(KEY)
    assert st is not None and st.recommended_trials is not None
    from assaywatch.analyzers.verdicts import sample_size

    # never below the pass-rate design for the baseline's rate
    assert st.recommended_trials >= sample_size(
        min(max(st.baseline.pass_rate, 0.11), 0.995), 0.1, 0.01, 0.1)  # type: ignore[union-attr]


def test_tiny_perfect_baseline_never_breaks_the_stream() -> None:
    rng = np.random.default_rng(10)
    eng = Engine(_cfg(learn_runs=10))
    runs = simulate_runs(40, rng, key=KEY, tool_weights=TOOLS, pass_rate=1.0)
    _feed(eng, runs)
    st = eng.stream(KEY)
    assert st is not None and st.baseline is not None and st.n_runs == 40
    # every detector either runs or says why it cannot for this baseline
    for name in ("cusum_pass_rate", "cusum_fingerprint"):
        assert name in st.watches or name in st.disabled
    # 10 runs cannot estimate the covariance of 17 features: the fingerprint chart is
    # disabled, saying why. A 10/10 pass rate gives a pass-rate CUSUM designed for the
    # posterior's adverse quantile (bootstrap.py), or none, saying why; the SPRT still runs
    assert "at least" in st.disabled["cusum_fingerprint"]
    if "cusum_pass_rate" in st.watches:
        assert 0 < st.watches["cusum_pass_rate"].threshold < 60
    else:
        assert "too small" in st.disabled["cusum_pass_rate"]
    assert st.sprt is not None


def _alarm_rows(events: list) -> list[tuple]:
    return sorted((str(e.key), e.detector, e.run_index, e.stream_run, e.run_id,
                   e.baseline_id, repr(sorted(e.evidence.items()))) for e in events)


def test_worker_calibration_gives_the_inline_alarms_and_run_indices() -> None:
    """The same runs through an engine calibrating inline and one whose calibrations run
    in a worker process (runs buffered meanwhile, applied now and then as the pipeline
    thread does): the same alarms, at the same run indices, with the same evidence."""
    from assaywatch.monitor.engine.calibration import CalibrationWorker

    rng = np.random.default_rng(11)
    keys = [StreamKey(f"agent-{i}", "1.0", "refund") for i in range(4)]
    runs = []
    for i, key in enumerate(keys):  # learn, then a pass-rate drop or a tool swap
        runs += simulate_runs(150, rng, key=key, tool_weights=TOOLS)
        change = ({"pass_rate": 0.6} if i % 2 else
                  {"tool_weights": {"search": 0.05, "lookup": 0.75, "calc": 0.2}})
        runs += simulate_runs(200, rng, key=key, **{"tool_weights": TOOLS, **change})
    # a new version arriving while its predecessor's baseline may still be calibrating
    runs += simulate_runs(120, rng, key=StreamKey("agent-0", "2.0", "refund"),
                          tool_weights=TOOLS, pass_rate=0.55)
    per_key: dict = {}
    for r in runs:
        per_key.setdefault(r.key, []).append(r)
    mixed, cursors = [], dict.fromkeys(per_key, 0)
    for i in rng.permutation(len(runs)):  # the streams interleaved, each in its order
        k = runs[i].key
        mixed.append(per_key[k][cursors[k]])
        cursors[k] += 1

    inline = Engine(_cfg())
    expected = _feed(inline, mixed)
    assert {e.detector for e in expected} >= {"cusum_pass_rate", "cusum_fingerprint"}

    worker = CalibrationWorker(workers=1)
    try:
        eng = Engine(_cfg(), calibrator=worker)
        got, saw_calibrating = [], 0
        for n, r in enumerate(mixed, 1):
            got += eng.process(r)
            saw_calibrating = max(saw_calibrating, eng.calibration_backlog)
            if n % 97 == 0:
                got += eng.apply_calibrations(budget_s=0.001)
        got += eng.wait_calibrations(timeout=60)
    finally:
        worker.shutdown()
    assert saw_calibrating >= 1 and eng.calibration_backlog == 0
    assert _alarm_rows(got) == _alarm_rows(expected)
    for st in eng.streams():
        assert not st.calibrating and not st.pending_runs
        ref = inline.stream(st.key)
        assert ref is not None and st.n_runs == ref.n_runs
        assert st.monitored_runs == ref.monitored_runs
        assert set(st.watches) == set(ref.watches)
    assert eng.calibrations["computed"] == inline.calibrations["computed"] == 4


def _status(st: object) -> tuple[object, ...]:
    return tuple(getattr(st, name) for name in (
        "pass_rate_verdict", "fingerprint_verdict", "hotelling_p", "fingerprint_shift",
        "feature_shift", "recommended_trials"))


def test_the_status_is_computed_when_read_as_it_was_at_the_cadence() -> None:
    """The status refreshed every ``hotelling_every`` runs (verdicts, shifts, budget) waits
    for a reader while the Hotelling test cannot alarm (its share 0, the default): unread,
    the stream keeps the window's inputs and no status; read 5 runs after the last cadence,
    it gives the status of a stream read after every run (computed at that cadence)."""
    rng = np.random.default_rng(11)
    runs = simulate_runs(150 + 45, rng, key=KEY, tool_weights=TOOLS)  # cadences: 20, 40
    eager, lazy = Engine(_cfg()), Engine(_cfg())
    seen = []
    for r in runs:
        eager.process(r)
        seen.append(_status(eager.stream(KEY)))
    _feed(lazy, runs)
    raw = lazy._streams[KEY]
    assert raw.status_due is not None
    assert raw.pass_rate_verdict is None and raw.hotelling_p is None
    st = lazy.stream(KEY)
    assert st is raw and st.status_due is None
    assert _status(st) == seen[-1] == seen[150 + 40 - 1]
    # the cadence at 40 moved the status (the window of 40 runs is the first Hotelling test:
    # at 20 it is under hotelling_window / 4 = 25 runs)
    assert seen[150 + 20 - 1][2] is None and seen[-1][2] is not None
    assert seen[-1][0] is not None and seen[-1][5] is not None


def test_a_hotelling_test_with_a_share_of_the_budget_alarms_without_a_reader() -> None:
    """Given a share of the false-alarm budget the Hotelling test can alarm, so it runs at
    its cadence whether or not the stream is read: its alarms come out of ``process`` and
    its p-value is there unread; the pass-rate verdict and the budget still wait."""
    rng = np.random.default_rng(3)
    eng = Engine(_cfg(alarm_shares={"cusum_pass_rate": 0.5, "cusum_fingerprint": 0.5,
                                    "hotelling": 0.5}))
    _feed(eng, simulate_runs(150, rng, key=KEY, tool_weights=TOOLS))
    events = _feed(eng, simulate_runs(300, rng, key=KEY, tool_weights={
        "search": 0.05, "lookup": 0.75, "calc": 0.2}))
    hotelling = [e.run_index for e in events if e.detector == "hotelling"]
    assert hotelling and all(i % 20 == 0 for i in hotelling), hotelling
    raw = eng._streams[KEY]
    assert raw.hotelling_p is not None and raw.recommended_trials is None
    assert raw.status_due is not None and raw.status_due[-1] is True
    st = eng.stream(KEY)
    assert st is not None and st.recommended_trials is not None and st.status_due is None
