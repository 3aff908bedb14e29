r"""Candidate against baseline on one evaluator's categorical labels: the gate's label test.

An evaluator that labels runs without scoring them ("correct" / "partial" / "incorrect",
"safe" / "unsafe") is compared by the two label distributions: the baseline's counts
(:class:`~assaywatch.analyzers.detectors.label.LabelSummary`) against the candidate's
labels. H0: both samples come from one multinomial law (homogeneity), against any
difference. A label's meaning and order are unknown to the gate, so a shift cannot say
better or worse: the gate sends a significant one to manual review.

**Statistic.** Pearson's chi-square of the 2 x K table (rows baseline and candidate,
columns the categories with at least one label):

.. math::

    T = \sum_j \frac{N^2}{n_b n_c} \frac{(c_j - n_c t_j / N)^2}{t_j},

with ``c_j`` the candidate's count, ``t_j`` the column total, ``N = n_b + n_c``.

**p-value: exact conditional, by Monte Carlo.** Judges' labels are lumpy (a 1-2 % "refused"
or a 0.95/0.05 split) and the gate tests them at Holm levels down to alpha / m, where the
chi-square law of T is unreliable. Under H0 the candidate's column counts given the table's
margins follow the multivariate hypergeometric law whatever the multinomial, so draws of
tables with the observed margins give T's exact conditional null law (Fisher's exact test
for K = 2 categories, by simulation). The p-value is Besag and Clifford's sequential Monte
Carlo p-value: draw until :data:`STOP_EXCEEDANCES` (h) tables reach the observed T or B
draws are done; ``h / L`` after L draws, else ``(1 + #{T* >= T}) / (1 + B)``. It is valid
(P(p <= u) <= u) at any B; sequential stopping spends about ``h / p`` draws on a large p
(a few hundred on an unchanged candidate) and all B only on a small one.
``B = 200 / level - 1`` (within [:data:`MIN_DRAWS`, :data:`MAX_DRAWS`]), ``level`` being
the smallest level the test can face (alpha / m in a Holm family of m tests): at a true p
equal to the level about 200 exceedances are expected in B draws, so the procedure stops
with a relative error of about ``1 / sqrt(h)`` = 14 %, and the smallest p-value it can
report, ``1 / (B + 1)``, is 1/200 of the level. B reaches the cap at a level of 0.001
(m = 50 at alpha = 0.05); beyond, the floor 1/200,000 is still 1/20 of the level at m = 500.
200,000 draws of a 16-category table take about 0.7 s. Ties of the discrete T count as
reaching it (the conservative side).

**Categories.** The columns are the baseline summary's categories (its kept labels and
``"other"``) and, when the baseline kept every label it saw (fewer than 15 named labels, or
nothing in ``"other"``), each label the baseline never saw as a column of its own, with a
baseline count of 0. Folding the candidate's new labels into ``"other"``, as the monitor's
summary does, would make the test invalid: which labels are "new" depends on the baseline's
sample (a 1 % label is missing from 200 baseline labels 13 % of the time), and a merged
column whose baseline count is 0 by construction is not a draw of the hypergeometric law.
Measured on a world of 3 common and 13 rare (0.8 %) labels at alpha = 0.05: 0.115
(baseline 200, candidate 300) and 0.21 (100, 1,000) false alarms with folding (2,000
repetitions), 0.04-0.06 with the new labels as columns (1,000 repetitions each). New
labels beyond :data:`MAX_NEW_LABELS` (the least frequent) are folded into ``"other"``
(counted in ``folded``). When the baseline itself was
folded (15 named labels and some in ``"other"``), its ``"other"`` holds labels the gate cannot
name, so a candidate label it does not keep goes to ``"other"`` as in the summary
(``baseline_folded``). The kept labels were chosen by the baseline's counts, which biases
the labels near the smallest kept count (kept because their count ran high): measured on a
world of 3 common and 17 rare (1.8 %) labels, 0.12 false alarms at alpha = 0.05 with 200
baseline labels. So the kept labels with a baseline count below :data:`FOLDED_MARGIN`
times the smallest kept count plus 10 are merged into ``"other"`` too: 0.05-0.057 in the
same world (1,000 repetitions each, baselines of 100, 200 and 2,000 labels). This case is
approximate (a heuristic, measured, not exact).

**Report.** The category that gained most probability, candidate share minus baseline
share (:attr:`LabelTestResult.gained`): a shift moves probability somewhere, and where to
is what a reviewer reads first.

**Errors** (tests/analyzers/test_label_tests.py, 400 repetitions per case, baseline
re-drawn each time): an unchanged candidate is flagged in 2.3-6.3 % of gates at alpha = 0.05
and 0.3-2.3 % at 0.01 (bounds alpha + 3 Monte Carlo standard errors: 8.3 % and 2.5 %) in
worlds of 2 (0.95/0.05), 3 (0.7/0.2/0.1), 8 (two at 1-2 %) and 16 categories, baselines of
200 and 2,000 labels, candidates of 50 and 300; the 2-category world is the conservative
one (discrete table). Against 0.15 of probability moved into one category, 1,000 baseline
and 300 candidate labels, judged at alpha / 3: flagged in every repetition (the noncentral
chi-square approximation: power above 0.9999). At smaller shifts the power follows that
approximation (0.55 measured against 0.57, 0.69 against 0.73).

>>> base = LabelSummary({"correct": 140, "partial": 40, "incorrect": 20})
>>> cand = ["correct"] * 30 + ["partial"] * 10 + ["incorrect"] * 20
>>> r = label_test("correctness", base, cand)
>>> r.gained
('incorrect', 0.1, 0.3333333333333333)
>>> r.p_value < 0.001, r.draws
(True, 3999)

References: J. Besag and P. Clifford, Sequential Monte Carlo p-values, Biometrika 78
(1991) 301-304; A. Agresti, Categorical Data Analysis (3rd ed., 2013), 3.5 (exact
conditional tests of independence in I x J tables).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.detectors.label import MAX_LABELS, OTHER, LabelSummary

__all__ = ["MAX_NEW_LABELS", "MIN_CANDIDATE_LABELS", "LabelTestResult", "draws_for",
           "label_table", "label_test"]

#: Fewer candidate labels than this: no test (the gate says so). The test would be valid
#: with fewer, but its power is then nil against anything short of a new label.
MIN_CANDIDATE_LABELS = 10
#: Besag-Clifford's h: stop drawing once this many tables reach the observed statistic.
STOP_EXCEEDANCES = 50
#: Bounds of B, the largest number of null tables drawn (:func:`draws_for`).
MIN_DRAWS = 3_999
MAX_DRAWS = 199_999
#: Candidate labels the baseline never saw kept as columns of their own; the rest fold
#: into ``"other"`` (the table stays at most 2 x 32).
MAX_NEW_LABELS = MAX_LABELS
#: A folded baseline's kept labels below this multiple of the smallest kept count (+ 10)
#: are merged into "other" (module docstring, "Categories").
FOLDED_MARGIN = 2
_FIRST_CHUNK = 256
_MAX_CHUNK = 16_384
#: Relative tolerance of "a draw reaches the observed statistic" (rounding of equal tables).
_TIE = 1e-9


def draws_for(level: float) -> int:
    """B for a test judged at ``level`` at the smallest (module docstring)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return min(MAX_DRAWS, max(MIN_DRAWS, math.ceil(200.0 / level) - 1))


