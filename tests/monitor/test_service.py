"""The monitor service in process: health and readiness, the status page, the JSON API and
re-baselining a stream over HTTP and with ``assaywatch baseline reset``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": 50}})
    mon = Monitor(cfg)
    mon.start()
    yield mon
    mon.stop()


def _get(mon: Monitor, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{mon.addresses['metrics']}{path}",
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _feed(mon: Monitor, n: int) -> None:
    runs = simulate_runs(n, np.random.default_rng(3), key=KEY)
    with mon.pipeline.lock:
        mon.engine.process_closed(runs)


def test_health_readiness_and_status_page(monitor: Monitor) -> None:
    assert _get(monitor, "/healthz") == (200, "ok\n")
    assert _get(monitor, "/readyz")[0] == 200
    _feed(monitor, 60)
    code, page = _get(monitor, "/")
    assert code == 200 and "support-agent" in page and "baseline 50 runs" in page
    code, body = _get(monitor, "/api/streams")
    (stream,) = json.loads(body)["streams"]
    assert stream["runs"] == 60 and stream["baseline"]["runs"] == 50
    assert _get(monitor, "/nope")[0] == 404
    monitor.ready.clear()
    assert _get(monitor, "/readyz")[0] == 503


def test_rebaseline_over_http_and_cli(monitor: Monitor,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _feed(monitor, 60)
    url = f"http://{monitor.addresses['metrics']}"
    req = urllib.request.Request(url + "/api/rebaseline", method="POST",
                                 data=json.dumps(KEY.as_labels()).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.load(r)["rebaselined"] is True
    st = monitor.engine.stream(KEY)
    assert st is not None and st.baseline is None  # learning again from the next runs
    assert main(["baseline", "reset", "--url", url, "--agent", KEY.agent, "--version",
                 KEY.version, "--scenario", KEY.scenario]) == 0
    assert main(["baseline", "reset", "--url", url, "--agent", "nobody"]) == 3
    assert "has no stream" in capsys.readouterr().err


def test_stop_flushes_pending_runs_and_checkpoints(tmp_path) -> None:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "state_dir": str(tmp_path)})
    mon = Monitor(cfg)
    mon.start()
    _feed(mon, 5)
    t0 = time.monotonic()
    mon.stop()
    assert time.monotonic() - t0 < 30
    again = Monitor(cfg)
    again.restore()
    st = again.engine.stream(KEY)
    assert st is not None and st.n_runs == 5
