"""A stream's state in the engine: what it learned, what its detectors hold, its alarms.

``StreamState`` is read by the exporters (metrics, status page) and written by
:class:`~assaywatch.monitor.engine.engine.Engine` only; ``AlarmEvent`` is one alarm onset
as written to the event log.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from assaywatch.analyzers.baseline import Baseline, BaselineBuilder
from assaywatch.analyzers.coverage import CoverageTracker
from assaywatch.analyzers.detectors.bootstrap import Thresholds
from assaywatch.analyzers.model import Outcome, Run, StreamKey, Verdict
from assaywatch.analyzers.verdicts import wilson_interval
from assaywatch.monitor.engine.calibration import CalibrationJob
from assaywatch.monitor.engine.signals import (
    EVALUATION,
    FINGERPRINT,
    OUTCOME,
    Watch,
    alarm_key,
    alarm_name,
    evaluator_signal,
    split_alarm_name,
)

__all__ = ["DETECTORS", "EVALUATION", "AlarmEvent", "EvaluatorState", "StreamState",
           "alarm_name", "split_alarm_name"]

DETECTORS = ("sprt", "cusum_pass_rate", "cusum_fingerprint", "hotelling")
#: The signal each detector of :data:`DETECTORS` with a watch takes.
_SIGNAL = {"cusum_pass_rate": OUTCOME, "cusum_fingerprint": FINGERPRINT}
#: The ``feature`` label of a detector's statistic where it is not the detector's name.
_STAT_LABEL = {"cusum_pass_rate": "pass_rate"}
#: The default budget split (``DetectorConfig.alarm_shares``) gives each alarming detector
#: half of the ARL0 budget; readers that show the Hotelling per-test alpha use this
#: divisor (the engine computes it from the configured shares).
_ARL_SHARES = 2


@dataclass
class AlarmEvent:
    """One alarm onset, with the evidence written to the event log."""

    key: StreamKey
    detector: str
    #: runs since the stream's baseline froze (1-based)
    run_index: int
    #: runs of the stream since it was first seen, baseline runs included (1-based)
    stream_run: int
    run_id: str
    first_run_id: str
    baseline_id: str
    evidence: dict[str, Any]
    #: the evaluator whose scores dropped (``detector == "evaluation"``), else ""
    evaluator: str = ""

    @property
    def alarm_key(self) -> str:
        """The alarm key of the watch that raised it (``engine/signals.py``): one episode
        of alarms per key, so two evaluators' alarms are two episodes."""
        return alarm_key(self.detector, self.evaluator)

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": "alarm",
            **self.key.as_labels(),
            "detector": self.detector,
            **({"evaluator": self.evaluator} if self.evaluator else {}),
            "run_index": self.run_index,
            "stream_run": self.stream_run,
            "run_id": self.run_id,
            "first_run_id": self.first_run_id,
            "baseline_id": self.baseline_id,
            "evidence": self.evidence,
        }


@dataclass
class EvaluatorState:
    """One evaluator's signal in a stream: its scores (its detector is the stream's watch
    ``evaluation:<name>``)."""

    name: str
    #: scores received (on the trace or late), learning included
    count: int = 0
    #: the most recent scores (the ``assaywatch_evaluation_score`` gauge is their mean)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    #: why the evaluator is not monitored ("" when it is)
    disabled: str = ""

    @property
    def recent_mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