@dataclass(frozen=True)
class LabelTestResult:
    """One evaluator's label test: the table, the chi-square statistic and its p-value."""

    evaluator: str
    #: the table's columns: the baseline's categories, then the labels it never saw
    categories: tuple[str, ...]
    counts_b: tuple[int, ...]
    counts_c: tuple[int, ...]
    #: Pearson's chi-square of the 2 x K table
    statistic: float
    #: exact conditional p-value (Monte Carlo, Besag-Clifford)
    p_value: float
    #: null tables drawn
    draws: int
    #: candidate labels folded into "other" (beyond MAX_NEW_LABELS new labels, or because
    #: the baseline itself was folded)
    folded: int = 0
    #: the baseline summary had folded labels into "other" (the test is then approximate)
    baseline_folded: bool = False

    @property
    def n_b(self) -> int:
        return sum(self.counts_b)

    @property
    def n_c(self) -> int:
        return sum(self.counts_c)

    @property
    def new_labels(self) -> tuple[str, ...]:
        """Columns of labels the baseline never saw."""
        j = len(self.categories) - self.categories[::-1].index(OTHER)
        return self.categories[j:]

    @property
    def gained(self) -> tuple[str, float, float]:
        """(category, baseline share, candidate share) of the category whose share rose
        most (the first of equals in column order)."""
        nb, nc = max(self.n_b, 1), max(self.n_c, 1)
        gains = [c / nc - b / nb for b, c in zip(self.counts_b, self.counts_c, strict=True)]
        j = max(range(len(gains)), key=gains.__getitem__)
        return self.categories[j], self.counts_b[j] / nb, self.counts_c[j] / nc


