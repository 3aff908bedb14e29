"""Shared pieces of the hostile-input suite: a monitor subprocess with its peak RSS, a
bystander stream that must stay intact, counters read from ``/metrics``."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

from assaywatch.monitor.receivers.spans import SpanRecord
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import (
    OtlpHttp,
    Samples,
    genai_run_script,
    live_factory,
    proto_bytes,
    scrape,
    value,
    wait_for,
)

#: Stated bound on the monitor's peak RSS (VmHWM) over the whole hostile suite: the parts
#: of monitor/README.md's memory arithmetic that this suite drives to their worst (the
#: process at rest ~130 MiB, OTLP/HTTP bodies and decodes ~200 MiB, gRPC calls being read
#: and decoded ~130 MiB (the 150 calls waiting at once are 70 KiB each: ~10 MiB more),
#: pending traces 128 MiB) plus 50 MiB. Measured: 300-550 MiB, the high end on a loaded
#: 2-core machine; 498-548 MiB with the 150 gRPC calls (2026-12-03, 4 runs).
PEAK_RSS_BOUND_MIB = 640

CONFIG = """
assembler:
  grace_seconds: 0.2
  max_age_seconds: 3
detectors:
  learn_runs: 20
"""


def write_config(directory: Path) -> Path:
    path = directory / "monitor.yaml"
    path.write_text(CONFIG)
    return path


def peak_rss_mib(mon: MonitorProcess) -> float:
    assert mon.proc is not None
    for line in Path(f"/proc/{mon.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def counter(samples: Samples, family: str, **labels: str) -> float:
    return value(samples, family, **labels)


def run_spans(agent: str, seed: int, scenario: str = "support") -> list[SpanRecord]:
    return live_factory(seed, service=f"{agent}-svc").agent_run(
        genai_run_script(["lookup", "refund"], name=agent, scenario=scenario), "genai")


class Bystander:
    """Another stream's runs, sent before and after each hostile case: every one must be
    assembled, exactly once, whatever the hostile request did."""

    AGENT = "bystander-agent"

    def __init__(self, mon: MonitorProcess) -> None:
        self.mon = mon
        self.http = OtlpHttp(mon.addresses["otlp_http"])
        self.sent = 0
        self.seed = 1000

    def send(self, n: int = 1) -> None:
        for _ in range(n):
            self.seed += 1
            reply = self.http.post(proto_bytes(run_spans(self.AGENT, self.seed)))
            assert reply.status == 200, reply
            self.sent += 1

    def check(self, timeout: float = 15.0) -> Samples:
        """One more run, then all runs assembled and nothing extra."""
        self.send()
        want = self.sent
        samples = wait_for(self.mon.addresses["metrics"],
                           lambda s: value(s, "assaywatch_runs_total", agent=self.AGENT) >= want,
                           timeout, f"{want} bystander runs")
        assert value(samples, "assaywatch_runs_total", agent=self.AGENT) == want
        assert value(samples, "assaywatch_alarms_total", agent=self.AGENT) == 0
        return samples

    def close(self) -> None:
        self.http.close()


def wait_healthy(mon: MonitorProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get(mon.url("/healthz"))[0] == 200:
            return
        time.sleep(0.1)
    raise AssertionError("monitor not healthy")


def metrics_ok(mon: MonitorProcess) -> Samples:
    """/metrics, the status page and the JSON API all answer 200."""
    for path in ("/", "/api/streams"):
        code, body = get(mon.url(path))
        assert code == 200, (path, body[:300])
    return scrape(mon.addresses["metrics"])
