"""Categorical-label CUSUM (``label.py``): the baseline summary, the charts' increments on
hand-computed values, the analytic and calibrated thresholds, and Monte Carlo checks of
the in-control ARL0 and the delay on baselines learned from a known truth.

The simulation helpers here are shared with ``tests/benchmarks/bench_labels.py``."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from scipy import special

from assaywatch.analyzers.detectors.label import (
    MAX_LABELS,
    OTHER,
    LabelShiftCUSUM,
    LabelSummary,
    label_threshold,
)

F64 = np.ndarray

#: Worlds: (labels, true probabilities, the label a regression moves mass onto).
THREE = (["correct", "partially_correct", "incorrect"], np.array([0.7, 0.2, 0.1]),
         "incorrect")
#: A lumpy judge: almost always "correct", a few rare labels.
LUMPY = (["correct", "partially_correct", "incorrect", "refused", "error"],
         np.array([0.95, 0.02, 0.015, 0.01, 0.005]), "incorrect")


# -- simulation helpers (vectorised over baselines x streams) ------------------------------
def shifted(probs: F64, j: int, d: float) -> F64:
    """The law with ``d`` of probability moved onto category j, the others scaled down in
    proportion (total variation d)."""
    q = probs * (1.0 - d / (1.0 - probs[j]))
    q[j] = probs[j] + d
    return q


def learn(labels: Sequence[str], probs: F64, n_b: int, baselines: int,
          rng: np.random.Generator, *, arl0: float, shift: float = 0.1,
          calibrated: bool = True, confidence: float = 0.95, reps: int = 300,
          plain: bool = False) -> list[LabelShiftCUSUM]:
    """One detector per baseline of ``n_b`` labels drawn from the truth."""
    dets = []
    for _ in range(baselines):
        summary = LabelSummary(dict(zip(labels, rng.multinomial(n_b, probs).tolist(),
                                        strict=True)))
        h = (label_threshold(summary, shift, arl0, confidence, reps, rng, plain=plain)
             if calibrated else None)
        dets.append(LabelShiftCUSUM(summary, shift=shift, arl0=arl0,
                                    confidence=None if plain else confidence, h=h))
    return dets


def tables(dets: Sequence[LabelShiftCUSUM], labels: Sequence[str]) -> F64:
    """(B, Kmax, L): chart j of detector b's log-LR of a label of world label i (charts
    padded with a constant -1)."""
    kmax = max(len(d.labels) for d in dets)
    out = np.full((len(dets), kmax, len(labels)), -1.0)
    for b, d in enumerate(dets):
        cols = [d.category(x) for x in labels]
        out[b, : len(d.labels)] = d.increments()[:, cols]
    return out


def _alarms(tab: F64, h: F64, probs: F64, streams: int, rng: np.random.Generator
            ) -> Iterator[np.ndarray]:
    """Label after label drawn from ``probs``, which of the ``streams`` copies of each
    detector (rows of ``tab``, thresholds ``h``) alarm; an alarming copy restarts."""
    t = np.repeat(tab, streams, axis=0)
    n = t.shape[0]
    w = np.zeros(t.shape[:2])
    hh = np.repeat(h, streams)
    rows = np.arange(n)
    cdf = np.cumsum(probs)
    while True:
        x = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), probs.size - 1)
        w = np.maximum(0.0, w + t[rows, :, x])
        hit = w.max(axis=1) >= hh
        w[hit] = 0.0
        yield hit


def incontrol_rate(tab: F64, h: F64, probs: F64, streams: int, steps: int,
                   rng: np.random.Generator) -> F64:
    """Alarms per label for each baseline (``streams`` streams of ``steps`` labels, the
    detector restarted after an alarm: a renewal process whose rate is 1 / ARL0)."""
    alarms = np.zeros(tab.shape[0] * streams)
    for _, hit in zip(range(steps), _alarms(tab, h, probs, streams, rng), strict=False):
        alarms += hit
    rate: F64 = alarms.reshape(-1, streams).sum(axis=1) / (streams * steps)
    return rate


def first_alarms(tab: F64, h: F64, probs: F64, streams: int, rng: np.random.Generator,
                 cap: int = 5_000) -> F64:
    """Zero-start run lengths (labels up to and including the alarm), ``streams`` per
    detector, censored at ``cap``."""
    out = np.full(tab.shape[0] * streams, float(cap))
    open_ = np.ones(out.size, dtype=bool)
    for step, hit in zip(range(1, cap + 1), _alarms(tab, h, probs, streams, rng),
                         strict=False):
        first = open_ & hit
        out[first] = step
        open_ &= ~first
        if not open_.any():
            break
    return out


def wald_bound(det: LabelShiftCUSUM, label: str, post: float) -> float:
    """Upper bound of the mean zero-start delay when ``label``'s rate is ``post``: its
    chart's walk has drift mu = post up + (1 - post) down > 0 and overshoots h by less
    than up, so by Wald's identity its first passage has mean at most (h + up) / mu; the
    reflection at 0 and the other charts only make the alarm sooner."""
    j = det.labels.index(label)
    up, down = det.increments()[j, j], det.increments()[j, (j + 1) % len(det.labels)]
    mu = post * up + (1.0 - post) * down
    assert mu > 0
    return float((det.h + up) / mu)


# -- LabelSummary ---------------------------------------------------------------------------
def test_summary_counts_and_categories() -> None:
    s = LabelSummary.from_labels(["safe", "unsafe", "safe", None, "safe"])
    assert s.counts == {"safe": 3, "unsafe": 1} and s.n == 4
    assert s.categories() == ["safe", "unsafe", OTHER]
    labels, p = s.probabilities(0.5)
    # (3.5, 1.5, 0.5) / 5.5: "other" is a category with a positive rate though never seen
    assert labels == ["safe", "unsafe", OTHER]
    assert p.tolist() == pytest.approx([3.5 / 5.5, 1.5 / 5.5, 0.5 / 5.5])


def test_summary_folds_beyond_max_labels() -> None:
    # 20 labels l00..l19 with counts 20..1: 15 kept (the most frequent), 5 folded
    counts = {f"l{i:02d}": 20 - i for i in range(20)}
    s = LabelSummary(counts)
    assert MAX_LABELS == 16 and len(s.counts) == 16
    assert s.counts[OTHER] == 5 + 4 + 3 + 2 + 1
    assert all(s.counts[f"l{i:02d}"] == 20 - i for i in range(15))
    assert s.n == sum(counts.values()) == 210
    assert len(s.categories()) == 16
    # a judge's own "other" joins the folded labels; ties at the cut go by name
    s2 = LabelSummary({**{f"m{i:02d}": 1 for i in range(17)}, OTHER: 4})
    assert sorted(s2.counts) == sorted([f"m{i:02d}" for i in range(15)] + [OTHER])
    assert s2.counts[OTHER] == 4 + 2
    # exactly 15 named labels: nothing folded, "other" added as the 16th category
    s3 = LabelSummary({f"k{i}": 1 for i in range(15)})
    assert OTHER not in s3.counts and len(s3.categories()) == 16


def test_summary_round_trips_through_json() -> None:
    s = LabelSummary({f"l{i:02d}": 20 - i for i in range(20)})
    d = json.loads(json.dumps(s.to_dict()))
    assert d["n"] == 210
    assert LabelSummary.from_dict(d) == s
    assert LabelSummary.from_dict({"counts": {}}).n == 0
    with pytest.raises(ValueError):
        LabelSummary({"a": -1})


# -- the detector on hand-computed values ---------------------------------------------------
def test_increments_of_a_two_label_baseline_by_hand() -> None:
    # counts a=6, b=2, smoothing 1/2 over (a, b, other): p0 = (13, 5, 1) / 19
    s = LabelSummary({"a": 6, "b": 2})
    det = LabelShiftCUSUM(s, shift=0.1, arl0=1_000, confidence=None)
    assert det.labels == ["a", "b", OTHER]
    assert det.p0.tolist() == pytest.approx([13 / 19, 5 / 19, 1 / 19])
    # the alternative of chart b: b at 5/19 + 0.1, a and other scaled by (1 - r_b)/(1 - p_b)
    p0 = {"a": 13 / 19, "b": 5 / 19, OTHER: 1 / 19}
    r_b = 5 / 19 + 0.1
    p_b = {"a": 13 / 19 * (1 - r_b) / (14 / 19), "b": r_b,
           OTHER: 1 / 19 * (1 - r_b) / (14 / 19)}
    assert sum(p_b.values()) == pytest.approx(1.0)
    det.update("b")
    assert det.charts[1] == pytest.approx(math.log(p_b["b"] / p0["b"]))
    assert det.statistic == pytest.approx(math.log(1 + 1.9 / 5))  # 0.3221
    assert det.charts[0] == 0.0 and det.charts[2] == 0.0  # negative steps floored at 0
    det.update("b")
    assert det.statistic == pytest.approx(2 * math.log(1.38))  # 0.6442
    det.update("a")
    # chart b: + log(p_b(a) / p0(a)) = log(1 - 1.9 / 14); chart a: log(1 + 1.9 / 13)
    assert math.log(p_b["a"] / p0["a"]) == pytest.approx(math.log(1 - 1.9 / 14))
    assert det.charts[1] == pytest.approx(2 * math.log(1.38) + math.log(1 - 1.9 / 14))
    assert det.charts[0] == pytest.approx(math.log(1 + 1.9 / 13))
    assert det.statistic == pytest.approx(0.64417 - 0.14585, abs=1e-5)  # 0.4983
    assert det.n == 3 and not det.drift_detected
    ev = det.evidence()
    assert ev["category"] == "b" and ev["threshold"] == pytest.approx(math.log(3_000))
    assert ev["baseline_probabilities"]["b"] == pytest.approx(5 / 19)
    det.reset()
    assert det.statistic == 0.0 and det.charts == [0.0, 0.0, 0.0]


def test_unseen_label_counts_as_other() -> None:
    det = LabelShiftCUSUM(LabelSummary({"a": 6, "b": 2}), shift=0.1, confidence=None)
    assert det.category("never seen") == det.category(OTHER) == 2
    det.update("never seen")
    # other: 1/19 -> 1/19 + 0.1: up by log(1 + 1.9)
    assert det.charts[2] == pytest.approx(math.log(2.9))
    assert det.evidence()["category"] == OTHER


def test_robust_null_is_the_clopper_pearson_upper_bound() -> None:
    # 1,000 labels, 100 "incorrect"; K = 3 categories at confidence 0.95: each bound at
    # 1 - 0.05/3; the Clopper-Pearson upper bound is the Beta(101, 900) quantile (0.1221)
    s = LabelSummary({"correct": 900, "incorrect": 100})
    det = LabelShiftCUSUM(s, shift=0.1, arl0=500, confidence=0.95)
    j = det.labels.index("incorrect")
    u = float(special.betaincinv(101, 900, 1 - 0.05 / 3))
    assert det.null[j] == pytest.approx(u) and u == pytest.approx(0.1221, abs=5e-4)
    # alternative: the estimate (100.5 / 1001.5) plus the shift
    assert det.alt[j] == pytest.approx(100.5 / 1001.5 + 0.1)
    det.update("incorrect")
    assert det.charts[j] == pytest.approx(math.log(det.alt[j] / u))
    # the analytic threshold: log(K arl0)
    assert det.h == det.analytic_h == pytest.approx(math.log(3 * 500))
    # a category holding every baseline label cannot rise: its chart is off
    solid = LabelShiftCUSUM(LabelSummary({"ok": 50}), confidence=0.95)
    for _ in range(1_000):
        solid.update("ok")
    assert solid.charts[0] == 0.0 and not solid.drift_detected


def test_baseline_proportions_never_alarm() -> None:
    # labels in exactly the baseline's proportions, 10,000 of them: every chart's drift is
    # negative (each category at or below its null rate), the statistic stays bounded
    det = LabelShiftCUSUM(LabelSummary({"correct": 700, "partially_correct": 200,
                                        "incorrect": 100}), arl0=500)
    cycle = ["correct"] * 7 + ["partially_correct"] * 2 + ["incorrect"]
    top = 0.0
    for _ in range(1_000):
        for x in cycle:
            det.update(x)
            top = max(top, det.statistic)
    assert not det.drift_detected and top < det.h


def test_constructor_rejects_bad_settings() -> None:
    s = LabelSummary({"a": 3})
    for kwargs in ({"shift": 0.0}, {"shift": 1.0}, {"arl0": 1.0}, {"confidence": 1.0}):
        with pytest.raises(ValueError):
            LabelShiftCUSUM(s, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LabelShiftCUSUM(LabelSummary({}))


# -- thresholds ----------------------------------------------------------------------------
def test_calibrated_threshold_is_below_the_analytic_one_and_monotone_in_arl0() -> None:
    rng = np.random.default_rng(11)
    for labels, probs, _ in (THREE, LUMPY):
        s = LabelSummary(dict(zip(labels, rng.multinomial(1_000, probs).tolist(),
                                  strict=True)))
        k = len(s.categories())
        hs = []
        for arl0 in (100.0, 500.0, 10_000.0, 1e6):
            h = label_threshold(s, 0.1, arl0, 0.95, 300, np.random.default_rng(3))
            assert 0.0 < h <= math.log(k * arl0)
            hs.append(h)
        assert hs == sorted(hs) and hs[0] < hs[-1]
        # the detector keeps the smaller of a given threshold and the analytic one
        det = LabelShiftCUSUM(s, arl0=500, h=100.0)
        assert det.h == det.analytic_h


def test_one_label_never_alarms_on_its_own() -> None:
    # 200 labels, none unseen: the "other" chart's step is log(r / u) with u the
    # Clopper-Pearson bound of 0 in 200 at 1 - 0.05/3 (0.0202) and r = 0.1 + 0.5/201.5:
    # about 1.63 nats; the calibrated threshold stays above every single step
    s = LabelSummary({"safe": 180, "unsafe": 20})
    h = label_threshold(s, 0.1, 500, 0.95, 300, np.random.default_rng(2))
    det = LabelShiftCUSUM(s, arl0=500, h=h)
    steps = np.diag(det.increments())
    assert steps.max() == pytest.approx(math.log((0.1 + 0.5 / 201.5) / 0.0202), abs=0.01)
    assert h > steps.max()
    det.update("a label never seen")
    assert not det.drift_detected


def test_label_threshold_runs_well_under_a_second() -> None:
    rng = np.random.default_rng(5)
    labels = [f"l{i:02d}" for i in range(20)]
    probs = np.r_[0.6, np.full(19, 0.4 / 19)]
    s = LabelSummary(dict(zip(labels, rng.multinomial(2_000, probs).tolist(), strict=True)))
    assert len(s.categories()) == MAX_LABELS
    t0 = time.perf_counter()
    label_threshold(s, 0.1, 10_000, 0.95, 300, rng)
    assert time.perf_counter() - t0 < 0.5


# -- Monte Carlo: in-control ARL0 and delay ------------------------------------------------
ARL0 = 500.0


@pytest.mark.parametrize("world, n_b", [(THREE, 500), (LUMPY, 1_000)])
def test_incontrol_false_alarm_rate_is_within_the_budget(
        world: tuple[list[str], F64, str], n_b: int) -> None:
    """40 baselines of ``n_b`` labels from the truth, 40 streams x 5,000 labels each
    (10 arl0), restarted after an alarm: alarms per label estimate 1/ARL0. The average over
    baselines must be at most 1/arl0 up to 3 standard errors (the spread over baselines
    dominates the Monte Carlo error; at the target the 8 million labels would give ~16,000
    alarms, 0.8 % Poisson error). Measured: 0.18 and 0.46 / arl0 calibrated (se 0.01 and
    0.03; the 95 % bootstrap order statistic and a conservative union), below 0.001 /
    arl0 with the analytic threshold log(K arl0)."""
    labels, probs, _ = world
    rng = np.random.default_rng(21 + n_b)
    dets = learn(labels, probs, n_b, 40, rng, arl0=ARL0)
    tab = tables(dets, labels)
    rate = incontrol_rate(tab, np.array([d.h for d in dets]), probs, 40, 5_000, rng)
    se = rate.std(ddof=1) / math.sqrt(rate.size)
    assert rate.mean() <= 1.0 / ARL0 + 3 * se
    analytic = incontrol_rate(tab, np.array([d.analytic_h for d in dets]), probs, 10,
                              5_000, rng)
    assert analytic.mean() * ARL0 < 0.01


@pytest.mark.parametrize("world, n_b, figure", [(THREE, 500, 80.0), (LUMPY, 1_000, 40.0)])
def test_a_shift_onto_incorrect_is_detected_quickly(
        world: tuple[list[str], F64, str], n_b: int, figure: float) -> None:
    """0.15 of probability moved onto "incorrect" (0.1 -> 0.25; 0.015 -> 0.165), zero start.

    The figure: by Wald's identity the "incorrect" chart alone reaches h after at most
    (h + up) / mu labels on average (:func:`wald_bound`; the other charts and the
    reflection at 0 only make the alarm sooner), with mu its drift after the change. For
    the baseline holding exactly the expected counts (350/100/50; 950/20/15/10/5) and its
    calibrated threshold: three labels, h = 2.54, up = log(0.2 / 0.134) = 0.40, down =
    log(0.8 / 0.866) = -0.080, mu = 0.25 * 0.40 - 0.75 * 0.080 = 0.041, (2.54 + 0.40) /
    0.041 = 72 labels (< 80); lumpy judge, h = 3.50, up = log(0.115 / 0.027) = 1.45, down
    = -0.095, mu = 0.165 * 1.45 - 0.835 * 0.095 = 0.160, (3.50 + 1.45) / 0.160 = 31 labels
    (< 40). The median delay over 20 learned baselines x 50 streams must be below that
    figure (measured 47 and 19), and each baseline's mean delay below its own Wald bound
    (10 % Monte Carlo slack)."""
    labels, probs, target = world
    j = labels.index(target)
    post = shifted(probs, j, 0.15)
    expected = LabelSummary(dict(zip(labels, np.rint(probs * n_b).astype(int).tolist(),
                                     strict=True)))
    h = label_threshold(expected, 0.1, ARL0, 0.95, 300, np.random.default_rng(0))
    bound = wald_bound(LabelShiftCUSUM(expected, arl0=ARL0, h=h), target, post[j])
    assert bound < figure
    rng = np.random.default_rng(31 + n_b)
    dets = learn(labels, probs, n_b, 20, rng, arl0=ARL0)
    delays = first_alarms(tables(dets, labels), np.array([d.h for d in dets]), post, 50,
                          rng)
    assert float(np.median(delays)) < bound
    bounds = np.array([wald_bound(d, target, post[j]) for d in dets])
    assert np.all(delays.reshape(len(dets), -1).mean(axis=1) < 1.1 * bounds)
