"""Generic behaviour every detector of assaywatch.analyzers.detectors must show."""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.detectors import (
    MEWMA,
    BernoulliCUSUM,
    Detector,
    FingerprintCUSUM,
    MultichartCUSUM,
    RiverDetector,
)

D = 4
COV = 0.5 * np.eye(D) + 0.5  # correlated features, unit variances


@dataclass
class Case:
    name: str
    make: Callable[[], Detector]
    constant: Any
    in_control: Callable[[np.random.Generator, int], list[Any]]
    shifted: Callable[[np.random.Generator, int], list[Any]]
    max_delay: int


def _bits(p: float) -> Callable[[np.random.Generator, int], list[Any]]:
    return lambda rng, n: [bool(b) for b in rng.random(n) < p]


def _vectors(shift: float) -> Callable[[np.random.Generator, int], list[Any]]:
    chol = np.linalg.cholesky(COV)
    return lambda rng, n: list(rng.standard_normal((n, D)) @ chol.T + shift)


def _floats(mu: float) -> Callable[[np.random.Generator, int], list[Any]]:
    return lambda rng, n: [float(v) for v in rng.normal(mu, 1.0, n)]


CASES = [
    Case(
        "bernoulli",
        lambda: BernoulliCUSUM(0.9, delta=0.1, arl0=10_000),
        True,
        _bits(0.9),
        _bits(0.6),
        200,
    ),
    Case(
        "fingerprint_cusum",
        lambda: FingerprintCUSUM(np.zeros(D), np.ones(D), arl0=10_000),
        np.zeros(D),
        _vectors(0.0),
        _vectors(1.0),
        200,
    ),
    Case(
        "mewma",
        lambda: MEWMA(np.zeros(D), COV, arl0=10_000),
        np.zeros(D),
        _vectors(0.0),
        _vectors(1.0),
        200,
    ),
    Case(
        "multichart",
        lambda: MultichartCUSUM(np.zeros(D), COV, arl0=10_000),
        np.zeros(D),
        _vectors(0.0),
        _vectors(1.0),
        200,
    ),
    Case("adwin", lambda: RiverDetector("adwin"), 0.5, _floats(0.0), _floats(2.0), 300),
    Case("kswin", lambda: RiverDetector("kswin", alpha=1e-5), 0.5, _floats(0.0), _floats(2.0), 300),
    Case(
        "page_hinkley", lambda: RiverDetector("page_hinkley"), 0.5, _floats(0.0), _floats(2.0), 300
    ),
]
IDS = [c.name for c in CASES]


def _feed(det: Detector, xs: list[Any]) -> tuple[list[float], list[int]]:
    stats, alarms = [], []
    for t, x in enumerate(xs):
        det.update(x)
        stats.append(det.statistic)
        if det.drift_detected:
            alarms.append(t)
    return stats, alarms