@dataclass
class StreamState:
    key: StreamKey
    baseline: Baseline | None = None
    baseline_origin: str = ""
    builder: BaselineBuilder | None = None
    n_runs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    recent_outcomes: deque[bool] = field(default_factory=deque)
    recent_fps: deque[np.ndarray] = field(default_factory=deque)
    first_run_id: str = ""
    #: run index (1-based, within this stream) since the baseline froze
    monitored_runs: int = 0
    #: the alarming detectors by alarm key (``engine/signals.py``)
    watches: dict[str, Watch] = field(default_factory=dict)
    #: the pass-rate SPRT (a verdict, restarted after each decision; not a watch)
    sprt: Any = None
    alarm_last: dict[str, int] = field(default_factory=dict)
    alarms_total: Counter[str] = field(default_factory=Counter)
    sprt_verdict: Verdict | None = None
    sprt_active_fail: bool = False
    pass_rate_verdict: Verdict | None = None
    fingerprint_verdict: Verdict | None = None
    hotelling_p: float | None = None
    fingerprint_shift: float | None = None
    feature_shift: dict[str, float] = field(default_factory=dict)
    coverage: CoverageTracker | None = None
    recommended_trials: int | None = None
    #: a status refresh not computed yet (the inputs of ``Engine._refresh_status``: the
    #: baseline, the window's fingerprints, its passes and outcomes at the cadence, and
    #: whether the Hotelling test already ran then), done when the stream is next read
    #: through ``Engine.streams`` / ``Engine.stream`` / ``Engine.settle``
    status_due: tuple[Any, ...] | None = None
    #: the latest alarm onset of each detector: ``run_index``, ``time_ns`` (the end time of
    #: the run that raised it), ``run_id`` and ``moved`` (what the detector saw move)
    alarm_onsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: detectors that could not be built for this baseline, with the reason
    disabled: dict[str, str] = field(default_factory=dict)
    #: thresholds of the alarming detectors, calibrated on the baseline at its freeze
    thresholds: Thresholds | None = None
    #: while learning: reservoir sample of the runs' fingerprints (columns: FIXED features
    #: then ``sample_tools`` in discovery order) for the bootstrap calibration
    sample: list[np.ndarray] = field(default_factory=list)
    sample_tools: list[str] = field(default_factory=list)
    #: while learning: beside each sampled fingerprint, the run's per-kind latency sums
    #: (``detectors/latency.stats_vector`` over ``latency_kinds`` in discovery order, 6
    #: numbers a kind) for the latency chart
    latency_sample: list[np.ndarray] = field(default_factory=list)
    latency_kinds: list[str] = field(default_factory=list)
    #: True from the baseline's freeze until its thresholds arrive from the calibration
    #: worker: the detectors are not built yet and the runs wait in ``pending_runs``
    calibrating: bool = False
    #: while calibrating: the submitted job (kept so a restart can resubmit it)
    calibration_job: CalibrationJob | None = None
    #: while calibrating: (run, stream run number) in arrival order, fed to the detectors
    #: when the thresholds arrive
    pending_runs: deque[tuple[Run, int]] = field(default_factory=deque)
    #: a late evaluation carried a pass/fail verdict: runs not judged on the trace wait
    late_verdicts: bool = False
    #: runs waiting for their late verdict: run id -> (outcome at close, end time), in
    #: close order
    held: OrderedDict[str, tuple[Outcome, int]] = field(default_factory=OrderedDict)
    #: evaluator name -> its signal (at most ``MAX_EVALUATORS``)
    evaluators: dict[str, EvaluatorState] = field(default_factory=dict)
    #: while calibrating: late scores or labels (evaluator, value, run id, time) fed
    #: after the runs
    pending_scores: deque[tuple[str, float | str, str, int]] = field(default_factory=deque)
    #: when the stream's latest run was processed, by the engine's ``idle_clock`` (Unix
    #: ns: the run's end time in a replay, the wall clock in the monitor): idle expiry
    #: and the stream limit go by it
    last_seen_ns: int = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        _upgrade_detectors(state)
        # a checkpoint written before a field existed: the field's default
        for f in fields(self):
            if f.name not in state:
                if f.default_factory is not MISSING:
                    state[f.name] = f.default_factory()
                elif f.default is not MISSING:
                    state[f.name] = f.default
        self.__dict__.update(state)

    def alarm_active(self, detector: str, hold: int) -> bool:
        if detector == "sprt":
            return self.sprt_active_fail
        last = self.alarm_last.get(detector)
        return last is not None and self.monitored_runs - last < hold

    def alarm_keys(self, detectors: Iterable[str]) -> list[str]:
        """The alarm keys the stream reports: ``detectors`` (each has its series, 0 while
        it cannot run), then its other watches (the evaluators')."""
        keys = list(detectors)
        return keys + [w for w in self.watches if w not in keys]

    def watch_of(self, evaluator: str) -> Watch | None:
        """The watch of an evaluator's scores or labels, if it is monitored."""
        return self.watches.get(alarm_name(evaluator))


def new_watch(name: str, detector: Any) -> Watch:
    """The watch of ``detector`` under the alarm key ``name`` (a detector of
    :data:`DETECTORS` or ``evaluation:<evaluator>``)."""
    det, evaluator = split_alarm_name(name)
    signal = evaluator_signal(evaluator) if det == EVALUATION else _SIGNAL[det]
    return Watch(name, signal, detector, _STAT_LABEL.get(name, ""))


def _upgrade_detectors(state: dict[str, Any]) -> None:
    """A checkpoint from before watches (``detectors`` by name, each evaluator's detector
    on its EvaluatorState): the same detector objects, as watches."""
    old = state.pop("detectors", None)
    if old is None:
        return
    watches: dict[str, Watch] = {}
    state["sprt"] = old.get("sprt")
    for name, det in old.items():
        if name in _SIGNAL:
            watches[name] = new_watch(name, det)
    for ev in (state.get("evaluators") or {}).values():
        det = ev.__dict__.pop("detector", None)
        if det is not None:
            watches[alarm_name(ev.name)] = new_watch(alarm_name(ev.name), det)
    state["watches"] = watches


#: A stream's phases, in order (``assaywatch_stream_state``, the status page).
STREAM_STATES = ("learning", "calibrating", "monitoring")


def stream_state(st: StreamState) -> str:
    """``learning`` its baseline, ``calibrating`` its detectors (the baseline froze, the
    thresholds are on their way, runs are buffered in order) or ``monitoring``."""
    if st.calibrating:
        return "calibrating"
    return "learning" if st.baseline is None else "monitoring"


def close_order(run: Run) -> tuple[int, str]:
    return (run.end_ns, run.run_id)


def recent_pass_rate(st: StreamState, alpha: float = 0.05) -> tuple[float, float, float] | None:
    n = len(st.recent_outcomes)
    if n == 0:
        return None
    k = sum(st.recent_outcomes)
    lo, hi = wilson_interval(k, n, alpha)
    return k / n, lo, hi