def label_table(summary: LabelSummary, labels: Iterable[object]
                ) -> tuple[tuple[str, ...], list[int], list[int], int, bool]:
    """(columns, baseline counts, candidate counts, labels folded, baseline folded) of the
    test (module docstring, "Categories"); ``None`` labels are skipped, others are ``str``-ed
    as the summary does."""
    cats = summary.categories()
    named = len(cats) - 1
    baseline_folded = named >= MAX_LABELS - 1 and summary.counts.get(OTHER, 0) > 0
    if baseline_folded:
        # the summary kept its most frequent labels: a kept label near the smallest kept
        # count was kept because its count ran high; merged into "other" with the rest
        low = FOLDED_MARGIN * min(v for k, v in summary.counts.items() if k != OTHER) + 10
        cats = [k for k in cats if k == OTHER or summary.counts[k] >= low]
    seen = Counter(str(x) for x in labels if x is not None)
    known = set(cats)
    new = sorted((k for k in seen if k not in known), key=lambda k: (-seen[k], k))
    keep = [] if baseline_folded else sorted(new[:MAX_NEW_LABELS])
    columns = tuple(cats + keep)
    index = {k: i for i, k in enumerate(columns)}
    c = [0] * len(columns)
    folded = 0
    for k, v in seen.items():
        i = index.get(k)
        if i is None:
            i, folded = index[OTHER], folded + v
        c[i] += v
    b = [summary.counts.get(k, 0) for k in cats] + [0] * len(keep)
    if baseline_folded:
        b[-1] = summary.n - sum(b[:-1])
    return columns, b, c, folded, baseline_folded


def _spread(c: NDArray[np.float64], e: NDArray[np.float64], t: NDArray[np.float64]
            ) -> NDArray[np.float64]:
    """sum_j (c_j - e_j)^2 / t_j along the last axis: T up to the factor N^2 / (n_b n_c),
    which the margins fix."""
    out: NDArray[np.float64] = ((c - e) ** 2 / t).sum(axis=-1)
    return out


def _mc_p_value(t: NDArray[np.int64], c: NDArray[np.int64], rng: np.random.Generator,
                draws: int) -> tuple[float, int]:
    """Besag-Clifford sequential Monte Carlo p-value of the spread of ``c`` among tables
    with the column totals ``t`` and the candidate's total; (p, tables drawn)."""
    n_c = int(c.sum())
    tf = t.astype(np.float64)
    e = n_c * tf / float(t.sum())
    s_obs = float(_spread(c.astype(np.float64), e, tf))
    bar = s_obs - _TIE * max(s_obs, 1.0)
    hits = done = 0
    chunk = _FIRST_CHUNK
    while done < draws:
        size = min(chunk, draws - done)
        sim = rng.multivariate_hypergeometric(t, n_c, size=size).astype(np.float64)
        cum = hits + np.cumsum(_spread(sim, e, tf) >= bar)
        if cum[-1] >= STOP_EXCEEDANCES:
            used = done + int(np.argmax(cum >= STOP_EXCEEDANCES)) + 1
            return STOP_EXCEEDANCES / used, used
        hits, done = int(cum[-1]), done + size
        chunk = min(2 * chunk, _MAX_CHUNK)
    return (hits + 1) / (draws + 1), draws


def label_test(evaluator: str, summary: LabelSummary, labels: Iterable[object], *,
               level: float = 0.05, draws: int | None = None,
               seed: int | None = None) -> LabelTestResult:
    """Test of homogeneity of the baseline's and the candidate's labels (module docstring).

    Parameters
    ----------
    evaluator:
        The evaluator's name (reported, and part of the seed).
    summary:
        The baseline's labels of the evaluator.
    labels:
        The candidate runs' labels of the evaluator (``None`` skipped).
    level:
        The smallest level the p-value will be judged at (alpha / m in a Holm family of m);
        sets B (:func:`draws_for`).
    draws:
        B itself, overriding ``level``.
    seed:
        Of the null tables; None: from the table, so the same inputs give the same p-value.
    """
    columns, b, c, folded, baseline_folded = label_table(summary, labels)
    if summary.n < 1:
        raise ValueError(f"{evaluator}: the baseline has no labels")
    if sum(c) < 1:
        raise ValueError(f"{evaluator}: the candidate has no labels")
    if draws is not None and draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    n_draws = draws_for(level) if draws is None else draws
    bb, cc = np.array(b, dtype=np.int64), np.array(c, dtype=np.int64)
    live = (bb + cc) > 0
    t, c_live = (bb + cc)[live], cc[live]
    n_b, n_c = int(bb.sum()), int(cc.sum())
    n = n_b + n_c
    e = n_c * t / n
    stat = float(n * n / (n_b * n_c) * ((c_live - e) ** 2 / t).sum())
    if t.size < 2:  # one category in both samples: nothing can differ
        p, used = 1.0, 0
    else:
        if seed is None:
            seed = zlib.crc32(repr((evaluator, columns, b, c)).encode())
        p, used = _mc_p_value(t, c_live, np.random.default_rng(seed), n_draws)
    return LabelTestResult(evaluator, columns, tuple(b), tuple(c), stat, p, used, folded,
                           baseline_folded)
