"""Prometheus exposition: one custom collector over the monitor's current state.

The metric names are the DESIGN.md contract ("Prometheus metrics"). Labels are bounded:
``agent``, ``version``, ``scenario`` (at most ``limits.max_streams`` streams), plus small
fixed sets (detector, test, verdict, window, dimension, receiver, reason) and the
fingerprint feature names of a stream's baseline. Trace, user or session ids never
become labels.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import assaywatch
from assaywatch.analyzers.model import Verdict
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import DETECTORS, EVALUATION, alarm_name
from assaywatch.monitor.pipeline.join import JOIN_OUTCOMES
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    LOG_EVENT_OTHER,
    IngestCounters,
)

KEY_LABELS = ["agent", "version", "scenario"]
COVERAGE_DIMENSIONS = ("tool", "path", "state", "boundary", "model", "overall")
VERDICT_TESTS = ("pass_rate", "fingerprint", "sprt")
RECEIVERS = ("otlp_grpc", "otlp_http")

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=65_536)
def _wilson95(k: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval, cached: each scrape asks for the same (k, n) pairs again
    (frozen baselines, windows of bounded size), and scipy's binomtest costs ~0.4 ms a
    call, which made a scrape of 1,000 streams spend most of its time here."""
    from assaywatch.analyzers.verdicts import wilson_interval

    return wilson_interval(k, n, 0.05)


