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
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

import assaywatch
from assaywatch.analyzers.model import Verdict
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import (
    DETECTORS,
    EVALUATION,
    STREAM_STATES,
    split_alarm_name,
    stream_state,
)
from assaywatch.monitor.pipeline.join import JOIN_OUTCOMES
from assaywatch.monitor.receivers.spans import (
    EVALUATION_EVENT,
    LOG_EVENT_OTHER,
    IngestCounters,
)

KEY_LABELS = ["agent", "version", "scenario"]
_KEY_NAMES = tuple(KEY_LABELS)
COVERAGE_DIMENSIONS = ("tool", "path", "state", "boundary", "model", "overall")
VERDICT_TESTS = ("pass_rate", "fingerprint", "sprt")
RECEIVERS = ("otlp_grpc", "otlp_http")
#: Scrape intervals below this are not planned for (bursts of scrapes by hand)
MIN_SCRAPE_INTERVAL_S = 0.5
STREAM_REMOVALS = ("idle", "replaced", "deleted")
#: Seconds a snapshot spends at most (under the pipeline lock) computing the streams'
#: statuses that are due (``Engine.settle``); the rest wait for the next snapshot,
#: counted in ``assaywatch_status_refresh_backlog``
STATUS_BUDGET_S = 0.1

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=65_536)
def _wilson95(k: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval, cached: each scrape asks for the same (k, n) pairs again
    (frozen baselines, windows of bounded size), and scipy's binomtest costs ~0.4 ms a
    call, which made a scrape of 1,000 streams spend most of its time here."""
    from assaywatch.analyzers.verdicts import wilson_interval

    return wilson_interval(k, n, 0.05)


Key = tuple[str, ...]


class _Family:
    """One stream family's samples: (stream key, extra label values, value) rows."""

    __slots__ = ("name", "kind", "doc", "labels", "keyed", "rows")

    def __init__(self, name: str, kind: str, doc: str, extra: tuple[str, ...],
                 keyed: bool) -> None:
        self.name, self.kind, self.doc, self.keyed = name, kind, doc, keyed
        self.labels = (tuple(KEY_LABELS) if keyed else ()) + extra
        self.rows: list[tuple[Key, Key, float]] = []

    def add(self, key: Key, extra: Key, value: float) -> None:
        self.rows.append((key, extra, value))

    def metric(self) -> Metric:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        fam = cls(self.name, self.doc, labels=list(self.labels))
        for key, extra, value in self.rows:
            fam.add_metric([*key, *extra], value)
        return fam


class _Rows:
    """The stream families of one snapshot, gathered under the pipeline lock as tuples and
    turned into text (:meth:`render`, the ``/metrics`` path) or into ``Metric`` objects
    (:meth:`metrics`, ``collect`` for a registry) after the lock is released."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def _family(self, name: str, kind: str, doc: str, extra: tuple[str, ...],
                keyed: bool) -> _Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = _Family(name, kind, doc, extra, keyed)
        return fam

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = (),
              keyed: bool = True) -> _Family:
        return self._family(name, "gauge", doc, extra, keyed)

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = (),
                keyed: bool = True) -> _Family:
        return self._family(name, "counter", doc, extra, keyed)

    def metrics(self) -> list[Metric]:
        return [fam.metric() for fam in self.families.values()]

    def render(self, labels: _LabelText) -> bytes:
        """The families in the Prometheus text format 0.0.4, as ``generate_latest`` writes
        them (a test parses both and compares); label texts come from ``labels``' cache,
        so a scrape of 1,000 streams formats each stream's labels once, not per sample."""
        out: list[str] = []
        for fam in self.families.values():
            sample = f"{fam.name}_total" if fam.kind == "counter" else fam.name
            doc = fam.doc.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {sample} {doc}\n# TYPE {sample} {fam.kind}\n")
            extra_names = fam.labels[3:] if fam.keyed else fam.labels
            for key, extra, value in fam.rows:
                text = labels.text(_KEY_NAMES, key) if key else ""
                if extra:
                    more = labels.text(extra_names, extra)
                    text = f"{text},{more}" if text else more
                v = str(value) if type(value) is int else floatToGoString(value)
                out.append(f"{sample}{{{text}}} {v}\n" if text else f"{sample} {v}\n")
        return "".join(out).encode("utf-8")


def _label_value(v: str) -> str:
    """A label value escaped for the text format, made valid UTF-8 (a lone surrogate that
    slipped past the edge is replaced, never a 500)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        v = v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class _LabelText:
    """Rendered label texts (``name="value",...``) by label names and values, kept across
    snapshots (cleared past ``LIMIT`` entries: a stream turnover never grows it)."""

    LIMIT = 200_000

    def __init__(self) -> None:
        self._texts: dict[tuple[Key, Key], str] = {}

    def text(self, names: Key, values: Key) -> str:
        text = self._texts.get((names, values))
        if text is None:
            if len(self._texts) >= self.LIMIT:
                self._texts.clear()
            text = self._texts[(names, values)] = ",".join(
                f'{n}="{_label_value(v)}"' for n, v in zip(names, values, strict=True))
        return text


@dataclass
class _Snapshot:
    seq: int
    taken: float  # monotonic
    rows: _Rows
    dropped: dict[str, int]
    joins: dict[str, int]
    text: bytes | None = None  # the rendered stream families (render mode)


class MonitorCollector(Collector):
    """Yields every ``assaywatch_*`` family from the engine and the ingest counters.

    ``lock`` is the lock the pipeline holds while it mutates the engine; ``pending`` reports
    the number of open traces in the assembler.

    **A scrape never waits on the pipeline.** The stream families (and the engine's
    dropped counts) are read under ``lock`` into a *snapshot* of plain tuples; the text is
    formatted after the lock is released. The edge counters (received, rejected,
    sanitised, the assembler's drops) and the pending-trace count are read live, without
    the pipeline lock.

    Two ways to serve it:

    * **render mode** (the monitor's ``/metrics``: :meth:`start`, then
      :meth:`stream_exposition`). A background thread takes and renders snapshots. It
      learns the scrapes' cadence and takes each snapshot just before the next scrape is
      due (1.5 times the last snapshot's duration ahead), so a scrape finds one younger
      than ``max_age_s`` and answers at once. Otherwise (the first scrapes, an irregular
      scraper) a scrape asks for one and waits at most ``scrape_wait_s``, else it answers
      with the newest rendered snapshot. A scrape's time is therefore bounded by
      ``scrape_wait_s`` plus sending the bytes, however busy the pipeline or the CPU: at
      1,000 streams a snapshot is ~70,000 samples, and formatting them took seconds of a
      contended GIL while ingestion was at full speed.
    * **collect mode** (no thread: a registry, tests, tools): ``collect`` refreshes
      synchronously, waiting at most ``scrape_wait_s`` for the lock, and yields the
      stream families as ``Metric`` objects.

    Counters never go backwards between scrapes: snapshots are taken one at a time, each
    later than the one it replaces, and a dropped count is the live counter (monotone)
    plus the snapshot's engine count (monotone across snapshots).
    """

    def __init__(self, engine: Engine, counters: IngestCounters,
                 lock: threading.Lock | threading.RLock | None = None,
                 pending: Callable[[], int] | None = None,
                 scrape_wait_s: float = 0.5, refresh_wait_s: float = 2.0,
                 joins: Callable[[], dict[str, int]] | None = None,
                 max_age_s: float = 2.0) -> None:
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
        self._snapshot: _Snapshot | None = None
        self._seq = 0
        #: served as is when younger (render mode)
        self.max_age_s = max_age_s
        #: when the last scrapes came, and how long the last snapshot took
        self._scrapes: deque[float] = deque(maxlen=6)
        self._snapshot_s = 0.0
        self._labels = _LabelText()
        self._refreshing = threading.Lock()  # one refresh at a time: snapshots only advance
        self._taken = threading.Condition()  # notified when a snapshot is stored
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> list[Metric]:  # no registration-time collect()
        return []

    # -- the snapshot ---------------------------------------------------------------------
    def refresh(self, wait_s: float) -> bool:
        """Take a new snapshot if the pipeline lock is free within ``wait_s`` seconds (and
        render it, in render mode)."""
        if not self._refreshing.acquire(timeout=wait_s):
            return False  # another refresh is running: its snapshot will do
        try:
            started = time.monotonic()
            if not self.lock.acquire(timeout=wait_s):
                return False
            try:
                rows = self._gather()
                dropped = dict(self.engine.dropped)
                joins = dict(self.joins())
            finally:
                self.lock.release()
            snap = _Snapshot(self._seq + 1, time.monotonic(), rows, dropped, joins)
            if self._thread is not None:
                snap.text = rows.render(self._labels)
                self._snapshot_s = time.monotonic() - started
            with self._taken:
                self._seq = snap.seq
                self._snapshot = snap
                self._taken.notify_all()
            return True
        finally:
            self._refreshing.release()

    def snapshot_age(self) -> float | None:
        """Seconds since the served snapshot was taken (None before the first)."""
        snap = self._snapshot
        return None if snap is None else time.monotonic() - snap.taken

    def start(self) -> None:
        """Render mode: start the thread that takes the snapshots scrapes ask for."""
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
            wait = self._until_due()
            # asked by a scrape, or due before the next one; re-planned every second
            asked = self._wanted.wait(1.0 if wait is None else min(wait, 1.0))
            if self._stop.is_set():
                return
            if not asked and (wait is None or wait > 1.0):
                continue
            self._wanted.clear()  # asked again meanwhile: one more snapshot after this
            try:
                if not self.refresh(self.refresh_wait_s):
                    self._wanted.set()  # the pipeline held its lock: try again
            except Exception:  # never let a bad stream stop the metrics
                logger.exception("metrics snapshot failed")
                self._stop.wait(1.0)

    def stream_metrics(self) -> list[Metric]:
        """The stream families now, as ``Metric`` objects (read under the lock; for tools
        and tests comparing engines)."""
        with self.lock:
            rows = self._gather()
        return rows.metrics()

    def invalidate(self) -> None:
        """The state changed by a request (a re-baseline, a deletion): the next scrape
        asks for a new snapshot instead of serving one up to ``max_age_s`` old."""
        with self._taken:
            snap = self._snapshot
            if snap is not None:
                snap.taken = -math.inf

    def _until_due(self) -> float | None:
        """Seconds until a snapshot should be taken so that it is ready when the next
        scrape comes (the scrapes' median interval after the last one, less 1.5 times the
        last snapshot's duration and 0.2 s); None (wait to be asked) before two scrapes.
        When the snapshot for the next scrape is taken already, the one after it; when
        that one is taken too, the scrapes have stopped: None, so a scraper that goes away
        (Prometheus down, a benchmark done polling) leaves the pipeline lock alone instead
        of being planned for over and over."""
        times = list(self._scrapes)
        if len(times) < 2:
            return None
        gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
        interval = max(gaps[len(gaps) // 2], MIN_SCRAPE_INTERVAL_S)
        due = times[-1] + interval - (1.5 * self._snapshot_s + 0.2)
        snap = self._snapshot
        if snap is not None and snap.taken >= due:
            due += interval
            if snap.taken >= due:
                return None
        return max(0.0, due - time.monotonic())

    def stream_exposition(self) -> bytes:
        """Render mode: the stream families as text, from a snapshot taken for this scrape
        if it is ready within ``scrape_wait_s``, else from the newest one (empty before
        the first). Call it before ``generate_latest`` of the registry, whose ``collect``
        then reads the same snapshot's dropped and join counts."""
        return self.stream_exposition_aged()[0]

    def stream_exposition_aged(self) -> tuple[bytes, float | None]:
        """:meth:`stream_exposition`, and the age in seconds of the snapshot it served
        (None before the first): ``/metrics`` sends it as ``X-Assaywatch-Snapshot-Age``,
        so a reader that differences counters over short windows can date them."""
        if self._thread is None:
            self.refresh(self.scrape_wait_s)
        else:
            now = time.monotonic()
            self._scrapes.append(now)
            snap = self._snapshot
            if snap is None or now - snap.taken > self.max_age_s:
                asked = self._seq
                self._wanted.set()
                with self._taken:
                    self._taken.wait_for(lambda: self._seq > asked,
                                         timeout=self.scrape_wait_s)
        snap = self._snapshot
        if snap is None:
            return b"", None
        if snap.text is None:  # taken in collect mode
            snap.text = snap.rows.render(self._labels)
        return snap.text, max(0.0, time.monotonic() - snap.taken)

    # -- exposition -----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        render_mode = self._thread is not None
        if not render_mode:
            self.refresh(self.scrape_wait_s)
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
            if not render_mode:  # render mode: the text comes from stream_exposition
                yield from snap.rows.metrics()
            for reason, v in snap.dropped.items():
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
            joins.update(snap.joins)
        for outcome, v in joins.items():
            fam.add_metric([outcome], v)
        yield fam
        g = GaugeMetricFamily("assaywatch_pending_traces", "Traces waiting to be assembled.")
        g.add_metric([], self.pending())
        yield g
        g = GaugeMetricFamily("assaywatch_build_info", "Build information.", labels=["version"])
        g.add_metric([assaywatch.__version__], 1)
        yield g

    def _gather(self) -> _Rows:
        """The stream families' samples, read under the pipeline lock (cheap tuples: the
        text is rendered after the lock is released)."""
        hold = self.engine.config.alarm_hold_runs
        rows = _Rows()
        rows.gauge("assaywatch_calibrations_pending", "Streams whose baseline froze and "
                   "whose detectors await their thresholds (queued or running in the "
                   "calibration worker).", keyed=False).add((), (),
                                                            self.engine.calibration_backlog)
        removed = rows.counter("assaywatch_streams_removed", "Streams forgotten, by reason: "
                               "idle (no run for limits.stream_idle_seconds), replaced (an "
                               "idle stream's place given to a new one at max_streams), "
                               "deleted (POST /api/streams/delete).", ("reason",),
                               keyed=False)
        for reason in STREAM_REMOVALS:
            removed.add((), (reason,), self.engine.removed.get(reason, 0))
        backlog = self.engine.settle(STATUS_BUDGET_S)
        rows.gauge("assaywatch_status_refresh_backlog", "Streams whose status (verdicts, "
                   "fingerprint shifts, recommended trials) is due for a refresh and still "
                   "shows an earlier one: a snapshot spends at most 0.1 s computing them, "
                   "the longest due first.", keyed=False).add((), (), backlog)
        runs = rows.counter("assaywatch_runs", "Assembled runs by outcome.", ("outcome",))
        alarms_total = rows.counter("assaywatch_alarms", "Alarm firings (evaluator: the "
                                    "evaluator of an evaluation alarm, else \"\").",
                                    ("detector", "evaluator"))
        evaluations = rows.counter("assaywatch_evaluations", "Graded evaluation scores "
                                   "received per evaluator (on the trace or joined late).",
                                   ("evaluator",))
        score = rows.gauge("assaywatch_evaluation_score", "Mean of the evaluator's most "
                           "recent scores (up to 200).", ("evaluator",))
        baseline_runs = rows.gauge("assaywatch_baseline_runs", "Runs in the stream's frozen "
                                   "baseline (0 while learning).")
        phase = rows.gauge("assaywatch_stream_state", "The stream's phase, one-hot: learning "
                           "its baseline, calibrating its detectors (runs buffered, in "
                           "order), monitoring.", ("state",))
        alarm = rows.gauge("assaywatch_alarm", "1 while the detector's alarm is active.",
                           ("detector", "evaluator"))
        stat = rows.gauge("assaywatch_cusum_statistic", "CUSUM statistic per feature "
                          "(pass_rate for the Bernoulli CUSUM, latency for the chart on "
                          "every call's latency).", ("feature",))
        verdict = rows.gauge("assaywatch_verdict", "Current verdict per test, one-hot.",
                             ("test", "verdict"))
        rate = rows.gauge("assaywatch_pass_rate", "Pass rate of the window.", ("window",))
        rate_lo = rows.gauge("assaywatch_pass_rate_lower", "Wilson 95% lower bound.",
                             ("window",))
        rate_hi = rows.gauge("assaywatch_pass_rate_upper", "Wilson 95% upper bound.",
                             ("window",))
        llr = rows.gauge("assaywatch_sprt_log_likelihood_ratio",
                         "Current SPRT log-likelihood ratio.")
        sprt_lo = rows.gauge("assaywatch_sprt_lower_boundary",
                             "SPRT Pass boundary a = log(beta/(1-alpha)).")
        sprt_hi = rows.gauge("assaywatch_sprt_upper_boundary",
                             "SPRT Fail boundary b = log((1-beta)/alpha).")
        thr = rows.gauge("assaywatch_cusum_threshold", "CUSUM alarm threshold h "
                         "(detector: the alarm key, evaluation:<evaluator> for an "
                         "evaluator's).", ("detector",))
        fp_shift = rows.gauge("assaywatch_fingerprint_shift", "Mahalanobis distance of the "
                              "recent window's mean fingerprint to the baseline.")
        feat_shift = rows.gauge("assaywatch_fingerprint_feature_shift", "Standardised shift "
                                "of each fingerprint feature (recent window vs baseline).",
                                ("feature",))
        hotelling = rows.gauge("assaywatch_hotelling_p_value", "p-value of the windowed "
                               "Hotelling T^2 test.")
        cov = rows.gauge("assaywatch_coverage_ratio", "Coverage per dimension.",
                         ("dimension",))
        trials = rows.gauge("assaywatch_recommended_trials", "Adaptive budget n*: candidate "
                            "runs recommended per decision.")
        detectors = [det for det in DETECTORS if det in self.engine.config.detectors]
        monitor_scores = EVALUATION in self.engine.config.detectors
        for st in self.engine.streams(settle=False):
            k = (st.key.agent, st.key.version, st.key.scenario)
            for outcome in ("pass", "fail", "unknown"):
                runs.add(k, (outcome,), st.outcomes.get(outcome, 0))
            for ev in st.evaluators.values():
                evaluations.add(k, (ev.name,), ev.count)
                mean = ev.recent_mean
                if mean is not None:
                    score.add(k, (ev.name,), mean)
            base = st.baseline
            baseline_runs.add(k, (), base.n_runs if base else 0)
            state = stream_state(st)
            for name in STREAM_STATES:
                phase.add(k, (name,), int(name == state))
            if base is None:
                continue
            # every configured detector's alarm series (0 while it cannot run), and one
            # per evaluator watch; statistics and thresholds from the watches alone
            for name in st.alarm_keys(detectors):
                labels = split_alarm_name(name)
                if labels[0] == EVALUATION and not monitor_scores:
                    continue
                alarm.add(k, labels, int(st.alarm_active(name, hold)))
                alarms_total.add(k, labels, st.alarms_total.get(name, 0))
            for watch in st.watches.values():
                for feature, value in watch.statistics().items():
                    stat.add(k, (feature,), value)
                thr.add(k, (watch.name,), watch.threshold)
            verdicts = {"pass_rate": st.pass_rate_verdict, "fingerprint": st.fingerprint_verdict,
                        "sprt": st.sprt_verdict}
            for test in VERDICT_TESTS:
                current = verdicts[test] or Verdict.INCONCLUSIVE
                for v in Verdict:
                    verdict.add(k, (test, v.value), int(v is current))
            windows: list[tuple[str, float, float, float]] = []
            decided = base.passes + base.fails
            if decided:
                lo, hi = _wilson95(base.passes, decided)
                windows.append(("baseline", base.passes / decided, lo, hi))
            n_recent = len(st.recent_outcomes)
            if n_recent:  # as recent_pass_rate(st), with the interval cached
                k_recent = sum(st.recent_outcomes)
                windows.append(("recent", k_recent / n_recent, *_wilson95(k_recent, n_recent)))
            for window, p, lo, hi in windows:
                rate.add(k, (window,), p)
                rate_lo.add(k, (window,), lo)
                rate_hi.add(k, (window,), hi)
            sprt = st.sprt
            if sprt is not None:
                llr.add(k, (), sprt.llr)
                sprt_lo.add(k, (), sprt.lower)
                sprt_hi.add(k, (), sprt.upper)
            if st.fingerprint_shift is not None:
                fp_shift.add(k, (), st.fingerprint_shift)
                for name, value in st.feature_shift.items():
                    if math.isfinite(value):
                        feat_shift.add(k, (name,), value)
            if st.hotelling_p is not None:
                hotelling.add(k, (), st.hotelling_p)
            if st.coverage is not None:
                # Only measured dimensions: one without an inventory (tools observed,
                # no models or boundaries configured) would read 1.0, "fully covered".
                # ``overall`` is the geometric mean of the dimensions exported beside it.
                for dim, value in st.coverage.report().as_dict().items():
                    cov.add(k, (dim,), value)
            if st.recommended_trials is not None:
                trials.add(k, (), st.recommended_trials)
        return rows