def _same(a: list[float], b: list[float]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_constant_in_control_stream_never_alarms(case: Case) -> None:
    det = case.make()
    _, alarms = _feed(det, [case.constant] * 3_000)
    assert alarms == [] and det.n == 3_000 and det.n_alarms == 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_detects_step_change_after_quiet_in_control_start(case: Case) -> None:
    rng = np.random.default_rng(11)
    det = case.make()
    # 300 in-control runs: at ARL0 10^4 a false alarm here has probability ~3 %, and the
    # seed is fixed; the river detectors are checked at their defaults.
    _, alarms = _feed(det, case.in_control(rng, 300) + case.shifted(rng, case.max_delay))
    assert alarms, "no alarm after the change"
    assert 300 <= alarms[0] < 300 + case.max_delay
    assert det.n_alarms == len(alarms)


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_restarts_after_alarm_and_fires_again_on_persisting_change(case: Case) -> None:
    """Frozen-baseline charts restart at zero and fire again while the change persists."""
    rng = np.random.default_rng(12)
    det = case.make()
    _, alarms = _feed(det, case.shifted(rng, 6 * case.max_delay))
    assert len(alarms) >= 2, "a persisting change must fire again after the restart"
    assert det.n_alarms == len(alarms)


@pytest.mark.parametrize("case", CASES[4:], ids=IDS[4:])
def test_river_detectors_rearm_and_catch_the_change_back(case: Case) -> None:
    """river's detectors compare the stream with its own past: after an alarm they adapt
    to the new level (no re-alarm while it persists) but catch the next change."""
    rng = np.random.default_rng(12)
    det = case.make()
    xs = case.in_control(rng, 400) + case.shifted(rng, 600) + case.in_control(rng, 600)
    _, alarms = _feed(det, xs)
    assert any(400 <= t < 1000 for t in alarms) and any(t >= 1000 for t in alarms)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reset_returns_to_fresh_state(case: Case) -> None:
    rng = np.random.default_rng(13)
    xs = case.in_control(rng, 200) + case.shifted(rng, 2 * case.max_delay)
    det = case.make()
    first = _feed(det, xs)
    assert det.n_alarms > 0
    det.reset()
    assert det.n == 0 and det.n_alarms == 0 and not det.drift_detected
    again = _feed(det, xs)
    assert _same(first[0], again[0]) and first[1] == again[1]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pickle_round_trip_continues_identically(case: Case) -> None:
    rng = np.random.default_rng(14)
    xs = case.in_control(rng, 200) + case.shifted(rng, case.max_delay)
    det = case.make()
    _feed(det, xs[:250])
    clone = pickle.loads(pickle.dumps(det))
    assert repr(clone) == repr(det) and clone.n == det.n
    a, b = _feed(det, xs[250:]), _feed(clone, xs[250:])
    assert _same(a[0], b[0]) and a[1] == b[1]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_repr_lists_constructor_args_and_evaluates_back(case: Case) -> None:
    det = case.make()
    text = repr(det)
    namespace = {c.__name__: c for c in (BernoulliCUSUM, FingerprintCUSUM, MEWMA,
                                        MultichartCUSUM, RiverDetector)}
    rebuilt = eval(text, namespace)  # noqa: S307 - our own repr, test only
    assert repr(rebuilt) == text
    assert _same([rebuilt.threshold], [det.threshold])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_checkpoint_resumes_exactly_without_realarming(case: Case) -> None:
    rng = np.random.default_rng(15)
    xs = case.in_control(rng, 500) + case.shifted(rng, 2 * case.max_delay)
    straight = case.make()
    full = _feed(straight, xs)
    det = case.make()
    _feed(det, xs[:500])
    blob = json.dumps(det.get_state())  # JSON-safe: survives SQLite as text
    resumed = case.make()
    resumed.set_state(json.loads(blob))
    assert resumed.n == 500 and resumed.statistic == pytest.approx(det.statistic, nan_ok=True)
    rest = _feed(resumed, xs[500:])
    assert _same(full[0][500:], rest[0])
    assert [t + 500 for t in rest[1]] == [t for t in full[1] if t >= 500]
    assert resumed.n_alarms == straight.n_alarms


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_evidence_is_json_safe_and_names_statistic_and_threshold(case: Case) -> None:
    rng = np.random.default_rng(16)
    det = case.make()
    _feed(det, case.shifted(rng, case.max_delay))
    ev = det.evidence()
    json.dumps(ev)
    assert {"statistic", "threshold", "arl0_target", "n", "n_alarms"} <= set(ev)
    assert all(isinstance(v, float | int | str) for v in ev.values())


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_statistic_reaches_threshold_exactly_when_alarm_fires(case: Case) -> None:
    rng = np.random.default_rng(17)
    det = case.make()
    for x in case.in_control(rng, 100) + case.shifted(rng, 3 * case.max_delay):
        det.update(x)
        assert det.drift_detected == (det.statistic >= det.threshold)


def test_checkpoint_of_another_detector_is_rejected() -> None:
    state = BernoulliCUSUM(0.9).get_state()
    with pytest.raises(ValueError, match="checkpoint is for detector 'BernoulliCUSUM'"):
        FingerprintCUSUM(np.zeros(2), np.ones(2)).set_state(state)
    other = FingerprintCUSUM(np.zeros(3), np.ones(3)).get_state()
    with pytest.raises(ValueError, match="shape"):
        FingerprintCUSUM(np.zeros(2), np.ones(2)).set_state(other)


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_batch_kernel_reproduces_scalar_updates(case: Case) -> None:
    """The vectorised kernel used for Monte Carlo is the detector's own recursion."""
    rng = np.random.default_rng(18)
    streams = [case.in_control(rng, 150) + case.shifted(rng, 400) for _ in range(3)]
    det = case.make()
    state = det._batch_init(3)  # type: ignore[attr-defined]
    batch = np.array(
        [
            det._batch_step(state, np.array(xs))  # type: ignore[attr-defined]
            for xs in zip(*streams, strict=True)
        ]
    )
    for r, xs in enumerate(streams):
        scalar = case.make()
        _, alarms = _feed(scalar, xs)
        assert alarms == list(np.flatnonzero(batch[:, r]))
        assert len(alarms) >= 1
