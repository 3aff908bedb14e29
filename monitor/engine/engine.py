"""The assay engine: assembled runs in, per-stream verdicts and alarms out.

Clock-free and deterministic: the live monitor and ``assaywatch replay`` both feed it runs
in the order they closed, so a replay of a recorded stream reproduces the live alarms.
Threading, receivers and persistence live in ``monitor/service/``.

Per stream (agent, version, scenario) it keeps a frozen baseline (from a file, learned from
the stream's first ``learn_runs`` runs, or — for a new version of an agent — the previous
version's frozen baseline) and, once the baseline is frozen, these detectors:

``sprt``
    Wald's SPRT on the pass rate, H0 p >= p_b against H1 p <= p_b - delta, restarted after
    every decision and warm-started safely from the baseline (SPEC.md 7.5). A Fail
    decision is an alarm; it stays active until the next Pass decision.
``cusum_pass_rate``
    Bernoulli likelihood-ratio CUSUM, threshold from the ARL0 target accounting for the
    baseline being an estimate from finite data.
``cusum_fingerprint``
    Standardised two-sided CUSUM per fingerprint feature, its threshold widened for the
    baseline being an estimate, plus a MEWMA on the projected fingerprint once the
    baseline has ``mewma_min_baseline`` runs (either one firing raises this alarm; the
    evidence says which).
``hotelling``
    Hotelling T^2 of the last ``hotelling_window`` runs against the baseline, every
    ``hotelling_every`` runs, at a per-test alpha that keeps the ARL0 share.

The ARL0 target is for the union of the stream's ARL-calibrated detectors: it is split in
time (Bonferroni) across the pass-rate CUSUM, the fingerprint CUSUM, the MEWMA and the
windowed Hotelling test, each getting ``4 * arl0``. The SPRT is governed by its own alpha
per decision cycle (``detectors.alpha``).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from assaywatch.analyzers.baseline import Baseline, BaselineBuilder
from assaywatch.analyzers.budget import adaptive_budget
from assaywatch.analyzers.coverage import CoverageTracker
from assaywatch.analyzers.detectors import MEWMA, BernoulliCUSUM, FingerprintCUSUM
from assaywatch.analyzers.fingerprint import fingerprint
from assaywatch.analyzers.hotelling import hotelling_two_sample
from assaywatch.analyzers.model import Outcome, Run, StreamKey, Verdict
from assaywatch.analyzers.sprt import WarmStartSPRT
from assaywatch.analyzers.verdicts import regression_verdict, sample_size, wilson_interval
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.streams import _ARL_SHARES, AlarmEvent, StreamState, close_order

logger = logging.getLogger(__name__)

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
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        baselines: Iterable[Baseline] = (),
        on_alarm: Callable[[AlarmEvent], None] | None = None,
        max_streams: int = 1_000,
    ) -> None:
        self.config = config or DetectorConfig()
        self.on_alarm = on_alarm
        self.max_streams = max_streams
        self.dropped: Counter[str] = Counter()
        self._streams: dict[StreamKey, StreamState] = {}
        self._file_baselines = {b.key: b for b in baselines}
        #: agent+scenario -> the most recently frozen baseline, for new versions
        self._latest_frozen: dict[tuple[str, str], Baseline] = {}
        for b in self._file_baselines.values():
            self._latest_frozen[(b.key.agent, b.key.scenario)] = b

    # -- reading ---------------------------------------------------------------------
    def streams(self) -> list[StreamState]:
        return list(self._streams.values())

    def stream(self, key: StreamKey) -> StreamState | None:
        return self._streams.get(key)

    # -- feeding ---------------------------------------------------------------------
    def process(self, run: Run) -> list[AlarmEvent]:
        """Account one closed run; return the alarms it raised."""
        st = self._streams.get(run.key)
        if st is None:
            if len(self._streams) >= self.max_streams:
                self.dropped["stream_limit"] += 1
                return []
            st = self._new_stream(run.key)
        st.n_runs += 1
        st.outcomes[run.outcome.value] += 1
        if not st.first_run_id:
            st.first_run_id = run.run_id
        if st.baseline is None:
            assert st.builder is not None
            st.builder.add(run)
            if st.builder.n_runs >= self.config.learn_runs:
                self._freeze(st, st.builder.freeze(), "learned")
            return []
        return self._monitor(st, run)

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
        self._streams[key] = self._new_stream(key, learn=True)
        return True

    # -- internals -------------------------------------------------------------------
    def _new_stream(self, key: StreamKey, learn: bool = False) -> StreamState:
        st = StreamState(key=key)
        self._streams[key] = st
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
            self._latest_frozen[(base.key.agent, base.key.scenario)] = base
        self._build_detectors(st)

    def _build_detectors(self, st: StreamState) -> None:
        base = st.baseline
        assert base is not None
        cfg = self.config
        share = cfg.arl0 * _ARL_SHARES
        decided = base.passes + base.fails
        sd = np.sqrt(np.clip(np.diag(base.cov), 0.0, None))
        makers: dict[str, Callable[[], Any]] = {}
        if "sprt" in cfg.detectors and decided:
            makers["sprt"] = lambda: self._new_sprt(st)
        if "cusum_pass_rate" in cfg.detectors and decided:
            makers["cusum_pass_rate"] = lambda: BernoulliCUSUM.from_baseline(
                decided, base.passes, delta=cfg.delta, arl0=share,
                confidence=cfg.arl0_confidence)
        if "cusum_fingerprint" in cfg.detectors:
            makers["cusum_fingerprint"] = lambda: FingerprintCUSUM(
                mean=base.mean, sd=sd, k=cfg.fingerprint_shift / 2, arl0=share,
                feature_names=list(base.feature_names), baseline_runs=max(3, base.n_runs),
                confidence=cfg.arl0_confidence)
            if base.n_runs >= cfg.mewma_min_baseline:
                makers["mewma"] = lambda: MEWMA(mean=base.mean, cov=base.cov, arl0=share)
        dets: dict[str, Any] = {}
        st.disabled = {}
        for name, make in makers.items():
            try:
                dets[name] = make()
            except ValueError as exc:
                # e.g. a baseline too small or too perfect for the ARL0 target to be
                # reachable: the stream runs without this detector and says why
                st.disabled[name] = str(exc)
                logger.warning("%s: detector %s disabled: %s", st.key, name, exc)
        st.detectors = dets
        st.recent_outcomes = deque(maxlen=cfg.hotelling_window)
        st.recent_fps = deque(maxlen=cfg.hotelling_window)
        # An observed inventory is the baseline's own tools: nothing to measure against.
        observed = base.tool_inventory_source == "observed"
        st.coverage = CoverageTracker(tools=None if observed else base.tools,
                                      tool_source=base.tool_inventory_source)

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

    def _monitor(self, st: StreamState, run: Run) -> list[AlarmEvent]:
        base = st.baseline
        assert base is not None
        cfg = self.config
        st.monitored_runs += 1
        fired: list[tuple[str, dict[str, Any]]] = []
        fp = fingerprint(run, base.tools)
        if st.coverage is not None:
            st.coverage.add(run)
        decided = run.outcome is not Outcome.UNKNOWN
        passed = run.outcome is Outcome.PASS
        if decided:
            st.recent_outcomes.append(passed)
            sprt = st.detectors.get("sprt")
            if sprt is not None:
                sprt.update(passed)
                if sprt.decision is not None:
                    st.sprt_verdict = sprt.decision
                    if sprt.decision is Verdict.FAIL:
                        if not st.sprt_active_fail:
                            fired.append(("sprt", {"llr": sprt.llr, "upper": sprt.upper,
                                                   "lower": sprt.lower, "n": sprt.n}))
                        st.sprt_active_fail = True
                    elif sprt.decision is Verdict.PASS:
                        st.sprt_active_fail = False
                    st.detectors["sprt"] = self._new_sprt(st)
            cusum = st.detectors.get("cusum_pass_rate")
            if cusum is not None:
                cusum.update(passed)
                if cusum.drift_detected:
                    fired.append(("cusum_pass_rate", cusum.evidence()))
        st.recent_fps.append(fp)
        fpc = st.detectors.get("cusum_fingerprint")
        if fpc is not None:
            fpc.update(fp)
            mewma = st.detectors.get("mewma")
            if mewma is not None:
                mewma.update(fp)
            if fpc.drift_detected or (mewma is not None and mewma.drift_detected):
                ev = {"statistic": "fingerprint_cusum" if fpc.drift_detected else "mewma",
                      "cusum": fpc.evidence()}
                if mewma is not None:
                    ev["mewma"] = mewma.evidence()
                fired.append(("cusum_fingerprint", ev))
        due = st.monitored_runs % cfg.hotelling_every == 0
        # The window as a matrix, built once for the Hotelling test and the budget (both
        # run at the Hotelling cadence only).
        window = np.array(st.recent_fps) if due and len(st.recent_fps) >= 10 else None
        if "hotelling" in cfg.detectors and window is not None:
            ev_h = self._hotelling(st, window)
            if ev_h is not None:
                fired.append(("hotelling", ev_h))
        if due:
            # the regression verdict's exact power is the costly part: refresh it at the
            # Hotelling cadence rather than on every run
            self._pass_rate_verdict(st, base)
            self._recommend(st, base, window)
        events = []
        for name, evidence in fired:
            # An onset is an alarm that was not already active: a persisting change keeps
            # it active (and counts each firing) without a new event per run.
            onset = name == "sprt" or not st.alarm_active(name, cfg.alarm_hold_runs)
            if name != "sprt":
                st.alarm_last[name] = st.monitored_runs
            st.alarms_total[name] += 1
            if onset:
                events.append(AlarmEvent(
                    key=st.key, detector=name, run_index=st.monitored_runs,
                    stream_run=st.n_runs,
                    run_id=run.run_id, first_run_id=st.first_run_id,
                    baseline_id=base.baseline_id,
                    evidence={**_jsonable(evidence), "baseline_runs": base.n_runs,
                              "baseline_origin": st.baseline_origin}))
        if self.on_alarm is not None:
            for ev in events:
                try:
                    self.on_alarm(ev)
                except Exception:  # never let a sink failure stop the assay
                    logger.exception("alarm sink failed")
        return events

    def _hotelling(self, st: StreamState, recent: np.ndarray) -> dict[str, Any] | None:
        """The windowed test on ``recent``, the stacked ``st.recent_fps``."""
        cfg = self.config
        base = st.baseline
        assert base is not None
        window = len(recent)
        if window < max(10, cfg.hotelling_window // 4) or st.monitored_runs % cfg.hotelling_every:
            return None
        # One test every `hotelling_every` runs: alpha per test keeps the ARL0 share.
        alpha = min(0.05, cfg.hotelling_every / (cfg.arl0 * _ARL_SHARES))
        res = hotelling_two_sample(base.mean, base.cov, base.n_runs, recent,
                                   alpha=alpha, feature_names=base.feature_names)
        st.hotelling_p = float(res.p_value)
        st.fingerprint_shift = float(res.mahalanobis)
        st.feature_shift = dict(res.feature_shifts)
        verdict_alpha = cfg.alpha
        st.fingerprint_verdict = Verdict.FAIL if res.p_value < verdict_alpha else Verdict.PASS
        if window >= cfg.hotelling_window and res.p_value < alpha:
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

    def _pass_rate_verdict(self, st: StreamState, base: Baseline) -> None:
        n_c = len(st.recent_outcomes)
        if n_c == 0 or base.passes + base.fails == 0:
            return
        k_c = sum(st.recent_outcomes)
        cfg = self.config
        res = regression_verdict(base.passes, base.passes + base.fails, k_c, n_c,
                                 alpha=cfg.alpha, beta=cfg.beta, delta=cfg.delta)
        st.pass_rate_verdict = res.verdict


#: Pure functions of a frozen baseline's numbers, called at every SPRT restart and every
#: Hotelling cadence: cached (their scipy quantiles cost far more than the look-up).
_sample_size = functools.lru_cache(maxsize=4096)(sample_size)


@functools.lru_cache(maxsize=4096)
def _wilson_lower(passes: int, n: int, alpha: float) -> float:
    return float(wilson_interval(passes, n, alpha, sided="lower")[0])


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
