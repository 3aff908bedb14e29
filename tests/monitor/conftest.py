"""Fixtures shared by the monitor's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.service.monitor import Monitor


@pytest.fixture
def stateful(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Monitor]:
    """A monitor in process with a state dir (so an API token), metrics port only,
    learning 50-run baselines, and no token or allowed hosts from the environment."""
    monkeypatch.delenv("ASSAYWATCH_API_TOKEN", raising=False)
    monkeypatch.delenv("ASSAYWATCH_ALLOWED_HOSTS", raising=False)
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": 50}, "state_dir": str(tmp_path / "state")})
    mon = Monitor(cfg)
    mon.start()
    yield mon
    mon.stop()
