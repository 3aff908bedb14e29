"""The status page a person acts on, in a real browser: an alarmed stream shows its
baseline and recent pass rates with intervals, which detector fired, when (the end time of
the run that raised it) and what moved, with links to the JSON API.

A real monitor (in process, metrics port on loopback) is fed a stream that learns its
baseline and then regresses (pass rate 0.9 -> 0.5, tool mix swapped); headless Chromium
loads the page, dumps its DOM and takes a screenshot."""

from __future__ import annotations

import datetime as dt
import html
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs
from tests.monitor.offline.test_html_report import _chromium, _has_colour, _run_chromium, decode_png

pytestmark = [pytest.mark.e2e]

KEY = StreamKey("support-agent", "2.0", "refund")
QUIET = StreamKey("search-agent", "1.0", "lookup")
ALARM_RED = "#c0392b"


@pytest.fixture(scope="module")
def alarmed() -> Iterator[tuple[Monitor, dict[str, int]]]:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": 200, "arl0": 500, "hotelling_window": 60,
                      "hotelling_every": 10}})
    mon = Monitor(cfg)
    mon.start()
    rng = np.random.default_rng(7)
    tools = {"search": 0.5, "lookup": 0.3, "calc": 0.2}
    with mon.pipeline.lock:
        mon.engine.process_closed(simulate_runs(300, rng, key=QUIET, tool_weights=tools))
        mon.engine.process_closed(simulate_runs(250, rng, key=KEY, tool_weights=tools,
                                                pass_rate=0.9))
        mon.engine.wait_calibrations(timeout=60)
    end_of: dict[str, int] = {}
    start = 1_700_000_000_000_000_000 + 10**15
    for chunk in range(40):  # regressed runs until an alarm is active
        runs = simulate_runs(25, rng, key=KEY, pass_rate=0.5,
                             tool_weights={"search": 0.05, "lookup": 0.15, "calc": 0.8},
                             start_ns=start + chunk * 10**12)
        end_of.update({r.run_id: r.end_ns for r in runs})
        with mon.pipeline.lock:
            mon.engine.process_closed(runs)
            mon.engine.wait_calibrations(timeout=60)  # the baseline froze: thresholds in
            st = mon.engine.stream(KEY)
            assert st is not None
            if any(st.alarm_active(d, cfg.detectors.alarm_hold_runs)
                   for d in ("cusum_pass_rate", "cusum_fingerprint")):
                break
    yield mon, end_of
    mon.stop()


def _get(mon: Monitor, path: str) -> str:
    with urllib.request.urlopen(f"http://{mon.addresses['metrics']}{path}", timeout=10) as r:
        return r.read().decode()


def test_api_names_the_alarm_when_it_fired_and_what_moved(
        alarmed: tuple[Monitor, dict[str, int]]) -> None:
    mon, end_of = alarmed
    streams = {(s["agent"], s["version"]): s
               for s in json.loads(_get(mon, "/api/streams"))["streams"]}
    s = streams[("support-agent", "2.0")]
    assert s["alarms"], s
    for a in s["alarms"]:
        # when: the end time of the run that raised it, in UTC
        when = dt.datetime.fromtimestamp(end_of[a["run_id"]] / 1e9, tz=dt.UTC)
        assert a["fired_at"] == when.strftime("%Y-%m-%d %H:%M:%S UTC")
        assert a["run_index"] > 0 and a["moved"]
    base = s["baseline"]["pass_rate_interval"]
    assert base["n"] == 200 and base["lower"] < base["rate"] < base["upper"]
    recent = s["recent_pass_rate_interval"]
    assert recent["upper"] < base["lower"]  # the drop is outside both intervals
    quiet = streams[("search-agent", "1.0")]
    assert quiet["alarms"] == [] and quiet["active_alarms"] == []


def test_page_in_chromium_shows_the_alarm_when_and_what_moved(
        alarmed: tuple[Monitor, dict[str, int]], tmp_path: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")
    mon, end_of = alarmed
    (s,) = [s for s in json.loads(_get(mon, "/api/streams"))["streams"]
            if s["agent"] == "support-agent"]
    url = f"http://{mon.addresses['metrics']}/"
    dom = _run_chromium(binary, tmp_path, "--dump-dom", url).stdout
    assert "1 of 2 streams alarmed" in dom
    for a in s["alarms"]:
        assert f"<b>{a['detector']}</b> fired at" in dom
        assert a["fired_at"] in dom
        # the DOM's text escapes "<", ">" and "&" (a swap chart's name: "runswap:a>b:up")
        assert html.escape(", ".join(a["moved"]), quote=False) in dom
    assert 'href="/api/streams"' in dom and "recent pass rate" in dom
    png = tmp_path / "status.png"
    _run_chromium(binary, tmp_path, f"--screenshot={png}", url)
    img = decode_png(png.read_bytes())
    # the alarmed stream is drawn first, in the alarm colour
    assert _has_colour(img[:700], ALARM_RED, tol=6)
