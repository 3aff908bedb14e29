"""The status page's summary of a stream while its detectors are being calibrated."""

from __future__ import annotations

import numpy as np

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.page import status_page, stream_summary
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")


def test_a_calibrating_stream_says_so() -> None:
    engine = Engine(DetectorConfig(learn_runs=50))
    engine.process_closed(simulate_runs(60, np.random.default_rng(2), key=KEY))
    st = engine.stream(KEY)
    assert st is not None and st.baseline is not None
    assert stream_summary(st, 200)["calibrating"] is False
    st.calibrating = True  # what the engine sets while a worker calibrates the baseline
    summary = stream_summary(st, 200)
    assert summary["calibrating"] is True and summary["baseline"]["runs"] == 50
    assert "50 runs (learned), calibrating its detectors" in status_page([summary], {})
