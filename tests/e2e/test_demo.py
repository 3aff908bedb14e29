"""``assaywatch demo`` as a newcomer runs it, in a subprocess without a terminal.

The demo's monitor listens on real loopback ports and its agent exports over real
OTLP/gRPC. While a demo runs, a poller thread scrapes the /metrics address the demo prints
on its first line, so the tests check what Prometheus would have seen, not only the final
text. Each demo takes a few seconds; the runs are deterministic in the agent's seed, but the
latency features of the fingerprint depend on timing, so the assertions are about which
side of the regression an alarm falls on, not about exact run numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.monitor.commands.demo import DEFAULT_RUNS, resolve
from assaywatch.monitor.commands.errors import UsageError

pytestmark = [pytest.mark.e2e]

ADDRESS = re.compile(r"metrics http://(127\.0\.0\.1:\d+)/metrics")
ALARM_LINE = re.compile(r"^ALARM (\w+) fired at run (\d+)$", re.M)
SUMMARY_ALARM = re.compile(r"^  alarm (\w+): first fired at run (\d+) ", re.M)
DEMO_LABELS = {"agent": "support-agent", "version": "1.0", "scenario": "refund"}


def _command() -> list[str]:
    script = Path(sys.executable).with_name("assaywatch")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "assaywatch.monitor.commands.cli"]


class Demo:
    """A demo subprocess whose stdout is collected line by line and whose /metrics is polled
    every 50 ms from the moment it prints its address until it exits."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.pop("ASSAYWATCH_DEMO_RUNS", None)
        env["ASSAYWATCH_METRICS"] = "127.0.0.1:0"  # never the default port 9464
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [*_command(), "demo", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.address: str | None = None
        self.scrapes: list[list[tuple[str, dict[str, str], float]]] = []
        self.seen = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            m = ADDRESS.search(line)
            if m and self.address is None:
                self.address = m.group(1)
            self.seen.set()

    def _poll(self) -> None:
        while self.proc.poll() is None:
            if self.address is not None:
                try:
                    # a generous timeout: a scrape waits for the pipeline lock, which the
                    # baseline freeze holds while it calibrates the detectors
                    with urllib.request.urlopen(f"http://{self.address}/metrics",
                                                timeout=30) as resp:
                        text = resp.read().decode()
                    self.scrapes.append([(s.name, s.labels, s.value)
                                         for fam in text_string_to_metric_families(text)
                                         for s in fam.samples])
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass  # starting up or shutting down
            time.sleep(0.05)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"no line matching {pattern!r}; output:\n{self.output}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"demo did not finish in {timeout} s:\n{self.output}") from None
        self._reader.join(timeout=10)
        self._poller.join(timeout=10)
        assert self.proc.stderr is not None
        return rc, self.proc.stderr.read()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def max_sample(self, name: str, **labels: str) -> float:
        """Largest value of a series over every scrape taken while the demo ran."""
        want = {**DEMO_LABELS, **labels}
        return max((v for scrape in self.scrapes for n, lab, v in scrape
                    if n == name and all(lab.get(k) == x for k, x in want.items())),
                   default=float("nan"))


@contextmanager
def demo(*args: str) -> Iterator[Demo]:
    d = Demo(*args)
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=10)


@pytest.mark.slow
def test_tool_mix_regression_alarms_after_run_200_and_metrics_show_it() -> None:
    with demo("--runs", "400", "--at", "200", "--regression", "tool-mix") as d:
        rc, err = d.finish()
    out = d.output
    assert rc == 0, out + err
    live = {det: int(run) for det, run in ALARM_LINE.findall(out)}
    summary = {det: int(run) for det, run in SUMMARY_ALARM.findall(out)}
    assert live, f"no alarm reported:\n{out}"
    assert live == summary, (live, summary)
    # the tool mix changes behaviour, not the pass rate: a fingerprint detector catches it
    assert {"cusum_fingerprint", "hotelling"} & set(live), live
    assert all(run > 200 for run in live.values()), f"an alarm before the regression: {live}"
    assert all("runs into the regression" in line for line in out.splitlines()
               if SUMMARY_ALARM.match(line))
    # /metrics showed the alarm while the demo ran (alarm gauge 1, onset counter > 0)
    assert d.address is not None and d.scrapes, "never scraped /metrics"
    fired = [det for det in live if d.max_sample("assaywatch_alarm", detector=det) == 1]
    assert fired, f"/metrics never showed assaywatch_alarm=1 for {sorted(live)}"
    assert all(d.max_sample("assaywatch_alarms_total", detector=det) >= 1 for det in fired)
    assert d.max_sample("assaywatch_runs_total", outcome="pass") > 0
    # the service's own alarm log lines no longer leak into the demo's output
    assert not re.search(r"alarm \w+ on support-agent", out + err), err
    assert "Traceback" not in err, err


@pytest.mark.slow
def test_no_regression_reports_no_alarm() -> None:
    with demo("--runs", "400", "--at", "200", "--regression", "none") as d:
        rc, err = d.finish()
    out = d.output
    assert rc == 0, out + err
    assert not ALARM_LINE.search(out), out
    assert "no alarm fired (as expected: nothing changed)" in out
    assert d.scrapes, "never scraped /metrics"
    # the detectors ran (a frozen baseline) and /metrics never showed an active alarm
    assert d.max_sample("assaywatch_baseline_runs") > 0
    assert d.max_sample("assaywatch_alarm") == 0
    assert "Traceback" not in err, err


@pytest.mark.slow
def test_ctrl_c_exits_cleanly_with_a_partial_summary() -> None:
    with demo("--runs", "20000", "--regression", "pass-rate") as d:
        d.wait_for(r"^baseline frozen after \d+ runs", timeout=60)
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGINT)
        rc, err = d.finish(timeout=30)
        took = time.monotonic() - t0
    out = d.output
    assert rc == 130, out + err
    assert "interrupted: partial summary" in out
    assert "(not reached)" in out  # interrupted long before run 10000
    assert "Traceback" not in err, err
    assert took < 15, f"clean-up after Ctrl-C took {took:.1f} s"


def test_usage_errors_exit_3_with_a_message() -> None:
    res = subprocess.run([*_command(), "demo", "--runs", "100", "--at", "100"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 3
    assert "need 0 < --at < --runs" in res.stderr and "Traceback" not in res.stderr


def _args(**kw: object) -> argparse.Namespace:
    base = {"runs": None, "at": None, "metrics": None, "hold": 0.0}
    return argparse.Namespace(**{**base, **kw})


def test_environment_sets_runs_and_metrics_and_flags_win() -> None:
    a = _args()
    resolve(a, {})
    assert (a.runs, a.at, a.metrics) == (DEFAULT_RUNS, DEFAULT_RUNS // 2, "127.0.0.1:9464")
    a = _args()
    resolve(a, {"ASSAYWATCH_DEMO_RUNS": "120", "ASSAYWATCH_METRICS": "127.0.0.1:0"})
    assert (a.runs, a.at, a.metrics) == (120, 60, "127.0.0.1:0")
    a = _args(runs=50, at=10, metrics="127.0.0.1:1234")
    resolve(a, {"ASSAYWATCH_DEMO_RUNS": "120", "ASSAYWATCH_METRICS": "127.0.0.1:0"})
    assert (a.runs, a.at, a.metrics) == (50, 10, "127.0.0.1:1234")
    with pytest.raises(UsageError, match="ASSAYWATCH_DEMO_RUNS must be a whole number"):
        resolve(_args(), {"ASSAYWATCH_DEMO_RUNS": "many"})
