"""The assay engine: assembled runs in, per-stream verdicts and alarms out.

Clock-free and deterministic: the live monitor and ``assaywatch replay`` both feed it runs
in the order they closed, so a replay of a recorded stream reproduces the live alarms.
Threading, receivers and persistence live in ``monitor/service/``.

Per stream (agent, version, scenario) it keeps a frozen baseline (from a file, learned from
the stream's first ``learn_runs`` runs, or — for a new version of an agent — the previous
version's frozen baseline) and, once the baseline is frozen, these detectors:

``sprt``
    Wald's SPRT on the pass rate, H0 p >= p_b against H1 p <= p_b - delta, restarted after
    every decision and warm-started safely from the baseline (SPEC.md 7.5). Its decision
    is a **verdict** (gauge ``assaywatch_verdict{test="sprt"}``), not an alarm: a restarted
    SPRT is a sequence of tests whose false Fails would need their own share of the budget,
    and the pass-rate CUSUM is the Lorden-optimal restarted test for the same drop.
``cusum_pass_rate``
    Bernoulli likelihood-ratio CUSUM, threshold exact for its share of the ARL0 budget at
    the baseline pass rate's adverse posterior quantile.
``cusum_fingerprint``
    Multichart CUSUM over whitened shift directions of the fingerprint (each feature given
    the others, and tool swaps), per-chart thresholds from a bootstrap of the baseline's
    own runs (``analyzers/detectors/bootstrap.py``); its per-feature charts are the
    ``assaywatch_cusum_statistic{feature}`` gauges.
``hotelling``
    Hotelling T^2 of the last ``hotelling_window`` runs against the baseline, every
    ``hotelling_every`` runs: the fingerprint verdict and the per-feature shift gauges;
    an alarm only when ``alarm_shares`` gives it a share (per-test alpha from the share).
    The pass-rate verdict and the budget, refreshed at the same cadence, and the Hotelling
    test itself when it has no share, are computed when the stream is read
    (:meth:`Engine.streams`, :meth:`Engine.stream`, :meth:`Engine.settle`), from the
    window kept at the cadence: the same values, computed at most once per read.

Each alarming detector (the two CUSUMs above, and one per evaluator of the baseline: a
score-drop or label-shift CUSUM, ``detector="evaluation"``) is a **watch** on one of the
stream's signals (``engine/signals.py``): a run's outcome, fingerprint, scores and labels
are fed to the watches of their signal, and the budget, the alarm bookkeeping, the
exporters and the checkpoint go by watch.

One false-alarm budget per stream: ``arl0`` is split over the detectors that can raise an
alarm by ``alarm_shares`` (false-alarm rates add, Bonferroni in time), each detector's
threshold keeping its share with probability ``(1 + arl0_confidence) / 2`` over the
baseline's sampling, so the union keeps ``arl0`` with probability ``arl0_confidence``.
Thresholds are calibrated once per baseline by the pure function ``calibrate`` (seeded by
the baseline id): on a reservoir sample of ``calibration_runs`` of the runs a learned
baseline was built from, on samples given to the engine, else on Gaussian draws with the
baseline's mean and covariance (a file baseline carries no runs).

Calibration off the hot path (``engine/calibration.py``): given a ``calibrator``, a freeze
submits the calibration to a worker process and the stream says ``calibrating`` while its
runs are buffered in order (at most ``calibration_buffer_runs``; beyond, counted in
``dropped["calibration_buffer"]``); :meth:`Engine.apply_calibrations` (the pipeline thread
calls it) builds the detectors with the thresholds and feeds them the buffered runs, so
alarms and run indices are those of an inline calibration. Without a calibrator
(``assaywatch replay``) calibration is inline. Thresholds are cached by their inputs and
kept in the checkpoint (:meth:`Engine.checkpoint_state`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
import zlib
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from assaywatch.analyzers.baseline import Baseline, BaselineBuilder
from assaywatch.analyzers.budget import adaptive_budget
from assaywatch.analyzers.coverage import CoverageTracker
from assaywatch.analyzers.detectors import BernoulliCUSUM, latency
from assaywatch.analyzers.detectors.bootstrap import (
    BaselineData,
    CalibrationSettings,
    Thresholds,
    evaluator_labels,
)
from assaywatch.analyzers.detectors.label import LabelShiftCUSUM, LabelSummary
from assaywatch.analyzers.detectors.multichart import MultichartCUSUM
from assaywatch.analyzers.detectors.score import ScoreDropCUSUM, ScoreSummary
from assaywatch.analyzers.fingerprint import feature_names, fingerprint
from assaywatch.analyzers.hotelling import hotelling_two_sample
from assaywatch.analyzers.model import MAX_EVALUATORS, Outcome, Run, StreamKey, Verdict
from assaywatch.analyzers.sprt import WarmStartSPRT
from assaywatch.analyzers.verdicts import regression_verdict, sample_size, wilson_interval
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.calibration import (
    CalibrationJob,
    CalibrationWorker,
    ThresholdCache,
    cache_key,
    run_job,
)
from assaywatch.monitor.engine.features import RunFeatures, run_features
from assaywatch.monitor.engine.signals import (
    FINGERPRINT,
    OUTCOME,
    Watch,
    alarm_name,
    watch_shares,
)
from assaywatch.monitor.engine.streams import (
    EVALUATION,
    AlarmEvent,
    EvaluatorState,
    StreamState,
    close_order,
    new_watch,
    split_alarm_name,
)
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.pipeline.outcome import DEFAULT_SCORE_THRESHOLD, judge_evaluation
from assaywatch.monitor.pipeline.runs import REASON_KEY

logger = logging.getLogger(__name__)

#: Runs held per stream for a late verdict at most (the oldest is released beyond).
MAX_HELD = 20_000

class Engine:
    """Feed runs with :meth:`process`; read state with :meth:`streams`.

    Parameters
    ----------
    config:
        The detector section of the monitor configuration.
    baselines:
        Frozen baselines by stream key (from files); other streams learn their own.
    on_alarm:
        Called with every alarm onset (the service appends it to the event log).
    max_streams:
        Streams kept; runs of further streams are counted in ``dropped["stream_limit"]``.
    baseline_samples:
        Optional fingerprints (rows = runs, columns = the baseline's features) of the runs
        a file baseline was built from, by baseline id: its thresholds are then calibrated
        on them rather than on Gaussian draws.
    calibrator:
        Runs calibrations off the caller's thread (module docstring); None: inline.
    calibration_buffer_runs:
        Most runs buffered per calibrating stream.
    score_shift:
        ``evaluations.min_drop``: the drop of an evaluator's mean score, as a fraction of
        its scale, the score detectors are tuned for.
    score_threshold, verdict_window_s:
        Late pass/fail verdicts (``evaluation_threshold``, ``evaluations.
        join_window_seconds``): once a stream has received one, its runs that were not
        judged on the trace wait for their verdict that long (by the runs' end times), then
        count with their outcome at close.
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        baselines: Iterable[Baseline] = (),
        on_alarm: Callable[[AlarmEvent], None] | None = None,
        max_streams: int = 1_000,
        baseline_samples: dict[str, np.ndarray] | None = None,
        calibrator: CalibrationWorker | None = None,
        calibration_buffer_runs: int = 20_000,
        stream_idle_seconds: float = 0.0,
        replace_idle_seconds: float = 3600.0,
        idle_clock: Callable[[], int] | None = None,
        score_shift: float = 0.1,
        score_threshold: float = DEFAULT_SCORE_THRESHOLD,
        verdict_window_s: float = 600.0,
    ) -> None:
        self.config = config or DetectorConfig()
        #: drop of an evaluator's mean, as a fraction of its scale, its detector is tuned for
        self.score_shift = score_shift
        #: a late evaluation's pass/fail: its score at or above this passes (as at close)
        self.score_threshold = score_threshold
        #: how long a run not judged at close waits for a late verdict (data time)
        self.verdict_window_s = verdict_window_s
        self._samples = dict(baseline_samples or {})
        #: calibrated thresholds by their inputs (a new version reuses its predecessor's)
        self._thresholds = ThresholdCache()
        self.calibrator = calibrator
        self.calibration_buffer_runs = calibration_buffer_runs
        #: calibrations: ``computed`` (run here or in a worker), ``cached`` (reused)
        self.calibrations: Counter[str] = Counter()
        #: cache key -> the submitted job's future, and the streams waiting for it
        self._pending: dict[Any, Future[Thresholds]] = {}
        self._waiting: dict[Any, list[StreamState]] = {}
        #: streams whose thresholds arrived, to be applied (in order of arrival)
        self._arrived: deque[tuple[StreamState, Thresholds]] = deque()
        self._ready = threading.Event()
        self.on_alarm = on_alarm
        self.max_streams = max_streams
        self.stream_idle_seconds = stream_idle_seconds
        #: the clock idleness goes by (Unix ns): None, the runs' end times (replay: a
        #: replay removes what it would have removed live over the same data); the
        #: monitor passes the wall clock, so senders whose clocks disagree (or recorded
        #: spans sent late) do not make each other's streams look idle
        self.idle_clock = idle_clock
        self.replace_idle_seconds = replace_idle_seconds
        self.dropped: Counter[str] = Counter()
        #: streams removed, by reason: ``idle`` (expired), ``replaced`` (an idle stream
        #: gave its place to a new one at the stream limit), ``deleted`` (over the API)
        self.removed: Counter[str] = Counter()
        #: streams in order of their latest run (least recently active first)
        self._streams: OrderedDict[StreamKey, StreamState] = OrderedDict()
        #: streams whose status refresh is due (``StreamState.status_due``), oldest first
        self._due: OrderedDict[StreamKey, StreamState] = OrderedDict()
        #: the latest time of ``idle_clock`` seen (Unix ns)
        self.now_ns = 0
        self._next_sweep_ns = 0
        self._file_baselines = {b.key: b for b in baselines}
        #: agent+scenario -> the most recently frozen baseline, for new versions
        self._latest_frozen: dict[tuple[str, str], Baseline] = {}
        for b in self._file_baselines.values():
            self._latest_frozen[(b.key.agent, b.key.scenario)] = b

    # -- reading ---------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # The readiness event holds a lock: copies (deepcopy, pickle) rebuild it. An
        # engine with calibrations in flight (futures, a worker pool) is not copyable.
        state = self.__dict__.copy()
        state["_ready"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "_due" not in state:  # an engine pickled before statuses waited for a reader
            self._due = OrderedDict(
                (k, st) for k, st in self._streams.items() if st.status_due is not None)
        self._ready = threading.Event()
        if self._arrived:
            self._ready.set()

    def streams(self, settle: bool = True) -> list[StreamState]:
        """The streams, each with its status up to date (verdicts, shifts, budget); with
        ``settle`` False, as they are (after :meth:`settle` with a time budget)."""
        if settle:
            self.settle()
        return list(self._streams.values())

    def settle(self, budget_s: float | None = None) -> int:
        """Compute the statuses that are due, the longest due first, for at most
        ``budget_s`` seconds (None: all); returns how many are still due (their streams
        keep the status of an earlier cadence). The exporters read with a budget, so a
        scrape never holds the pipeline for the statuses of a whole fleet."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        due = self._due
        while due:
            if deadline is not None and time.monotonic() >= deadline:
                break
            key, st = due.popitem(last=False)
            if self._streams.get(key) is st:  # not removed or re-baselined meanwhile
                self._settle(st)
        return len(due)

    def stream(self, key: StreamKey) -> StreamState | None:
        st = self._streams.get(key)
        return None if st is None else self._settle(st)

    def partition_state(self) -> tuple[dict[StreamKey, StreamState],
                                       dict[tuple[str, str], Baseline]]:
        """Copies of the streams and of the latest frozen baseline per (agent, scenario):
        what a scale-out detector worker checkpoints for its partition (with
        :attr:`dropped`); :meth:`load_streams` installs them."""
        return dict(self._streams), dict(self._latest_frozen)

    def load_streams(self, streams: Mapping[StreamKey, StreamState],
                     latest_frozen: Mapping[tuple[str, str], Baseline],
                     dropped: Mapping[str, int] | None = None) -> None:
        """Install streams read from a checkpoint, least recently active first (the order
        idle streams are replaced in), their latest frozen baselines and drop counts."""
        self._streams.update(sorted(streams.items(), key=lambda kv: kv[1].last_seen_ns))
        self._due.update((k, st) for k, st in streams.items() if st.status_due is not None)
        self._latest_frozen.update(latest_frozen)
        self.dropped.update(dropped or {})

    @property
    def calibration_backlog(self) -> int:
        """Streams whose baseline froze and whose detectors await their thresholds
        (submitted, running, queued in the worker, or arrived and not yet applied)."""
        return sum(len(w) for w in self._waiting.values()) + len(self._arrived)

    # -- feeding ---------------------------------------------------------------------
    def prepare(self, runs: Iterable[Run]) -> None:
        """Before :meth:`process` is called on ``runs``, in their order: compute, for each
        stream already monitored, its runs' fingerprints and the fingerprint chart's
        increments in one vectorised pass per stream (``MultichartCUSUM.prime``). Only
        work moves: :meth:`process` takes what was prepared for the very run object it
        is given, while the stream's detector is the one prepared for, and computes
        anything else as before. :meth:`unprepare` drops what was not used."""
        prepared = self.__dict__.setdefault("_prepared", {})
        primed = self.__dict__.setdefault("_primed", [])
        by_stream: dict[StreamKey, list[Run]] = {}
        for run in runs:
            by_stream.setdefault(run.key, []).append(run)
        for key, group in by_stream.items():
            st = self._streams.get(key)
            if st is None or st.baseline is None or st.calibrating:
                continue
            watch = st.watches.get("cusum_fingerprint")
            det = watch.detector if watch is not None else None
            if det is None or not hasattr(det, "prime") or len(group) < 2:
                continue
            inputs = []
            for run, (fp, x, parts) in zip(group, self._features(st).many(group),
                                            strict=True):
                prepared[id(run)] = (run, det, fp, x, parts)
                inputs.append(x)
            det.prime(inputs)
            primed.append(det)

    def unprepare(self) -> None:
        """Drop what :meth:`prepare` computed and :meth:`process` did not use."""
        for det in self.__dict__.get("_primed", ()):
            det.unprime()
        self.__dict__.pop("_primed", None)
        self.__dict__.pop("_prepared", None)

    @contextlib.contextmanager
    def prepared(self, runs: Sequence[Run]) -> Iterator[None]:
        """:meth:`prepare` ``runs`` for the block that processes them, :meth:`unprepare`
        after it; if preparing fails, each run is computed alone."""
        try:
            self.prepare(runs)
        except Exception:
            logger.exception("preparing %d runs failed; each is processed alone", len(runs))
            self.unprepare()
        try:
            yield
        finally:
            self.unprepare()

    def process(self, run: Run) -> list[AlarmEvent]:
        """Account one closed run; return the alarms it raised."""
        now = run.end_ns if self.idle_clock is None else self.idle_clock()
        if now > self.now_ns:
            self.now_ns = now
            if self.stream_idle_seconds > 0 and now >= self._next_sweep_ns:
                self.expire_idle()
        st = self._streams.get(run.key)
        if st is None:
            if len(self._streams) >= self.max_streams and not self._replace_idle():
                self.dropped["stream_limit"] += 1
                return []
            st = self._new_stream(run.key)
        else:
            self._streams.move_to_end(run.key)
        if now > st.last_seen_ns:
            st.last_seen_ns = now
        st.n_runs += 1
        st.outcomes[run.outcome.value] += 1
        if not st.first_run_id:
            st.first_run_id = run.run_id
        for name, score in run.scores.items():
            self._count_score(st, name, score)
        for name, label in run.labels.items():
            self._count_score(st, name, label)
        if st.calibrating:
            if len(st.pending_runs) < self.calibration_buffer_runs:
                st.pending_runs.append((run, st.n_runs))
            else:
                self.dropped["calibration_buffer"] += 1
            return []
        if st.baseline is None:
            assert st.builder is not None
            st.builder.add(run)
            self._keep_sample(st, run)
            if st.builder.n_runs >= self.config.learn_runs:
                self._freeze(st, st.builder.freeze(), "learned")
            return []
        return self._monitor(st, run)

    def process_evaluation(self, late: LateEvaluation) -> list[AlarmEvent]:
        """Account the scores of an evaluation that arrived after its run closed
        (``pipeline/join.py``): learned into the baseline while the stream learns,
        buffered while it calibrates, else fed to the evaluator's detector."""
        st = self._streams.get(late.key)
        if st is None:
            self.dropped["evaluation_without_stream"] += 1
            return []
        # (a checkpoint from before labels were kept has LateEvaluations without them)
        labels: dict[str, str] = getattr(late, "labels", None) or {}
        base = st.baseline
        if (base is not None and st.baseline_origin == "learned" and late.start_ns
                and base.last_start_ns is not None and late.start_ns <= base.last_start_ns):
            # a run the baseline learned from, judged after the freeze: neither baseline
            # (frozen) nor candidate (it would dilute a change with in-control scores)
            self.dropped["evaluation_of_learning_run"] += len(late.scores) + len(labels)
            return []
        events: list[AlarmEvent] = []
        verdict = judge_evaluation(late.evaluation, self.score_threshold)
        if verdict is not Outcome.UNKNOWN and base is not None and not st.calibrating:
            # the pass/fail outcome from a late judge: from now on the stream's runs not
            # judged on the trace wait for it (``held``)
            st.late_verdicts = True
            held = st.held.pop(late.run_id, None)
            if held is not None:
                events.extend(self._raise(st, self._outcome(st, verdict), late.run_id,
                                          held[1], None))
        values: list[tuple[str, float | str]] = [*late.scores.items(), *labels.items()]
        for name, score in values:
            if not self._count_score(st, name, score):
                continue
            if st.calibrating:
                if len(st.pending_scores) < self.calibration_buffer_runs:
                    st.pending_scores.append((name, score, late.run_id, 0))
                else:
                    self.dropped["calibration_buffer"] += 1
            elif st.baseline is None:
                assert st.builder is not None
                if isinstance(score, str):
                    st.builder.add_label(name, score)
                else:
                    st.builder.add_score(name, score)
            else:
                events.extend(self._raise(st, self._score(st, name, score), late.run_id,
                                          0, None))
        return events

    def process_closed(self, runs: Iterable[Run]) -> list[AlarmEvent]:
        """Account the runs one assembler poll closed, in a deterministic order (end time,
        then run id), so the live monitor and a replay see the same sequence."""
        events: list[AlarmEvent] = []
        for run in sorted(runs, key=close_order):
            events.extend(self.process(run))
        return events

    def rebaseline(self, key: StreamKey) -> bool:
        """Drop a stream's baseline; it learns a new one from its next runs."""
        st = self._streams.get(key)
        if st is None:
            return False
        self._forget_calibration(st)
        self._streams[key] = self._new_stream(key, learn=True)
        return True

    # -- removing streams ------------------------------------------------------------
    def delete_stream(self, key: StreamKey) -> bool:
        """Forget a stream entirely (baseline, detectors, counts, series): its next run,
        if any, starts a new stream. False when there is no such stream."""
        st = self._streams.get(key)
        if st is None:
            return False
        self._remove(st, "deleted")
        latest = self._latest_frozen.get((key.agent, key.scenario))
        if latest is not None and latest is st.baseline:
            del self._latest_frozen[(key.agent, key.scenario)]
        return True

    def expire_idle(self) -> int:
        """Remove the streams without a run for ``stream_idle_seconds`` by ``idle_clock``;
        returns how many. Called as the clock advances, at most once per tenth of the
        idle time."""
        if self.stream_idle_seconds <= 0:
            return 0
        idle_ns = int(self.stream_idle_seconds * 1e9)
        self._next_sweep_ns = self.now_ns + max(idle_ns // 10, 1)
        cutoff = self.now_ns - idle_ns
        gone = 0
        while self._streams:
            st = next(iter(self._streams.values()))  # least recently active first
            if st.last_seen_ns >= cutoff:
                break
            self._remove(st, "idle")
            gone += 1
        return gone

    def _replace_idle(self) -> bool:
        """At the stream limit: give the least recently active stream's place to a new
        stream when it has been idle ``replace_idle_seconds`` (active streams are never
        displaced: a flood of new names only takes the places of idle ones)."""
        if not self._streams or self.replace_idle_seconds < 0:
            return False
        st = next(iter(self._streams.values()))
        if self.now_ns - st.last_seen_ns < int(self.replace_idle_seconds * 1e9):
            return False
        self._remove(st, "replaced")
        return True

    def _remove(self, st: StreamState, reason: str) -> None:
        del self._streams[st.key]
        self._forget_calibration(st)
        self.removed[reason] += 1
        logger.info("stream %s removed (%s)", st.key, reason)

    def _forget_calibration(self, st: StreamState) -> None:
        if st.calibrating and st.calibration_job is not None:
            waiting = self._waiting.get(st.calibration_job.key)
            if waiting is not None:  # by identity: StreamState's == compares every field
                waiting[:] = [w for w in waiting if w is not st]

    # -- internals -------------------------------------------------------------------
    def _new_stream(self, key: StreamKey, learn: bool = False) -> StreamState:
        st = StreamState(key=key, last_seen_ns=self.now_ns)
        self._streams[key] = st
        self._streams.move_to_end(key)
        base = None if learn else self._file_baselines.get(key)
        origin = "file"
        if base is None and not learn:
            base = self._latest_frozen.get((key.agent, key.scenario))
            origin = "previous-version"
        if base is not None:
            self._freeze(st, base, origin, remember=False)
        else:
            st.builder = BaselineBuilder(key)
        return st

    def _freeze(self, st: StreamState, base: Baseline, origin: str,
                remember: bool = True) -> None:
        st.baseline = base
        st.baseline_origin = origin
        st.builder = None
        st.monitored_runs = 0
        if remember:
            # the newest last; bounded (4x the stream limit, oldest forgotten first) so
            # that names which come and go cannot grow it for ever
            self._latest_frozen.pop((base.key.agent, base.key.scenario), None)
            self._latest_frozen[(base.key.agent, base.key.scenario)] = base
            while len(self._latest_frozen) > 4 * self.max_streams:
                del self._latest_frozen[next(iter(self._latest_frozen))]
        sample = self._learned_sample(st, base) if origin == "learned" else None
        lat = (self._latency_sample(st) if sample is not None
               and len(st.latency_sample) == sample.shape[0] else None)
        st.sample, st.sample_tools = [], []
        st.latency_sample, st.latency_kinds = [], []
        job = self._calibration_job(base, sample, lat)
        th = self._thresholds.get(job.key)
        if th is not None:
            self.calibrations["cached"] += 1
        elif self.calibrator is None and job.key not in self._pending:
            th = self._computed(job, run_job(job))
        if th is not None:
            st.thresholds = th
            self._build_detectors(st)
            return
        st.calibrating = True
        st.calibration_job = job
        self._submit(st, job)

    # -- calibration -----------------------------------------------------------------
    def _keep_sample(self, st: StreamState, run: Run) -> None:
        """Reservoir sample (Algorithm R, seeded by the stream) of the learning runs'
        fingerprints, columns in tool discovery order as the builder learns them."""
        known = set(st.sample_tools)
        st.sample_tools.extend(sorted({t for t in run.tools_used if t not in known}))
        cap = self.config.calibration_runs
        n = st.builder.n_runs if st.builder is not None else len(st.sample) + 1
        if len(st.latency_sample) != len(st.sample):
            # a checkpoint from before the latency sums: no latency chart for this baseline
            st.latency_sample = []
            lat = None
        else:
            stats = latency.run_stats(run)
            known_kinds = set(st.latency_kinds)
            st.latency_kinds.extend(sorted(k for k in stats if k not in known_kinds))
            lat = latency.stats_vector(stats, st.latency_kinds)
        if len(st.sample) < cap:
            st.sample.append(fingerprint(run, st.sample_tools))
            if lat is not None:
                st.latency_sample.append(lat)
            return
        j = int(np.random.default_rng([n, _seed(st.key.as_labels())]).integers(0, n))
        if j < cap:
            st.sample[j] = fingerprint(run, st.sample_tools)
            if lat is not None and st.latency_sample:
                st.latency_sample[j] = lat

    def _learned_sample(self, st: StreamState, base: Baseline) -> np.ndarray | None:
        if len(st.sample) < 2:
            return None
        names = feature_names(st.sample_tools)
        width = len(names)
        rows = np.zeros((len(st.sample), width))
        for i, fp in enumerate(st.sample):
            rows[i, :fp.size] = fp  # tools discovered later: share 0 in earlier runs
        col = {name: j for j, name in enumerate(names)}
        out = np.zeros((rows.shape[0], len(base.feature_names)))
        for j, name in enumerate(base.feature_names):
            if name in col:
                out[:, j] = rows[:, col[name]]
        return out

    @staticmethod
    def _latency_sample(st: StreamState) -> tuple[list[str], np.ndarray] | None:
        """The latency chart's kinds for the sample and each sampled run's sums."""
        known = st.latency_kinds
        rows = np.zeros((len(st.latency_sample), latency.N_STATS * len(known)))
        for i, v in enumerate(st.latency_sample):
            rows[i, :v.size] = v  # kinds discovered later: no calls in earlier runs
        kinds = latency.choose_kinds(known, rows)
        if not kinds:
            return None
        cols = [known.index(k) * latency.N_STATS + j for k in kinds
                for j in range(latency.N_STATS)]
        return kinds, rows[:, cols]

    def _calibration_job(self, base: Baseline, sample: np.ndarray | None,
                         lat: tuple[list[str], np.ndarray] | None = None) -> CalibrationJob:
        cfg = self.config
        seed = int(base.baseline_id, 16) if base.baseline_id else 0
        source = "learned"
        if sample is None:
            sample = self._samples.get(base.baseline_id)
            source = "given"
        if sample is None:
            sample = _gaussian_sample(base, min(max(base.n_runs, 2), cfg.calibration_runs),
                                      seed)
            source = "gaussian"
        shares = self._shares(base)
        settings = CalibrationSettings(
            arl0=cfg.arl0, confidence=cfg.arl0_confidence, shares=shares,
            k=cfg.fingerprint_shift / 2, delta=cfg.delta, reps=cfg.bootstrap_reps,
            score_shift=self.score_shift,
            # swap charts on the call counts need real runs' fingerprints (toolcounts.py)
            tool_counts=source != "gaussian")
        data = BaselineData(mean=base.mean, cov=base.cov, n_runs=max(2, base.n_runs),
                            passes=base.passes, fails=base.fails, sample=sample,
                            feature_names=base.feature_names, evaluators=base.evaluators,
                            labels=base.labels,
                            latency_kinds=() if lat is None else tuple(lat[0]),
                            latency_sample=None if lat is None else lat[1])
        # A learned baseline and one given samples are calibrated on their runs: a later
        # stream on the same baseline id without runs (a new version) reuses that result.
        key = self._known_key(base.baseline_id, settings) if source == "gaussian" else None
        return CalibrationJob(
            key=key or cache_key(base.baseline_id, source, settings, int(sample.shape[0])),
            data=data, settings=settings, seed=seed, label=str(base.key))

    def _known_key(self, baseline_id: str, settings: CalibrationSettings) -> Any:
        """The key of a calibration of this baseline on its runs, cached or pending."""
        probe = cache_key(baseline_id, "", settings, 0)
        for key in list(self._pending) + [k for k, _ in self._thresholds.items()]:
            if (isinstance(key, tuple) and key[0] == baseline_id and key[1] != "gaussian"
                    and key[3:] == probe[3:]):
                return key
        return None

    def _computed(self, job: CalibrationJob, th: Thresholds) -> Thresholds:
        self.calibrations["computed"] += 1
        self._thresholds.put(job.key, th)
        return th

    def _submit(self, st: StreamState, job: CalibrationJob) -> None:
        waiting = self._waiting.setdefault(job.key, [])
        waiting.append(st)
        if job.key in self._pending:
            return  # the same baseline is being calibrated for another stream
        if self.calibrator is None:
            fut: Future[Thresholds] = Future()
            fut.set_result(run_job(job))
        else:
            fut = self.calibrator.submit(job)
        self._pending[job.key] = fut
        fut.add_done_callback(lambda _f: self._ready.set())

    def calibrations_ready(self) -> bool:
        """True when thresholds arrived that :meth:`apply_calibrations` has not applied
        (lock-free: the pipeline thread checks it before taking its lock)."""
        return self._ready.is_set() or bool(self._arrived)

    def apply_calibrations(self, budget_s: float | None = None) -> list[AlarmEvent]:
        """Build the detectors of the streams whose thresholds arrived and feed them
        their buffered runs, in order; stop after ``budget_s`` seconds (between two
        streams) and leave the rest for the next call. Returns the alarms raised."""
        self._ready.clear()
        for key in [k for k, f in self._pending.items() if f.done()]:
            fut = self._pending.pop(key)
            streams = self._waiting.pop(key, [])
            try:
                th = fut.result()
            except Exception as exc:  # a dead worker: the stream says why
                logger.error("calibration failed: %r", exc)
                th = Thresholds(None, None, disabled={
                    "cusum_pass_rate": f"calibration failed: {exc!r}",
                    "cusum_fingerprint": f"calibration failed: {exc!r}"})
            else:
                self.calibrations["computed"] += 1
                self._thresholds.put(key, th)
            self._arrived.extend((st, th) for st in streams)
        events: list[AlarmEvent] = []
        t0 = time.perf_counter()
        while self._arrived:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                break
            stream, th = self._arrived.popleft()
            if not stream.calibrating or self._streams.get(stream.key) is not stream:
                continue  # re-baselined meanwhile
            events.extend(self._finish(stream, th))
        return events

    def wait_calibrations(self, timeout: float | None = None) -> list[AlarmEvent]:
        """Wait for every submitted calibration and apply them all (``replay`` semantics
        for an engine with a worker; tests; a graceful stop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        events: list[AlarmEvent] = []
        while self._pending or self._arrived:
            for fut in list(self._pending.values()):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    fut.exception(timeout=left)
                except TimeoutError:
                    break
            events.extend(self.apply_calibrations())
            if deadline is not None and time.monotonic() >= deadline:
                break
        return events

    def _finish(self, st: StreamState, th: Thresholds) -> list[AlarmEvent]:
        st.thresholds = th
        st.calibrating = False
        st.calibration_job = None
        self._build_detectors(st)
        events: list[AlarmEvent] = []
        buffered, st.pending_runs = st.pending_runs, deque()
        for run, stream_run in buffered:
            events.extend(self._monitor(st, run, stream_run))
        scores, st.pending_scores = st.pending_scores, deque()
        for name, score, run_id, time_ns in scores:
            events.extend(self._raise(st, self._score(st, name, score), run_id, time_ns,
                                      None))
        return events

    # -- checkpoint ------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[Any, ...]:
        """What the service's checkpoint pickles: the streams (a calibrating one with its
        job and buffered runs), the latest frozen baselines, the drop counts and the
        calibrated thresholds."""
        return (dict(self._streams), dict(self._latest_frozen), dict(self.dropped),
                self._thresholds, {"removed": dict(self.removed), "now_ns": self.now_ns})

    def restore_state(self, state: tuple[Any, ...]) -> None:
        """Load :meth:`checkpoint_state` (a 3-tuple from before the thresholds were kept
        is accepted); a stream that was calibrating is calibrated again only when its
        thresholds are not in the restored cache."""
        self.load_streams(*state[:3])
        if len(state) > 3 and isinstance(state[3], ThresholdCache):
            for key, th in state[3].items():
                self._thresholds.put(key, th)
        if len(state) > 4 and isinstance(state[4], dict):
            self.removed.update(state[4].get("removed", {}))
            self.now_ns = max(self.now_ns, int(state[4].get("now_ns", 0)))
        for st in self._streams.values():
            job = st.calibration_job
            if not st.calibrating or job is None:
                continue
            th = self._thresholds.get(job.key)
            if th is not None:
                self.calibrations["cached"] += 1
                self._arrived.append((st, th))
            else:
                self._submit(st, job)

    def _build_detectors(self, st: StreamState) -> None:
        """The stream's SPRT and its watches (``engine/signals.py``), each alarming
        detector with its part of the ARL0 budget (:func:`watch_shares`)."""
        base = st.baseline
        assert base is not None
        cfg = self.config
        th = st.thresholds or Thresholds(None, None)
        decided = base.passes + base.fails
        evaluators = self._evaluator_signals(base)
        parts = watch_shares(self._shares(base), evaluators)
        st.sprt = self._new_sprt(st) if "sprt" in cfg.detectors and decided else None
        makers: dict[str, Callable[[float], Any]] = {}
        if "cusum_pass_rate" in cfg.detectors and th.pass_rate is not None:
            h_pass = th.pass_rate
            makers["cusum_pass_rate"] = lambda arl0: BernoulliCUSUM(
                th.pass_rate_p0, delta=cfg.delta, h=h_pass, arl0=arl0,
                baseline_runs=decided, baseline_passes=base.passes,
                confidence=th.confidence)
        if "cusum_fingerprint" in cfg.detectors and th.fingerprint is not None:
            h_fp = th.fingerprint
            makers["cusum_fingerprint"] = lambda arl0: MultichartCUSUM(
                mean=base.mean, cov=base.cov, k=cfg.fingerprint_shift / 2, h=h_fp,
                arl0=arl0, feature_names=list(base.feature_names),
                tool_counts=bool(getattr(th, "tool_counts", False)),
                latency=getattr(th, "latency", None),
                swap_ratios=getattr(th, "swap_ratios", None))
        watches: dict[str, Watch] = {}
        st.disabled = dict(th.disabled)
        for name, make in makers.items():
            try:
                watches[name] = new_watch(
                    name, make(cfg.arl0 / max(parts.get(name, 0.0), 1e-12)))
            except ValueError as exc:
                # e.g. a baseline too small or too perfect for the ARL0 target to be
                # reachable: the stream runs without this detector and says why
                st.disabled[name] = str(exc)
                logger.warning("%s: detector %s disabled: %s", st.key, name, exc)
        for name, why in th.disabled.items():
            logger.warning("%s: detector %s disabled: %s", st.key, name, why)
        st.watches = watches
        st.recent_outcomes = deque(maxlen=cfg.hotelling_window)
        st.recent_fps = deque(maxlen=cfg.hotelling_window)
        # An observed inventory is the baseline's own tools: nothing to measure against.
        observed = base.tool_inventory_source == "observed"
        st.coverage = CoverageTracker(tools=None if observed else base.tools,
                                      tool_source=base.tool_inventory_source)
        self._build_score_detectors(st, base, evaluators, parts)

    @staticmethod
    def _feed(st: StreamState, signal: str, x: Any) -> list[tuple[str, dict[str, Any]]]:
        """One observation of a signal to each of its watches; those that fired."""
        fired = []
        for watch in st.watches.values():
            if watch.signal == signal:
                evidence = watch.observe(x)
                if evidence is not None:
                    fired.append((watch.name, evidence))
        return fired

    def _outcome(self, st: StreamState, outcome: Outcome) -> list[tuple[str, dict[str, Any]]]:
        """Feed a run's pass/fail outcome to the pass-rate tests; the firing, if any."""
        if outcome is Outcome.UNKNOWN:
            return []
        passed = outcome is Outcome.PASS
        st.recent_outcomes.append(passed)
        sprt = st.sprt
        if sprt is not None:
            sprt.update(passed)
            if sprt.decision is not None:
                # a verdict, not an alarm (module docstring: one budget per stream)
                st.sprt_verdict = sprt.decision
                st.sprt = self._new_sprt(st)
        return self._feed(st, OUTCOME, passed)

    def _release_held(self, st: StreamState, now_ns: int
                      ) -> list[tuple[str, dict[str, Any]]]:
        """Runs whose late verdict did not come within the join window (by the runs' own
        clock: the end of the latest run), or beyond :data:`MAX_HELD`: their outcome at
        close goes to the pass-rate tests."""
        fired: list[tuple[str, dict[str, Any]]] = []
        window_ns = int(self.verdict_window_s * 1e9)
        while st.held:
            run_id, (outcome, end_ns) = next(iter(st.held.items()))
            if len(st.held) <= MAX_HELD and now_ns - end_ns < window_ns:
                break
            del st.held[run_id]
            self.dropped["late_verdict_missed"] += 1
            fired.extend(self._outcome(st, outcome))
        return fired

    def _evaluator_signals(self, base: Baseline) -> dict[str, ScoreSummary | LabelSummary]:
        """The evaluators of a baseline that get a watch: their score summaries, or label
        counts for those that only label."""
        if EVALUATION not in self.config.detectors:
            return {}
        return {**base.evaluators, **evaluator_labels(base.evaluators, base.labels)}

    def _build_score_detectors(self, st: StreamState, base: Baseline,
                               signals: Mapping[str, ScoreSummary | LabelSummary],
                               parts: Mapping[str, float]) -> None:
        """A watch per evaluator of the baseline (its scores' drop, ``detectors/score.py``,
        or its labels' shift, ``detectors/label.py``), each with its part of the
        ``evaluation`` share of the budget."""
        cfg = self.config
        for ev in st.evaluators.values():
            ev.disabled = ("not in the baseline (first scored after it froze); "
                           "re-baseline the stream to monitor it")
        if not signals:
            return
        n_alarming = len(parts)
        confidence = 1.0 - (1.0 - cfg.arl0_confidence) / max(1, n_alarming)
        calibrated = getattr(st.thresholds, "scores", None) or {}
        for name, summary in signals.items():
            ev = st.evaluators.get(name)
            if ev is None:
                ev = st.evaluators[name] = EvaluatorState(name)
            ev.disabled = ""
            share = parts.get(alarm_name(name), 0.0)
            if share <= 0:
                ev.disabled = "no share of the false-alarm budget (alarm_shares.evaluation)"
                continue
            try:
                if isinstance(summary, LabelSummary):
                    det: Any = LabelShiftCUSUM(summary, shift=self.score_shift,
                                               arl0=cfg.arl0 / share, confidence=confidence,
                                               h=calibrated.get(name))
                else:
                    det = ScoreDropCUSUM(summary, shift=self.score_shift,
                                         arl0=cfg.arl0 / share, confidence=confidence,
                                         h=calibrated.get(name))
            except ValueError as exc:
                ev.disabled = str(exc)
                logger.warning("%s: evaluator %s not monitored: %s", st.key, name, exc)
                continue
            st.watches[alarm_name(name)] = new_watch(alarm_name(name), det)

    def _count_score(self, st: StreamState, name: str, score: float | str) -> bool:
        ev = st.evaluators.get(name)
        if ev is None:
            if len(st.evaluators) >= MAX_EVALUATORS:
                self.dropped["evaluator_limit"] += 1
                return False
            ev = st.evaluators[name] = EvaluatorState(name)
            if st.baseline is not None and not st.calibrating:
                ev.disabled = ("not in the baseline (first scored after it froze); "
                               "re-baseline the stream to monitor it")
        ev.count += 1
        if not isinstance(score, str):  # a label has no mean
            ev.recent.append(score)
        return True

    def _score(self, st: StreamState, name: str, score: float | str
               ) -> list[tuple[str, dict[str, Any]]]:
        """Feed one score (or label) to its evaluator's watch; the firing, if any."""
        watch = st.watch_of(name)
        if watch is None:
            return []
        evidence = watch.observe(score)
        return [] if evidence is None else [(watch.name, evidence)]

    def _shares(self, base: Baseline) -> dict[str, float]:
        """The configured shares of the detectors this baseline can run (no pass-rate
        share without outcomes, no evaluation share without evaluators)."""
        cfg = self.config
        shares = {k: float(v) for k, v in cfg.alarm_shares.items()
                  if k in cfg.detectors and v > 0}
        if not base.passes + base.fails:
            shares.pop("cusum_pass_rate", None)
        if not base.evaluators and not evaluator_labels(base.evaluators, base.labels):
            shares.pop(EVALUATION, None)
        return shares

    def _share(self, name: str, base: Baseline) -> float:
        """The detector's normalised share of the ARL0 budget (0: it never alarms)."""
        return watch_shares(self._shares(base), ()).get(name, 0.0)

    def _new_sprt(self, st: StreamState) -> WarmStartSPRT:
        base = st.baseline
        assert base is not None
        cfg = self.config
        decided = base.passes + base.fails
        # H0 is "as good as the baseline"; the baseline's rate is an estimate, so the SPRT
        # keeps its one-sided lower confidence bound (level arl0_confidence) rather than the
        # point estimate, which a lucky baseline would push above the agent's true rate.
        lower = _wilson_lower(base.passes, decided, 1 - cfg.arl0_confidence) if decided else 0.5
        theta = _clamp_rate(lower, cfg.delta)
        same = st.baseline_origin != "previous-version"
        return WarmStartSPRT(
            theta=theta, delta=cfg.delta, alpha=cfg.alpha, beta=cfg.beta,
            n_max=cfg.sprt_max_runs, prior_passes=base.passes,
            prior_runs=base.passes + base.fails, same_version=same)

    def _monitor(self, st: StreamState, run: Run,
                 stream_run: int | None = None) -> list[AlarmEvent]:
        base = st.baseline
        assert base is not None
        cfg = self.config
        st.monitored_runs += 1
        fired: list[tuple[str, dict[str, Any]]] = []
        pre = self.__dict__.get("_prepared", {}).pop(id(run), None)
        watch = st.watches.get("cusum_fingerprint")
        if pre is not None and pre[0] is run and watch is not None and watch.detector is pre[1]:
            fp, x, parts = pre[2], pre[3], pre[4]
        else:
            fp, x, parts = self._features(st)(run)
        if st.coverage is not None:
            st.coverage.add(run, parts)
        judged = str(run.attributes.get(REASON_KEY, "")).startswith("evaluation")
        if st.late_verdicts and not judged:
            # the stream's judge answers after the run closes: wait for its verdict
            st.held[run.run_id] = (run.outcome, run.end_ns)
        else:
            fired.extend(self._outcome(st, run.outcome))
        fired.extend(self._release_held(st, run.end_ns))
        st.recent_fps.append(fp)
        fired.extend(self._feed(st, FINGERPRINT, x))
        if st.monitored_runs % cfg.hotelling_every == 0:
            # The status (the fingerprint verdict and shifts, the pass-rate verdict, the
            # budget) is refreshed at the Hotelling cadence from the window as it is now.
            # Only a reader needs it: the inputs are kept and the status computed when the
            # stream is next read (Engine.streams / stream / settle), the same numbers, at
            # most once per read instead of once per cadence. A Hotelling test with a share
            # of the budget can alarm: it alone runs now.
            rows = tuple(st.recent_fps) if len(st.recent_fps) >= 10 else None
            tested = False
            if rows is not None and "hotelling" in cfg.detectors \
                    and self._share("hotelling", base) > 0:
                tested = True
                ev_h = self._hotelling(st, np.array(rows), base)
                if ev_h is not None:
                    fired.append(("hotelling", ev_h))
            if st.status_due is None:
                self._due[st.key] = st
            st.status_due = (base, rows, sum(st.recent_outcomes), len(st.recent_outcomes),
                             tested)
        for name, score in run.scores.items():
            fired.extend(self._score(st, name, score))
        for name, label in run.labels.items():
            fired.extend(self._score(st, name, label))
        return self._raise(st, fired, run.run_id, run.end_ns,
                           st.n_runs if stream_run is None else stream_run)

    @staticmethod
    def _features(st: StreamState) -> RunFeatures:
        """What the stream's detectors read of a run (``features.py``): the fingerprint
        over the baseline's tools; what the fingerprint watch reads, the fingerprint then
        the run's latency sums when its chart has a latency chart
        (``detectors/latency.py``); the coverage tracker's parts."""
        assert st.baseline is not None
        watch = st.watches.get("cusum_fingerprint")
        kinds = getattr(watch.detector, "latency_kinds", ()) if watch is not None else ()
        return run_features(tuple(st.baseline.tools), tuple(kinds))

    def _raise(self, st: StreamState, fired: list[tuple[str, dict[str, Any]]], run_id: str,
               time_ns: int, stream_run: int | None) -> list[AlarmEvent]:
        """Book the detectors that fired on one run (or one late score) and return the
        onsets; ``on_alarm`` is called with each."""
        base = st.baseline
        assert base is not None
        cfg = self.config
        events = []
        for name, evidence in fired:
            # An onset is an alarm that was not already active: a persisting change keeps
            # it active (and counts each firing) without a new event per run.
            onset = name == "sprt" or not st.alarm_active(name, cfg.alarm_hold_runs)
            if name != "sprt":
                st.alarm_last[name] = st.monitored_runs
            st.alarms_total[name] += 1
            if onset:
                detector, evaluator = split_alarm_name(name)
                st.alarm_onsets[name] = {"run_index": st.monitored_runs,
                                         "time_ns": time_ns, "run_id": run_id,
                                         "moved": _moved(detector, evidence)}
                events.append(AlarmEvent(
                    key=st.key, detector=detector, run_index=st.monitored_runs,
                    stream_run=st.n_runs if stream_run is None else stream_run,
                    run_id=run_id, first_run_id=st.first_run_id,
                    baseline_id=base.baseline_id,
                    evidence={**_jsonable(evidence), "baseline_runs": base.n_runs,
                              "baseline_origin": st.baseline_origin},
                    evaluator=evaluator))
        if self.on_alarm is not None:
            for ev in events:
                try:
                    self.on_alarm(ev)
                except Exception:  # never let a sink failure stop the assay
                    logger.exception("alarm sink failed")
        return events

    def _settle(self, st: StreamState) -> StreamState:
        """The stream with its status refreshed if a refresh is due (see :meth:`_monitor`)."""
        due = st.status_due
        if due is not None:
            st.status_due = None
            self._due.pop(st.key, None)
            self._refresh_status(st, *due)
        return st

    def _refresh_status(self, st: StreamState, base: Baseline,
                        rows: tuple[np.ndarray, ...] | None, k_c: int, n_c: int,
                        tested: bool = False) -> None:
        """The status from the window as it was at the cadence: ``rows`` (its
        fingerprints, None under 10) and ``k_c`` passes of the ``n_c`` recent outcomes;
        ``tested``: the Hotelling test already ran at the cadence (it could alarm)."""
        # the window as a matrix, built once for the Hotelling test and the budget
        window = np.array(rows) if rows is not None else None
        if not tested and "hotelling" in self.config.detectors and window is not None:
            self._hotelling(st, window, base)  # no share of the budget: never an alarm
        # the regression verdict's exact power is the costly part: refreshed at the
        # Hotelling cadence rather than on every run
        self._pass_rate_verdict(st, base, k_c, n_c)
        self._recommend(st, base, window)

    def _hotelling(self, st: StreamState, recent: np.ndarray,
                   base: Baseline) -> dict[str, Any] | None:
        """The windowed test on ``recent``, the stacked ``st.recent_fps``."""
        cfg = self.config
        window = len(recent)
        if window < max(10, cfg.hotelling_window // 4):
            return None
        # One test every `hotelling_every` runs: alpha per test keeps the ARL0 share (0
        # by default: the test is then the fingerprint verdict and the shift gauges only).
        share = self._share("hotelling", base)
        alpha = min(0.05, cfg.hotelling_every * share / cfg.arl0)
        res = hotelling_two_sample(base.mean, base.cov, base.n_runs, recent,
                                   alpha=max(alpha, 1e-12), feature_names=base.feature_names)
        st.hotelling_p = float(res.p_value)
        st.fingerprint_shift = float(res.mahalanobis)
        st.feature_shift = dict(res.feature_shifts)
        verdict_alpha = cfg.alpha
        st.fingerprint_verdict = Verdict.FAIL if res.p_value < verdict_alpha else Verdict.PASS
        if share > 0 and window >= cfg.hotelling_window and res.p_value < alpha:
            return {"t2": float(res.t2), "p_value": float(res.p_value), "alpha": alpha,
                    "d_eff": int(res.d_eff), "window": window,
                    "moved": dict(list(res.feature_shifts)[:5])}
        return None

    def _recommend(self, st: StreamState, base: Baseline, recent: np.ndarray | None) -> None:
        """The adaptive budget n* (SPEC 7.2): candidate runs a pre-deploy check of this
        stream needs, the larger of the pass-rate design (Eq. 6 at the baseline's rate) and
        the fingerprint budget calibrated on the recent window, standardised by the
        baseline's sd, for a shift of ``fingerprint_shift`` sd."""
        cfg = self.config
        needs = []
        if base.passes + base.fails:
            p_b = _clamp_rate(base.pass_rate or 0.5, cfg.delta)
            needs.append(_sample_size(p_b, cfg.delta, cfg.alpha, cfg.beta))
        if recent is not None:  # the window when it holds >= 10 runs
            budget = adaptive_budget(recent, alpha=cfg.alpha, beta=cfg.beta,
                                     delta_min=cfg.fingerprint_shift, baseline_sd=base.sd)
            needs.append(int(budget.n_star))
        if needs:
            st.recommended_trials = max(needs)

    def _pass_rate_verdict(self, st: StreamState, base: Baseline, k_c: int, n_c: int) -> None:
        if n_c == 0 or base.passes + base.fails == 0:
            return
        cfg = self.config
        res = _regression_verdict(base.passes, base.passes + base.fails, k_c, n_c,
                                  cfg.alpha, cfg.beta, cfg.delta)
        st.pass_rate_verdict = res.verdict


#: Pure functions of a frozen baseline's numbers, called at every SPRT restart and every
#: Hotelling cadence: cached (their scipy quantiles cost far more than the look-up).
_sample_size = functools.lru_cache(maxsize=4096)(sample_size)
#: The recent window's verdict against the baseline: a pure function of six numbers, of
#: which only the window's pass count moves once the window is full (a stream revisits the
#: same few counts), so it is cached too.
_regression_verdict = functools.lru_cache(maxsize=16_384)(regression_verdict)


@functools.lru_cache(maxsize=4096)
def _wilson_lower(passes: int, n: int, alpha: float) -> float:
    return float(wilson_interval(passes, n, alpha, sided="lower")[0])


def _seed(labels: dict[str, str]) -> int:
    return zlib.crc32("\x1f".join(f"{k}={v}" for k, v in sorted(labels.items())).encode())


def _gaussian_sample(base: Baseline, n: int, seed: int) -> np.ndarray:
    """Gaussian draws with the baseline's mean and covariance: the calibration sample of a
    baseline that carries no runs."""
    lam, vec = np.linalg.eigh((base.cov + base.cov.T) / 2.0)
    z = np.random.default_rng(seed).standard_normal((n, lam.size))
    out: np.ndarray = base.mean + (z * np.sqrt(np.clip(lam, 0.0, None))) @ vec.T
    return out


def _moved(detector: str, evidence: Any) -> list[str]:
    """What the detector saw move, in a few words for the status page."""
    if not isinstance(evidence, dict):
        return []
    if detector == "cusum_fingerprint":
        charts = str(evidence.get("charts_alarmed", ""))
        return [c for c in charts.split(",") if c][:5]
    if detector == "cusum_pass_rate":
        return ["pass_rate"]
    if detector == EVALUATION:
        if "category" in evidence:  # a label shift: the category that gained
            return [f"{evidence.get('evaluator', '')} label {evidence['category']}"]
        return [f"{evidence.get('evaluator', '')} score"]
    moved = evidence.get("moved") or {}
    if isinstance(moved, dict):
        return [str(k) for k in sorted(moved, key=lambda k: -abs(float(moved[k])))][:5]
    return []


def _clamp_rate(p: float, delta: float) -> float:
    """Keep theta and theta - delta inside (0, 1) so the log-likelihood ratios are finite."""
    return float(min(max(p, delta + 0.01), 0.995))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return str(obj)
