"""The categorical-label CUSUM (``analyzers/detectors/label.py``) on three judge worlds.

Run with ``python -m tests.benchmarks labels``. ``BENCH_LABELS_SCALE`` (default 1)
multiplies the repetition counts; about 50 s at scale 1 on one core.

Worlds (true label laws; a regression moves probability onto the last-named label):

* three labels: correct 0.7, partially_correct 0.2, incorrect 0.1 -> "incorrect";
* lumpy judge: correct 0.95, partially_correct 0.02, incorrect 0.015, refused 0.01,
  error 0.005 -> "incorrect";
* safety judge with a rare label: safe 0.9, unsafe 0.095, error 0.005 -> "unsafe" (the
  "error" label is missing from 37 % of 200-label baselines and is then counted as
  "other").

Every repetition learns its own baseline of ``n_b`` labels from the truth (n_b = 200 and
1,000), the detector (``confidence`` 0.95, shift 0.1) with its calibrated threshold
(``label_threshold``, 300 bootstrap draws) and with the analytic ``log(K arl0)``.

In control, at ``arl0 = 500`` (simulated) and 10,000 (computed):

* ``sim ARL0``: labels per alarm, pooled over baselines x streams of 10 arl0 labels with
  restarts (a renewal estimate of the average over baselines of 1/ARL0, inverted), and its
  ratio to the target (``/tgt``); the same for the analytic threshold (``an. ARL0``;
  ``>x``: no alarm, the 95 % lower bound);
* ``<tgt``: share of baselines whose ARL0 is below the target, from the exact Markov
  chain of every chart (``bernoulli_cusum_arl`` on the chart's lattice, ratio matched to
  0.2 %) with the charts' rates added (a lower bound of the max-of-K ARL0, checked
  against the simulation within 5 %); the calibration states at most 0.05. ``h@1e4`` /
  ``<1e4``: median threshold and the same share for a target of 10,000 (chains only).

Delays: zero-start delay (labels up to the alarm; mean, and median for the calibrated
threshold) when ``d`` = 0.1 or 0.2 of probability moves onto the target label (the others
scaled down), over baselines x streams, censored at 3,000 labels (counted), against the
oracle: Page's CUSUM knowing the pre- and post-change laws (its log-likelihood ratio takes
two values, so its threshold and zero-start mean delay are exact on the Markov chain,
``bernoulli_cusum_threshold``/``bernoulli_cusum_arl``), at the same target arl0.

Two last tables compare the robust design (null rates at their upper confidence bounds,
the default) with the plain multinomial CUSUM (``confidence=None``, null = the smoothed
estimate), both calibrated, and time ``label_threshold`` (300 draws) against the number of
categories (K - 1 labels sharing 0.3 beside one at 0.7, "other" among them).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from assaywatch.analyzers.detectors.calibration import (
    bernoulli_cusum_arl,
    bernoulli_cusum_threshold,
    bernoulli_lattice,
)
from assaywatch.analyzers.detectors.label import (
    OTHER,
    ChartARL,
    LabelShiftCUSUM,
    LabelSummary,
    chart_steps,
    label_threshold,
)
from tests.analyzers.detectors.test_label_detector import (
    LUMPY,
    THREE,
    first_alarms,
    incontrol_rate,
    learn,
    shifted,
    tables,
)

F64 = np.ndarray
SAFETY = (["safe", "error", "unsafe"], np.array([0.9, 0.005, 0.095]), "unsafe")
WORLDS = {"three labels": THREE, "lumpy judge": LUMPY, "safety + rare label": SAFETY}
SIZES = (200, 1_000)
ARL0 = 500.0
ARL0_PROD = 10_000.0
SEED = 20_251


def _scale(n: int, minimum: int = 2) -> int:
    return max(minimum, int(round(n * float(os.environ.get("BENCH_LABELS_SCALE", "1")))))


BASELINES = _scale(50, 10)
STREAMS = _scale(20, 4)
DELAY_STREAMS = _scale(20, 4)
#: delays are censored here (the count is printed)
CAP = 3_000


def union_arl(det: LabelShiftCUSUM, labels: list[str], probs: F64, h: float) -> float:
    """Exact per-chart ARLs (lattice chain) of ``det`` at ``h`` under the true law, the
    charts' rates added: a lower bound of the detector's ARL0. A chart whose chain would
    be too large (a dominant category's tiny step against a large one) takes the
    detector's own ``ChartARL`` figure."""
    q = np.zeros(len(det.labels))
    for x, p in zip(labels, probs, strict=True):
        q[det.category(x)] += p
    rate = 0.0
    for j in range(len(det.labels)):
        u, r = float(det.null[j]), float(det.alt[j])
        if u >= 1.0 or q[j] <= 0.0:
            continue  # off, or a category that never occurs: never alarms
        unit, down, up = bernoulli_lattice(1.0 - u, 1.0 - r)
        if math.ceil(h / unit) * (up - down) > 2_000_000:
            sel = np.array([j])
            ups, downs = chart_steps(det.null[sel], det.alt[sel])
            la = ChartARL(ups, downs, q[sel], h).log_arl(np.array([h]))
            rate += float(np.exp(-la[0]))
            continue
        try:
            rate += 1.0 / bernoulli_cusum_arl(1.0 - q[j], 1.0 - u, 1.0 - r, h)
        except ValueError:  # beyond the chain's size: a very long ARL
            continue
    return 1.0 / rate if rate > 0 else math.inf


def oracle_delay(p: float, d: float, arl0: float) -> float:
    """Zero-start delay of Page's CUSUM knowing the law moves from p to p + d on the
    target label (exact Markov chain, pass = any other label)."""
    h = bernoulli_cusum_threshold(1.0 - p, 1.0 - p - d, arl0)
    return bernoulli_cusum_arl(1.0 - p - d, 1.0 - p, 1.0 - p - d, h)


def case_rows(name: str, n_b: int, rng: np.random.Generator) -> tuple[str, str]:
    labels, probs, target = WORLDS[name]
    dets = learn(labels, probs, n_b, BASELINES, rng, arl0=ARL0)
    tab = tables(dets, labels)
    h_cal = np.array([d.h for d in dets])
    h_an = np.array([d.analytic_h for d in dets])
    steps = int(10 * ARL0)
    rate = incontrol_rate(tab, h_cal, probs, STREAMS, steps, rng)
    rate_an = incontrol_rate(tab, h_an, probs, STREAMS, steps, rng)
    below = np.mean([union_arl(d, labels, probs, d.h) < ARL0 for d in dets])
    # production target: thresholds recomputed, ARL0 from the chains only
    prod = learn(labels, probs, n_b, BASELINES, rng, arl0=ARL0_PROD)
    below_prod = np.mean([union_arl(d, labels, probs, d.h) < ARL0_PROD for d in prod])
    sim = 1.0 / rate.mean()
    if rate_an.sum():
        sim_an = 1.0 / rate_an.mean()
        an_arl = f"{sim_an:>10.0f}"
    else:  # no alarm: the 95 % lower bound (Poisson, 3 expected alarms)
        sim_an = rate_an.size * STREAMS * steps / 3.0
        an_arl = f"{'>' + format(sim_an, '.0f'):>10}"
    inc = (f"{name:<20}{n_b:>6,}{np.median(h_cal):>7.2f}{h_an[0]:>6.2f}{sim:>9.0f}"
           f"{sim / ARL0:>6.2f}{below:>6.2f}{an_arl}{sim_an / ARL0:>7.0f}"
           f"{np.median([d.h for d in prod]):>8.2f}{below_prod:>8.2f}")
    j = labels.index(target)
    cells, censored = [], 0
    for d in (0.1, 0.2):
        post = shifted(probs, j, d)
        cal = first_alarms(tab, h_cal, post, DELAY_STREAMS, rng, cap=CAP)
        an = first_alarms(tab, h_an, post, DELAY_STREAMS, rng, cap=CAP)
        censored += int((cal >= CAP).sum() + (an >= CAP).sum())
        orc = oracle_delay(float(probs[j]), d, ARL0)
        cells.append(f"{cal.mean():>7.1f}{np.median(cal):>6.0f}{an.mean():>8.1f}{orc:>7.1f}"
                     f"{cal.mean() / orc:>6.2f}")
    note = f"  ({censored} censored at {CAP})" if censored else ""
    return inc, f"{name:<20}{n_b:>6,}" + "".join(cells) + note


def design_rows(rng: np.random.Generator) -> list[str]:
    """Robust (default) against plain design: median calibrated h, simulated ARL0 / target
    and the delay at d = 0.1, per world, n_b = 200 and 1,000."""
    rows = [f"{'world':<20}{'n_b':>6}{'design':>8}{'h med':>7}{'ARL0/tgt':>10}"
            f"{'<tgt':>6}{'delay .1':>10}{'(med)':>7}{'delay .2':>10}{'(med)':>7}"]
    for name, (labels, probs, target) in WORLDS.items():
        j = labels.index(target)
        for n_b in SIZES:
            for plain in (False, True):
                dets = learn(labels, probs, n_b, _scale(30, 10), rng, arl0=ARL0, plain=plain)
                tab = tables(dets, labels)
                h = np.array([d.h for d in dets])
                rate = incontrol_rate(tab, h, probs, _scale(10, 4), int(10 * ARL0), rng)
                below = np.mean([union_arl(d, labels, probs, d.h) < ARL0 for d in dets])
                dl = [first_alarms(tab, h, shifted(probs, j, d), _scale(10, 4), rng, cap=CAP)
                      for d in (0.1, 0.2)]
                rows.append(f"{name:<20}{n_b:>6,}{'plain' if plain else 'robust':>8}"
                            f"{np.median(h):>7.2f}{1.0 / rate.mean() / ARL0:>10.2f}"
                            f"{below:>6.2f}{dl[0].mean():>10.1f}{np.median(dl[0]):>7.0f}"
                            f"{dl[1].mean():>10.1f}{np.median(dl[1]):>7.0f}")
    return rows


def timing_rows(rng: np.random.Generator) -> list[str]:
    rows = [f"{'categories':>10}{'n_b':>8}{'arl0':>8}{'ms':>8}"]
    for k in (2, 4, 8, 16):
        probs = np.r_[0.7, np.full(k - 1, 0.3 / (k - 1))]
        labels = ["main"] + [f"l{i:02d}" for i in range(k - 2)] + [OTHER]
        for n_b in (200, 1_000, 10_000):
            s = LabelSummary(dict(zip(labels, rng.multinomial(n_b, probs).tolist(),
                                      strict=True)))
            for arl0 in (500.0, 10_000.0):
                t0 = time.perf_counter()
                for _ in range(5):
                    label_threshold(s, 0.1, arl0, 0.95, 300, rng)
                ms = (time.perf_counter() - t0) / 5 * 1000
                rows.append(f"{len(s.categories()):>10}{n_b:>8,}{arl0:>8.0f}{ms:>8.0f}")
    return rows


def main() -> None:
    rng = np.random.default_rng(SEED)
    print(f"label CUSUM, shift 0.1, confidence 0.95, {BASELINES} baselines per case; "
          f"in control {STREAMS} streams x {10 * ARL0:.0f} labels per baseline at arl0 "
          f"{ARL0:.0f}; delays {DELAY_STREAMS} streams per baseline")
    inc_rows = [f"{'world':<20}{'n_b':>6}{'h cal':>7}{'h an':>6}{'sim ARL0':>9}{'/tgt':>6}"
                f"{'<tgt':>6}{'an. ARL0':>10}{'/tgt':>7}{'h@1e4':>8}{'<1e4':>8}"]
    del_rows = [f"{'':<26}{'d = 0.1':^34}{'d = 0.2':^34}",
                f"{'world':<20}{'n_b':>6}" + f"{'cal':>7}{'(med)':>6}{'an.':>8}{'oracle':>7}"
                f"{'ratio':>6}" * 2]
    for name in WORLDS:
        for n_b in SIZES:
            t0 = time.perf_counter()
            inc, dl = case_rows(name, n_b, rng)
            inc_rows.append(inc)
            del_rows.append(dl + f"  ({time.perf_counter() - t0:.0f} s)")
    print("in control (target arl0 500; h@1e4 / <1e4: median threshold and share of "
          "baselines below a target of 10,000, chains only):")
    print("\n".join(inc_rows))
    print("\nzero-start mean delays (labels; median for the calibrated), calibrated and "
          "analytic thresholds, oracle at the target arl0, ratio calibrated / oracle (means):")
    print("\n".join(del_rows))
    print("\nrobust (null at the upper confidence bound, default) vs plain (null at the "
          "estimate) design, calibrated thresholds, arl0 500:")
    print("\n".join(design_rows(rng)))
    print("\nlabel_threshold, 300 bootstrap draws (mean of 5 calls):")
    print("\n".join(timing_rows(rng)))


if __name__ == "__main__":
    main()
