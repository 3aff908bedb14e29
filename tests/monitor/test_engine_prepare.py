"""The engine's batched path (``Engine.prepare``, ``MultichartCUSUM.prime``): the
fingerprint chart's increments of a poll's runs computed in one pass per stream give the
very same chart values, alarms and state as one run at a time; a run prepared for a
detector the stream no longer has, or not prepared at all, is computed as before.

Runs from the realistic world (``tests/realworld/world.py``): two scenarios, a learned
stream each, then runs with a tool swap so that the fingerprint chart alarms and restarts
inside a batch.
"""

from __future__ import annotations

import copy

import numpy as np

from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from tests.realworld.world import Change, realistic_world

WORLD = realistic_world()
CFG = DetectorConfig(arl0=200.0, learn_runs=300)


def _learned() -> Engine:
    eng = Engine(CFG)
    rng = np.random.default_rng(3)
    for i in (0, 2):
        for run in WORLD.runs(300, rng, scenario=i):
            eng.process(run)
    eng.wait_calibrations()
    return eng


def _batches(seed: int) -> list[list]:
    """Ten batches of 40 runs mixing the two streams, swapped tools in half of them."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(10):
        change = Change.tool_swap(0.5) if b % 2 else None
        runs = WORLD.runs(20, rng, change=change, scenario=0) + WORLD.runs(
            20, rng, change=change, scenario=2)
        order = rng.permutation(len(runs))
        out.append([runs[j] for j in order])
    return out


def _signature(eng: Engine) -> list:
    out = []
    for st in sorted(eng.streams(), key=lambda s: str(s.key)):
        det = st.watches["cusum_fingerprint"].detector
        out.append((str(st.key), st.monitored_runs, dict(st.alarms_total),
                    det._up.tobytes(), det._down.tobytes(), det._n, det._n_alarms))
    return out


def test_prepared_batches_give_the_same_alarms_and_state_as_one_run_at_a_time() -> None:
    base = _learned()
    one, batched = copy.deepcopy(base), copy.deepcopy(base)
    events_one, events_batched = [], []
    for batch in _batches(7):
        for run in batch:
            events_one += [(e.key, e.detector, e.run_index) for e in one.process(run)]
        batched.prepare(batch)
        for run in batch:
            events_batched += [(e.key, e.detector, e.run_index)
                               for e in batched.process(run)]
        batched.unprepare()
    # the swap makes the fingerprint chart alarm (and restart) inside batches
    assert sum(d == "cusum_fingerprint" for _, d, _ in events_one) >= 2
    assert events_batched == events_one
    assert _signature(batched) == _signature(one)
    # nothing prepared is left behind, nor kept in the chart
    assert "_prepared" not in batched.__dict__
    for st in batched.streams():
        assert "_primed" not in st.watches["cusum_fingerprint"].detector.__dict__


def test_a_run_prepared_for_a_replaced_detector_is_computed_afresh() -> None:
    base = _learned()
    one, batched = copy.deepcopy(base), copy.deepcopy(base)
    batch = _batches(8)[1]
    batched.prepare(batch)
    # the detectors are rebuilt between prepare and process (a restore would do this):
    # what was primed belongs to the old ones and must not be used
    for st_b, st_o in zip(sorted(batched.streams(), key=lambda s: str(s.key)),
                          sorted(one.streams(), key=lambda s: str(s.key)), strict=True):
        st_b.watches["cusum_fingerprint"].detector = copy.deepcopy(
            st_o.watches["cusum_fingerprint"].detector)
    got = [(e.detector, e.run_index) for run in batch for e in batched.process(run)]
    batched.unprepare()
    want = [(e.detector, e.run_index) for run in batch for e in one.process(run)]
    assert got == want
    assert _signature(batched) == _signature(one)
