"""/metrics at fleet scale (exporters/prometheus.py): the stream families are formatted by
the collector's own renderer, from a snapshot taken off the pipeline lock, and a scrape's
time is bounded even while the pipeline holds its lock; each stream says which phase it
is in (learning, calibrating, monitoring) and the calibration backlog is exported."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import assaywatch.monitor.engine.calibration as calibration
from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.calibration import CalibrationWorker
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.prometheus import MonitorCollector
from assaywatch.monitor.exporters.status import _RepairedRegistry
from assaywatch.monitor.receivers.spans import IngestCounters
from tests.analyzers.simagent import simulate_runs

TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _engine(streams: list[StreamKey], n: int = 70) -> Engine:
    engine = Engine(DetectorConfig(learn_runs=40, hotelling_window=20, hotelling_every=10))
    runs = simulate_runs(n, np.random.default_rng(3), key=streams[0], tool_weights=TOOLS)
    for key in streams:
        for r in runs:
            engine.process(dataclasses.replace(r, key=key))
    return engine


def test_rendered_text_equals_what_prometheus_client_writes() -> None:
    """The renderer's text parses to the same samples as ``generate_latest`` of the same
    snapshot, labels that need escaping (quote, backslash, newline, a lone surrogate)
    included."""
    keys = [StreamKey("support-agent", "1.0", "refund"), StreamKey("a\"b\\c\nd", "2", ""),
            StreamKey("bad\ud800name", "1", "s")]
    engine = _engine(keys)
    col = MonitorCollector(engine, IngestCounters())
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)
    col.refresh(1.0)
    snap = col._snapshot
    assert snap is not None
    ours = _samples(snap.rows.render(col._labels).decode("utf-8"))
    # the status server's own repair of label values for the library's writer
    theirs = _samples(generate_latest(_RepairedRegistry(_Only(snap.rows.metrics())))
                      .decode("utf-8"))
    assert ours == theirs
    # every stream is there, with its labels read back exactly (the surrogate replaced)
    agents = {dict(lab)["agent"] for (name, lab) in ours if name == "assaywatch_runs_total"}
    # the surrogate encodes to 3 bytes, each replaced (as the status page repairs it)
    assert agents == {"support-agent", "a\"b\\c\nd", "bad\ufffd\ufffd\ufffdname"}
    assert ours[("assaywatch_runs_total", (("agent", "support-agent"), ("outcome", "pass"),
                                           ("scenario", "refund"), ("version", "1.0")))] \
        == engine.stream(keys[0]).outcomes["pass"]  # type: ignore[union-attr]


class _Only:
    def __init__(self, metrics: list) -> None:  # type: ignore[type-arg]
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.metrics)


def test_a_scrape_is_bounded_while_the_pipeline_holds_its_lock() -> None:
    """Render mode: with the pipeline lock held for 3 s, a scrape answers within
    ``scrape_wait_s`` (+ slack) from the previous snapshot; once the lock is free the next
    scrape sees the new runs."""
    key = StreamKey("support-agent", "1.0", "refund")
    engine = _engine([key])
    lock = threading.RLock()
    col = MonitorCollector(engine, IngestCounters(), lock, scrape_wait_s=0.3,
                           refresh_wait_s=5.0)
    col.start()
    try:
        before = _samples(col.stream_exposition().decode())
        name = ("assaywatch_runs_total", (("agent", "support-agent"), ("outcome", "pass"),
                                          ("scenario", "refund"), ("version", "1.0")))
        passes = before[name]
        held = threading.Event()
        release = threading.Event()

        def pipeline() -> None:
            with lock:
                held.set()
                release.wait(10)
                for r in simulate_runs(10, np.random.default_rng(4), key=key, pass_rate=1.0):
                    engine.process(r)

        t = threading.Thread(target=pipeline)
        t.start()
        held.wait(5)
        t0 = time.monotonic()
        stale = _samples(col.stream_exposition().decode())
        took = time.monotonic() - t0
        assert took < 0.3 + 0.5, took
        assert stale[name] == passes  # the previous snapshot
        release.set()
        t.join(10)
        deadline = time.monotonic() + 10
        fresh = stale
        while fresh[name] == passes and time.monotonic() < deadline:
            fresh = _samples(col.stream_exposition().decode())
        assert fresh[name] == passes + 10
    finally:
        col.stop()


def test_streams_say_learning_calibrating_monitoring_and_the_backlog_is_exported() -> None:
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    worker = CalibrationWorker(executor=pool, job=lambda job: (gate.wait(30),
                                                              calibration.run_job(job))[1])
    engine = Engine(DetectorConfig(learn_runs=40), calibrator=worker)
    col = MonitorCollector(engine, IngestCounters())
    key = StreamKey("a", "1", "s")
    labels = (("agent", "a"), ("scenario", "s"), ("version", "1"))

    def phase() -> tuple[dict[str, float], float]:
        got = _samples(col.stream_exposition().decode())
        states = {dict(lab)["state"]: v for (name, lab) in got
                  if name == "assaywatch_stream_state" for v in [got[(name, lab)]]}
        return states, got[("assaywatch_calibrations_pending", ())]

    runs = simulate_runs(60, np.random.default_rng(3), key=key, tool_weights=TOOLS)
    for r in runs[:20]:
        engine.process(r)
    assert phase() == ({"learning": 1, "calibrating": 0, "monitoring": 0}, 0)
    for r in runs[20:50]:
        engine.process(r)  # froze at 40; its thresholds are held back
    assert phase() == ({"learning": 0, "calibrating": 1, "monitoring": 0}, 1)
    gate.set()
    engine.wait_calibrations(30)
    pool.shutdown(wait=True)
    assert phase() == ({"learning": 0, "calibrating": 0, "monitoring": 1}, 0)
    assert _samples(col.stream_exposition().decode())[
        ("assaywatch_baseline_runs", labels)] == 40


def test_snapshots_are_taken_ahead_of_regular_scrapes() -> None:
    """With a snapshot that takes 0.4 s and scrapes every second, the collector learns the
    cadence and takes each snapshot before the scrape comes: later scrapes answer at once
    with a snapshot taken after the previous scrape (never older than max_age_s)."""
    engine = _engine([StreamKey("a", "1", "s")])
    col = MonitorCollector(engine, IngestCounters(), scrape_wait_s=0.05, max_age_s=0.9)
    slow = col._gather

    def gather():  # type: ignore[no-untyped-def]
        time.sleep(0.4)
        return slow()

    col._gather = gather  # type: ignore[method-assign]
    col.start()
    try:
        served: list[tuple[float, float, float]] = []  # (asked at, took, snapshot age)
        for _ in range(7):
            t0 = time.monotonic()
            _, age = col.stream_exposition_aged()
            took = time.monotonic() - t0
            snap = col._snapshot  # None for the first scrape: 0.4 s > scrape_wait_s
            served.append((t0, took, math.inf if age is None else age))
            # the age served (the X-Assaywatch-Snapshot-Age header) is the snapshot's
            assert (age is None) == (snap is None)
            assert age is None or abs(age - (t0 + took - snap.taken)) < 0.05
            time.sleep(max(0.0, 1.0 - took))
        # without planning, every other scrape would find the snapshot asked for by the
        # one before it 1.6 s old (> max_age_s) and serve it after waiting
        for _, took, age in served[3:]:
            assert took < 0.2 and age < 0.8, served
    finally:
        col.stop()


def test_no_snapshots_are_planned_once_the_scrapes_stop() -> None:
    """Scrapes every 0.5 s, then none: the collector takes the few snapshots it planned
    (or was asked for) for the scrapes that did not come, then waits to be asked (it used
    to take one after another, holding the pipeline lock, until the next scrape)."""
    engine = _engine([StreamKey("a", "1", "s")])
    col = MonitorCollector(engine, IngestCounters(), scrape_wait_s=0.2, max_age_s=0.4)
    col.start()
    try:
        for _ in range(5):
            col.stream_exposition()
            time.sleep(0.5)
        before = col._seq
        # the two planned, and one a late scrape asked for on a loaded machine (CI once
        # took it after `before` was read)
        time.sleep(2.0)
        settled = col._seq
        assert settled - before <= 3, (before, settled)
        time.sleep(3.0)  # six more scrape intervals without a scrape: nothing taken
        assert col._seq == settled, (settled, col._seq)
        t0 = time.monotonic()
        _, age = col.stream_exposition_aged()  # asked for: served within scrape_wait_s
        assert age is not None and age <= 0.4 + 0.2 and time.monotonic() - t0 < 0.5
    finally:
        col.stop()


def test_a_snapshot_computes_due_statuses_within_its_budget_and_counts_the_rest(
        monkeypatch: object) -> None:
    """Three streams whose status is due (70 runs: frozen at 40, cadences at 10, 20, 30
    monitored runs, never read). A snapshot with the budget spent at once computes none:
    the backlog gauge says 3 and no stream has a Hotelling p-value or a recommended budget
    yet (the status before any cadence); with the shipped budget (0.1 s, far more than 3
    statuses take) the next snapshot computes all three: backlog 0, both gauges for each."""
    import assaywatch.monitor.exporters.prometheus as prom

    keys = [StreamKey("agent", "1", s) for s in ("a", "b", "c")]
    engine = _engine(keys)
    col = MonitorCollector(engine, IngestCounters())

    def status() -> tuple[float, int, int]:
        col.refresh(1.0)
        snap = col._snapshot
        assert snap is not None
        samples = _samples(snap.rows.render(col._labels).decode("utf-8"))
        names = [name for name, _ in samples]
        return (samples[("assaywatch_status_refresh_backlog", ())],
                names.count("assaywatch_hotelling_p_value"),
                names.count("assaywatch_recommended_trials"))

    monkeypatch.setattr(prom, "STATUS_BUDGET_S", 0.0)  # type: ignore[attr-defined]
    assert status() == (3.0, 0, 0)
    assert all(st.status_due is not None for st in engine.streams(settle=False))
    monkeypatch.setattr(prom, "STATUS_BUDGET_S", 0.1)  # type: ignore[attr-defined]
    assert status() == (0.0, 3, 3)
    assert all(st.status_due is None for st in engine.streams(settle=False))
