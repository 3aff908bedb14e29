"""The engine's latency chart (``analyzers/detectors/latency.py``): a learned stream charts
every call's latency, finds a slowdown its fingerprint only summarises, and a checkpoint
taken while learning before the chart existed still freezes a working stream.

The runs come from the realistic world (``tests/realworld/world.py``), scenario "coding":
about eight llm calls and five tool calls a run, llm latency log-normal (sd 0.45) and
growing with the prompt, tools log-normal (sd 0.8) with timeouts.
"""

from __future__ import annotations

import copy
import json

import numpy as np

from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.service import statecodec
from tests.realworld.world import Change, realistic_world

WORLD = realistic_world()
CODING = 2
KEY = WORLD.key(CODING)
CFG = DetectorConfig(arl0=500.0, learn_runs=400)


def _learned(seed: int, runs: int = 400, cfg: DetectorConfig = CFG) -> Engine:
    eng = Engine(cfg)
    for run in WORLD.runs(runs, np.random.default_rng(seed), scenario=CODING):
        eng.process(run)
    eng.wait_calibrations()
    return eng


def _first_alarm(eng: Engine, change: Change | None, n: int, seed: int
                 ) -> tuple[int, str, str]:
    for t, run in enumerate(WORLD.runs(n, np.random.default_rng(seed), change=change,
                                       scenario=CODING), start=1):
        for ev in eng.process(run):
            return t, ev.detector, str(ev.evidence.get("charts_alarmed", ""))
    return n + 1, "", ""


def test_a_learned_stream_charts_its_calls_latency_and_finds_a_slowdown() -> None:
    eng = _learned(1)
    st = eng.stream(KEY)
    assert st is not None and st.thresholds is not None and st.thresholds.latency is not None
    kinds = st.thresholds.latency[0]
    # llm first, then the scenario's tools by calls; every kind has >= 30 baseline calls
    assert kinds[0] == "llm" and {"tool:read_file", "tool:edit_file"} <= set(kinds)
    det = st.watches["cusum_fingerprint"].detector
    assert det.labels[-1] == "latency" and det.latency_kinds == kinds
    # exported beside the features' charts: assaywatch_cusum_statistic{feature="latency"}
    assert "latency" in st.watches["cusum_fingerprint"].statistics()
    # every call 30% slower: per run the LR gains ~1.7 nats (the oracle's KL, README), the
    # chart's threshold is ~10 nats: an alarm within a few dozen runs, on the latency chart
    t, detector, charts = _first_alarm(copy.deepcopy(eng), Change.latency(1.3), 200, seed=2)
    assert t <= 40 and detector == "cusum_fingerprint" and "latency:up" in charts
    # and 30% faster, on its down side
    t, detector, charts = _first_alarm(copy.deepcopy(eng), Change.latency(1 / 1.3), 200,
                                       seed=3)
    assert t <= 40 and "latency:down" in charts
    # no change: the latency chart stays quiet for 400 runs (its ARL0 is a third of the
    # fingerprint's budget, about 3,000 runs a side at arl0 500)
    t, _, charts = _first_alarm(copy.deepcopy(eng), None, 400, seed=4)
    assert "latency" not in charts


def test_a_checkpoint_from_before_the_latency_chart_freezes_without_it() -> None:
    eng = _learned(5, runs=200)  # half-way through learning
    st = eng.stream(KEY)
    assert st is not None and st.builder is not None and len(st.latency_sample) == 200
    # one array a run over the kinds seen so far (6 sums a kind), not a dict of lists
    assert all(v.dtype == np.float64 and v.size <= 6 * len(st.latency_kinds)
               for v in st.latency_sample)
    resumed = Engine(CFG)
    resumed.restore_state(statecodec.loads(_without_latency_sample(eng)))
    old = resumed.stream(KEY)
    assert old is not None and old.builder is not None and old.latency_sample == []
    for run in WORLD.runs(200, np.random.default_rng(6), scenario=CODING):
        resumed.process(run)
    resumed.wait_calibrations()
    st2 = resumed.stream(KEY)
    assert st2 is not None and st2.baseline is not None and st2.thresholds is not None
    # the fingerprint chart runs, without a latency chart: its sample is incomplete
    assert st2.thresholds.latency is None
    det = st2.watches["cusum_fingerprint"].detector
    assert "latency" not in det.labels and det.latency_kinds == ()
    # and still sees a gross slowdown, through the run's duration
    t, detector, charts = _first_alarm(resumed, Change.latency(3.0), 300, seed=7)
    assert t <= 300 and detector == "cusum_fingerprint" and "latency" not in charts


def _without_latency_sample(eng: Engine) -> bytes:
    """The engine's checkpoint as the version before the latency chart wrote it: streams
    without the ``latency_sample`` field (written as name, value in the object's list)."""
    tree = json.loads(statecodec.dumps(eng.checkpoint_state()))
    found = 0

    def strip(node: object) -> None:
        nonlocal found
        if isinstance(node, list):
            for name in ("latency_sample", "latency_kinds"):
                while name in node:
                    i = node.index(name)
                    del node[i:i + 2]
                    found += 1
            for child in node:
                strip(child)
        elif isinstance(node, dict):
            for child in node.values():
                strip(child)

    strip(tree)
    assert found == 2
    return json.dumps(tree).encode()
