"""Calibration off the pipeline lock (engine/calibration.py): calibrated thresholds are part
of the checkpoint, so a restart never calibrates a baseline again; a stream that was
calibrating when the checkpoint was written resumes with its buffered runs; a full buffer
is counted, never a stall."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import assaywatch.monitor.engine.calibration as calibration
from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import DetectorConfig, MonitorConfig
from assaywatch.monitor.engine.calibration import CalibrationWorker
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.service import monitor as monitor_module
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs

TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}
LEARN = 60


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every calibration, counted: the monitor's worker is a thread pool here so the
    counting ``calibrate`` runs in this process."""
    seen: list[str] = []
    real = calibration.calibrate

    def counting(data, settings, seed):  # type: ignore[no-untyped-def]
        seen.append(str(seed))
        return real(data, settings, seed)

    monkeypatch.setattr(calibration, "calibrate", counting)
    monkeypatch.setattr(monitor_module, "CalibrationWorker",
                        lambda: CalibrationWorker(executor=ThreadPoolExecutor(1)))
    yield seen


def _config(state: Path) -> MonitorConfig:
    return MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": LEARN}, "checkpoint_seconds": 3600,
        "state_dir": str(state)})


def _feed(mon: Monitor, runs: list) -> None:
    with mon.pipeline.lock:
        mon.engine.process_closed(runs)


def _wait_calibrated(mon: Monitor, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while mon.engine.calibration_backlog and time.monotonic() < deadline:
        time.sleep(0.05)  # the pipeline thread applies them
    assert mon.engine.calibration_backlog == 0


def test_calibrated_thresholds_survive_a_restart_without_recalibration(
        tmp_path: Path, calls: list[str]) -> None:
    rng = np.random.default_rng(21)
    keys = [StreamKey(f"agent-{i}", "1.0", "refund") for i in range(5)]
    mon = Monitor(_config(tmp_path / "state"))
    mon.start()
    try:
        for key in keys:
            _feed(mon, simulate_runs(LEARN + 20, rng, key=key, tool_weights=TOOLS))
        _wait_calibrated(mon)
        assert len(calls) == len(keys)
        thresholds = {k: mon.engine.stream(k).thresholds for k in keys}  # type: ignore[union-attr]
    finally:
        mon.stop()

    calls.clear()
    again = Monitor(_config(tmp_path / "state"))
    t0 = time.perf_counter()
    again.restore()  # what start() does first: checkpoint, then the log
    restore_s = time.perf_counter() - t0
    again.start()
    try:
        for key in keys:
            st = again.engine.stream(key)
            assert st is not None and not st.calibrating
            assert {"cusum_pass_rate", "cusum_fingerprint"} <= set(st.watches)
            th = thresholds[key]
            assert th is not None and st.thresholds is not None
            assert st.thresholds.pass_rate == th.pass_rate
            assert np.array_equal(st.thresholds.fingerprint, th.fingerprint)
        # a new version of a restored agent starts from its predecessor's calibrated
        # thresholds (before, the cache was not in the checkpoint: a Gaussian recalibration)
        v2 = StreamKey("agent-0", "2.0", "refund")
        _feed(again, simulate_runs(30, rng, key=v2, tool_weights=TOOLS))
        _feed(again, simulate_runs(30, rng, key=keys[1], tool_weights=TOOLS))
        st2 = again.engine.stream(v2)
        assert st2 is not None and st2.baseline_origin == "previous-version"
        assert not st2.calibrating and st2.thresholds is not None
        assert st2.thresholds.pass_rate == thresholds[keys[0]].pass_rate  # type: ignore[union-attr]
        assert calls == [], "a restart calibrated again"
        assert again.engine.calibrations["computed"] == 0
        assert again.engine.calibrations["cached"] >= 1
    finally:
        again.stop()
    assert restore_s < 5.0, f"restore took {restore_s:.2f} s"


def test_a_stream_calibrating_at_the_checkpoint_resumes_with_its_buffered_runs() -> None:
    """The checkpoint is written while a stream is calibrating (its thresholds held back);
    restored into a new engine, the stream is calibrated again and fed its buffered runs:
    the alarms are those of an inline engine. Thresholds that arrived before the
    checkpoint are reused without a calibration."""
    from assaywatch.monitor.service import statecodec

    rng = np.random.default_rng(22)
    cfg = DetectorConfig(learn_runs=150, hotelling_window=100, hotelling_every=20)
    key = StreamKey("support-agent", "1.0", "refund")
    runs = (simulate_runs(150, rng, key=key, tool_weights=TOOLS)
            + simulate_runs(150, rng, key=key, tool_weights=TOOLS, pass_rate=0.6))
    inline = Engine(cfg)
    expected = [(e.detector, e.run_index, e.stream_run) for r in runs for e in inline.process(r)]
    assert expected

    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    held = CalibrationWorker(executor=pool, job=lambda job: (gate.wait(30),
                                                            calibration.run_job(job))[1])
    eng = Engine(cfg, calibrator=held)
    got = [(e.detector, e.run_index, e.stream_run) for r in runs[:250] for e in eng.process(r)]
    st = eng.stream(key)
    assert got == [] and st is not None and st.calibrating and len(st.pending_runs) == 100
    state = statecodec.loads(statecodec.dumps(eng.checkpoint_state()))  # as the checkpoint does
    gate.set()
    pool.shutdown(wait=True)

    resumed = Engine(cfg, calibrator=CalibrationWorker(executor=ThreadPoolExecutor(1)))
    resumed.restore_state(state)
    assert resumed.calibration_backlog == 1
    got = [(e.detector, e.run_index, e.stream_run) for e in resumed.wait_calibrations(30)]
    got += [(e.detector, e.run_index, e.stream_run) for r in runs[250:]
            for e in resumed.process(r)]
    assert got == expected

    # the thresholds arrived before this checkpoint: the restore reuses them
    eng.apply_calibrations()
    again = Engine(cfg)
    again.restore_state(statecodec.loads(statecodec.dumps(eng.checkpoint_state())))
    assert again.calibrations["computed"] == 0 and again.calibration_backlog == 0
    later = simulate_runs(5, rng, key=StreamKey("support-agent", "2.0", "refund"),
                          tool_weights=TOOLS)
    for r in later:
        again.process(r)
    assert again.calibrations["computed"] == 0 and again.calibrations["cached"] == 1


def test_a_full_buffer_is_counted_and_never_blocks() -> None:
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    worker = CalibrationWorker(executor=pool, job=lambda job: (gate.wait(30),
                                                              calibration.run_job(job))[1])
    eng = Engine(DetectorConfig(learn_runs=40), calibrator=worker, calibration_buffer_runs=25)
    key = StreamKey("a")
    t0 = time.perf_counter()
    for r in simulate_runs(100, np.random.default_rng(3), key=key, tool_weights=TOOLS):
        eng.process(r)
    took = time.perf_counter() - t0
    st = eng.stream(key)
    assert st is not None and st.calibrating and len(st.pending_runs) == 25
    assert eng.dropped["calibration_buffer"] == 35 and eng.calibration_backlog == 1
    assert took < 5.0
    gate.set()
    eng.wait_calibrations(30)
    pool.shutdown(wait=True)
    assert not st.calibrating and st.monitored_runs == 25