class MonitorCollector(Collector):
    """Yields every ``assaywatch_*`` family from the engine and the ingest counters.

    ``lock`` is the lock the pipeline holds while it mutates the engine; ``pending`` reports
    the number of open traces in the assembler.

    **A scrape never waits on the pipeline.** The stream families (and the engine's
    dropped counts) are read under ``lock`` into a *snapshot*; ``collect`` serves the
    newest snapshot. A scrape tries to refresh it, waiting at most ``scrape_wait_s`` for
    the lock; when the pipeline holds it longer (overload, a long batch), the scrape
    answers from the last snapshot and a background thread keeps trying (each attempt
    waits up to ``refresh_wait_s``) so the next scrape finds a fresh one. The edge
    counters (received, rejected, sanitised, the assembler's drops) and the pending-trace
    count are read live, without the pipeline lock.

    Counters never go backwards between scrapes: snapshots are taken one at a time, each
    later than the one it replaces, and a dropped count is the live counter (monotone)
    plus the snapshot's engine count (monotone across snapshots).
    """

    def __init__(self, engine: Engine, counters: IngestCounters,
                 lock: threading.Lock | threading.RLock | None = None,
                 pending: Callable[[], int] | None = None,
                 scrape_wait_s: float = 0.2, refresh_wait_s: float = 2.0,
                 joins: Callable[[], dict[str, int]] | None = None) -> None:
        if not (scrape_wait_s >= 0 and refresh_wait_s >= 0):
            raise ValueError("MonitorCollector: scrape_wait_s and refresh_wait_s must be >= 0 "
                             f"seconds, got {scrape_wait_s!r}, {refresh_wait_s!r}")
        self.engine = engine
        self.counters = counters
        self.lock = lock or threading.RLock()
        self.pending = pending or (lambda: 0)
        #: the evaluation join's counts (read under ``lock``, into the snapshot)
        self.joins = joins or dict
        self.scrape_wait_s = scrape_wait_s
        self.refresh_wait_s = refresh_wait_s
        #: (monotonic time taken, stream families, engine dropped counts, join counts)
        self._snapshot: tuple[float, list[Metric], dict[str, int], dict[str, int]] | None = None
        self._refreshing = threading.Lock()  # one refresh at a time: snapshots only advance
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> list[Metric]:  # no registration-time collect()
        return []

    # -- the snapshot ---------------------------------------------------------------------
    def refresh(self, wait_s: float) -> bool:
        """Take a new snapshot if the pipeline lock is free within ``wait_s`` seconds."""
        if not self._refreshing.acquire(timeout=wait_s):
            return False  # another refresh is running: its snapshot will do
        try:
            if not self.lock.acquire(timeout=wait_s):
                return False
            try:
                families = list(self._stream_families())
                dropped = dict(self.engine.dropped)
                joins = dict(self.joins())
            finally:
                self.lock.release()
            self._snapshot = (time.monotonic(), families, dropped, joins)
            return True
        finally:
            self._refreshing.release()

    def snapshot_age(self) -> float | None:
        """Seconds since the served snapshot was taken (None before the first)."""
        snap = self._snapshot
        return None if snap is None else time.monotonic() - snap[0]

    def start(self) -> None:
        """Start the background thread that retries a refresh a scrape could not make."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._refresh_loop, daemon=True,
                                            name="assaywatch-metrics-snapshot")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_wait_s + 1)
            self._thread = None

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait()
            if self._stop.is_set():
                return
            try:
                if self.refresh(self.refresh_wait_s):
                    self._wanted.clear()
            except Exception:  # never let a bad stream stop the metrics
                logger.exception("metrics snapshot failed")
                self._wanted.clear()
                self._stop.wait(1.0)

    # -- exposition -----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        if not self.refresh(self.scrape_wait_s):
            self._wanted.set()  # the background thread takes one as soon as it can
        snap = self._snapshot
        received, rejected, dropped = self.counters.snapshot()
        fam = CounterMetricFamily("assaywatch_spans_received",
                                  "Spans accepted by each receiver.", labels=["receiver"])
        for rec in sorted(set(RECEIVERS) | set(received)):
            fam.add_metric([rec], received.get(rec, 0))
        yield fam
        fam = CounterMetricFamily("assaywatch_spans_rejected",
                                  "Spans (or undecodable requests) refused at the edge.",
                                  labels=["receiver", "reason"])
        for (rec, reason), v in sorted(rejected.items()):
            fam.add_metric([rec, reason], v)
        yield fam
        fam = CounterMetricFamily("assaywatch_values_sanitised",
                                  "Values the edge repaired and kept: invalid UTF-8 replaced, "
                                  "names and label values cut to 256 characters, span times "
                                  "(end_before_start clamped, time_out_of_range counted).",
                                  labels=["receiver", "reason"])
        for (rec, reason), v in sorted(self.counters.sanitised_snapshot().items()):
            fam.add_metric([rec, reason], v)
        yield fam
        all_dropped = dict(dropped)
        if snap is not None:
            yield from snap[1]
            for reason, v in snap[2].items():
                all_dropped[reason] = all_dropped.get(reason, 0) + v
        fam = CounterMetricFamily("assaywatch_spans_dropped",
                                  "Spans or runs discarded after the edge, by reason "
                                  "(late_span, evicted_trace, sender_quota, pending_bytes, "
                                  "stream_limit, ...).",
                                  labels=["reason"])
        for reason, v in sorted(all_dropped.items()):
            fam.add_metric([reason], v)
        yield fam
        logs_received, logs_rejected = self.counters.logs_snapshot()
        fam = CounterMetricFamily("assaywatch_log_records_received",
                                  "OTLP log records accepted by each receiver: event "
                                  "gen_ai.evaluation.result (evaluations, to the pipeline) "
                                  "or other (discarded).", labels=["receiver", "event"])
        for rec in RECEIVERS:
            for event in (EVALUATION_EVENT, LOG_EVENT_OTHER):
                logs_received.setdefault((rec, event), 0)
        for (rec, event), v in sorted(logs_received.items()):
            fam.add_metric([rec, event], v)
        yield fam
        fam = CounterMetricFamily("assaywatch_log_records_rejected",
                                  "OTLP log records (or undecodable logs requests) refused "
                                  "at the edge.", labels=["receiver", "reason"])
        for (rec, reason), v in sorted(logs_rejected.items()):
            fam.add_metric([rec, reason], v)
        yield fam
        fam = CounterMetricFamily("assaywatch_evaluation_joins",
                                  "Evaluations received as log events, by what became of "
                                  "them: on_trace, late, unmatched, invalid, waiting_limit, "
                                  "late_not_taken; digest_evicted counts closed traces "
                                  "forgotten early.",
                                  labels=["outcome"])
        joins = dict.fromkeys(JOIN_OUTCOMES, 0)
        if snap is not None:
            joins.update(snap[3])
        for outcome, v in joins.items():
            fam.add_metric([outcome], v)
        yield fam
        g = GaugeMetricFamily("assaywatch_pending_traces", "Traces waiting to be assembled.")
        g.add_metric([], self.pending())
        yield g
        g = GaugeMetricFamily("assaywatch_build_info", "Build information.", labels=["version"])
        g.add_metric([assaywatch.__version__], 1)
        yield g

    def _stream_families(self) -> Iterator[Metric]:
        hold = self.engine.config.alarm_hold_runs
        f: dict[str, Any] = {}

        def gauge(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
            if name not in f:
                f[name] = GaugeMetricFamily(name, doc, labels=KEY_LABELS + (extra or []))
            return f[name]  # type: ignore[no-any-return]

        runs = CounterMetricFamily("assaywatch_runs", "Assembled runs by outcome.",
                                   labels=KEY_LABELS + ["outcome"])
        alarms_total = CounterMetricFamily("assaywatch_alarms", "Alarm firings (evaluator: "
                                           "the evaluator of an evaluation alarm, else \"\").",
                                           labels=KEY_LABELS + ["detector", "evaluator"])
        evaluations = CounterMetricFamily("assaywatch_evaluations", "Graded evaluation "
                                          "scores received per evaluator (on the trace or "
                                          "joined late).",
                                          labels=KEY_LABELS + ["evaluator"])
        monitor_scores = EVALUATION in self.engine.config.detectors
        for st in self.engine.streams():
            k = [st.key.agent, st.key.version, st.key.scenario]
            for outcome in ("pass", "fail", "unknown"):
                runs.add_metric(k + [outcome], st.outcomes.get(outcome, 0))
            for ev in st.evaluators.values():
                evaluations.add_metric(k + [ev.name], ev.count)
                mean = ev.recent_mean
                if mean is not None:
                    gauge("assaywatch_evaluation_score", "Mean of the evaluator's most "
                          "recent scores (up to 200).", ["evaluator"]).add_metric(
                              k + [ev.name], mean)
            base = st.baseline
            gauge("assaywatch_baseline_runs", "Runs in the stream's frozen baseline "
                  "(0 while learning).").add_metric(k, base.n_runs if base else 0)
            if base is None:
                continue
            for det in DETECTORS:
                if det in self.engine.config.detectors:
                    gauge("assaywatch_alarm", "1 while the detector's alarm is active.",
                          ["detector", "evaluator"]).add_metric(
                              k + [det, ""], int(st.alarm_active(det, hold)))
                    alarms_total.add_metric(k + [det, ""], st.alarms_total.get(det, 0))
            for ev in st.evaluators.values() if monitor_scores else ():
                if ev.detector is None:
                    continue
                name = alarm_name(ev.name)
                gauge("assaywatch_alarm", "1 while the detector's alarm is active.",
                      ["detector", "evaluator"]).add_metric(
                          k + [EVALUATION, ev.name], int(st.alarm_active(name, hold)))
                alarms_total.add_metric(k + [EVALUATION, ev.name],
                                        st.alarms_total.get(name, 0))
                gauge("assaywatch_cusum_statistic", "CUSUM statistic per feature "
                      "(pass_rate for the Bernoulli CUSUM).", ["feature"]).add_metric(
                          k + [name], ev.detector.statistic)
            verdicts = {"pass_rate": st.pass_rate_verdict, "fingerprint": st.fingerprint_verdict,
                        "sprt": st.sprt_verdict}
            for test in VERDICT_TESTS:
                current = verdicts[test] or Verdict.INCONCLUSIVE
                for v in Verdict:
                    gauge("assaywatch_verdict", "Current verdict per test, one-hot.",
                          ["test", "verdict"]).add_metric(k + [test, v.value], int(v is current))
            rates: list[tuple[str, float, float, float]] = []
            decided = base.passes + base.fails
            if decided:
                lo, hi = _wilson95(base.passes, decided)
                rates.append(("baseline", base.passes / decided, lo, hi))
            n_recent = len(st.recent_outcomes)
            if n_recent:  # as recent_pass_rate(st), with the interval cached
                k_recent = sum(st.recent_outcomes)
                rates.append(("recent", k_recent / n_recent, *_wilson95(k_recent, n_recent)))
            for window, p, lo, hi in rates:
                gauge("assaywatch_pass_rate", "Pass rate of the window.",
                      ["window"]).add_metric(k + [window], p)
                gauge("assaywatch_pass_rate_lower", "Wilson 95% lower bound.",
                      ["window"]).add_metric(k + [window], lo)
                gauge("assaywatch_pass_rate_upper", "Wilson 95% upper bound.",
                      ["window"]).add_metric(k + [window], hi)
            sprt = st.detectors.get("sprt")
            if sprt is not None:
                gauge("assaywatch_sprt_log_likelihood_ratio",
                      "Current SPRT log-likelihood ratio.").add_metric(k, sprt.llr)
                gauge("assaywatch_sprt_lower_boundary",
                      "SPRT Pass boundary a = log(beta/(1-alpha)).").add_metric(k, sprt.lower)
                gauge("assaywatch_sprt_upper_boundary",
                      "SPRT Fail boundary b = log((1-beta)/alpha).").add_metric(k, sprt.upper)
            cusum = st.detectors.get("cusum_pass_rate")
            stat = gauge("assaywatch_cusum_statistic", "CUSUM statistic per feature "
                         "(pass_rate for the Bernoulli CUSUM).", ["feature"])
            thr = gauge("assaywatch_cusum_threshold", "CUSUM alarm threshold h.", ["detector"])
            if cusum is not None:
                stat.add_metric(k + ["pass_rate"], cusum.statistic)
                thr.add_metric(k + ["cusum_pass_rate"], cusum.threshold)
            fpc = st.detectors.get("cusum_fingerprint")
            if fpc is not None:
                for name, value in fpc.feature_statistics.items():
                    stat.add_metric(k + [name], value)
                thr.add_metric(k + ["cusum_fingerprint"], fpc.threshold)
            if st.fingerprint_shift is not None:
                gauge("assaywatch_fingerprint_shift", "Mahalanobis distance of the recent "
                      "window's mean fingerprint to the baseline.").add_metric(
                          k, st.fingerprint_shift)
                fs = gauge("assaywatch_fingerprint_feature_shift", "Standardised shift of "
                           "each fingerprint feature (recent window vs baseline).", ["feature"])
                for name, value in st.feature_shift.items():
                    if math.isfinite(value):
                        fs.add_metric(k + [name], value)
            if st.hotelling_p is not None:
                gauge("assaywatch_hotelling_p_value", "p-value of the windowed Hotelling "
                      "T^2 test.").add_metric(k, st.hotelling_p)
            if st.coverage is not None:
                # Only measured dimensions: one without an inventory (tools observed,
                # no models or boundaries configured) would read 1.0, "fully covered".
                # ``overall`` is the geometric mean of the dimensions exported beside it.
                cov = gauge("assaywatch_coverage_ratio", "Coverage per dimension.",
                            ["dimension"])
                for dim, value in st.coverage.report().as_dict().items():
                    cov.add_metric(k + [dim], value)
            if st.recommended_trials is not None:
                gauge("assaywatch_recommended_trials", "Adaptive budget n*: candidate runs "
                      "recommended per decision.").add_metric(k, st.recommended_trials)
        yield runs
        yield alarms_total
        yield evaluations
        yield from f.values()
