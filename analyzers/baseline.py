"""Baselines: frozen reference statistics of one stream (DESIGN.md "Data model").

A :class:`Baseline` holds what the detectors and the gate compare a candidate with: outcome
counts, the fingerprint mean and unbiased covariance with their n, the tool inventory that
defines the ``tool:`` columns, decision-path counts, abstract states, models and boundary
coverage. It is JSON on disk with a schema number (``SCHEMA_VERSION``) and a short content
hash ``baseline_id`` that survives a save/load round trip unchanged (floats are written with
``repr``, which round-trips float64 exactly).

:class:`BaselineBuilder` learns one from runs in one pass with memory O(d^2) (d = number of
features), independent of the number of runs: the mean and co-moment matrix are updated with
Welford's algorithm, ``delta = x - m; m += delta / n; C += outer(delta, x - m)``, which is
numerically stable where the naive sum-of-squares formula cancels catastrophically.

Inventories from the wire. When no inventory is given but the runs carry the tools offered
to their model calls (``Run.attributes[TOOL_INVENTORY_ATTRIBUTE]``, read by the pipeline
from ``gen_ai.tool.definitions`` or OpenInference tool schemas), the baseline's inventory is
the union of those and of the tools used, with source ``"definitions"``: tool coverage is
then measured (an offered tool never used is a coverage gap), not assumed.

Observed inventories. When no tool inventory is given, tools are learned from the runs and
a tool first seen at run n+1 gets a new column. That is exact, not an approximation: the
previous n runs all had 0 in that column, so its running mean is 0 and every deviation in
it is 0, hence its row and column of the co-moment matrix are 0 -- padding the state with
zeros *is* the Welford state of the wider vector. At ``freeze()`` the tool columns are put in
sorted order.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.coverage import (
    DEFAULT_MAX_DISTINCT,
    CoverageReport,
    CoverageTracker,
    coverage_from_counts,
)
from assaywatch.analyzers.detectors.label import MAX_LABELS, OTHER, LabelSummary
from assaywatch.analyzers.detectors.score import ScoreSummary
from assaywatch.analyzers.fingerprint import N_FIXED, feature_names, fingerprint
from assaywatch.analyzers.model import (
    MAX_EVALUATORS,
    TOOL_INVENTORY_ATTRIBUTE,
    Outcome,
    Run,
    StreamKey,
)

#: Version of the JSON layout written by ``Baseline.to_dict``.
SCHEMA_VERSION = 1
TOOL_SOURCES = ("definitions", "config", "observed")
#: Scores kept per evaluator while a baseline is built (the first ones).
MAX_SCORES = 20_000


def _frozen(a: NDArray[np.float64]) -> NDArray[np.float64]:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Baseline:
    """Frozen reference statistics of one stream.

    Attributes
    ----------
    key:
        The stream.
    n_runs, passes, fails, unknown:
        Runs seen and their outcomes.
    tools:
        Tool inventory (sorted); defines the ``tool:`` fingerprint columns.
    tool_inventory_source:
        ``"definitions"`` (``gen_ai.tool.definitions``), ``"config"`` or ``"observed"``.
    feature_names:
        Fingerprint column names (``fingerprint.feature_names(tools)``).
    mean, cov:
        Fingerprint mean and unbiased covariance (zeros when ``n_runs < 2``). Read-only.
    path_counts:
        Decision path (``"llm>tool:search>llm"``) -> number of runs that followed it.
    states:
        Distinct abstract states seen (``coverage.abstract_states``), sorted.
    models:
        Model -> number of runs that used it.
    tool_counts:
        Tool -> number of calls (including tools outside a fixed inventory).
    boundaries, boundaries_tested:
        All boundary ids (None when not configured) and those exercised.
    paths_dropped, states_dropped:
        Distinct paths/states not kept because of the memory cap.
    first_start_ns, last_start_ns:
        Earliest and latest run start (None when empty).
    source:
        Free text: where the runs came from (files, "online first N runs", ...).
    evaluators:
        Evaluator name -> summary of its graded scores (``detectors/score.py``); in the
        JSON only when there is one, so baselines without evaluations keep their id.
    labels:
        Evaluator name -> counts of its categorical labels (``detectors/label.py``), for
        evaluators that label runs without scoring them; in the JSON only when there is
        one.
    baseline_id:
        16 hex chars of the SHA-256 of the canonical JSON content.
    """

    key: StreamKey
    n_runs: int
    passes: int
    fails: int
    unknown: int
    tools: tuple[str, ...]
    tool_inventory_source: str
    feature_names: tuple[str, ...]
    mean: NDArray[np.float64]
    cov: NDArray[np.float64]
    path_counts: dict[str, int] = field(default_factory=dict)
    states: tuple[str, ...] = ()
    models: dict[str, int] = field(default_factory=dict)
    tool_counts: dict[str, int] = field(default_factory=dict)
    boundaries: tuple[str, ...] | None = None
    boundaries_tested: tuple[str, ...] = ()
    paths_dropped: int = 0
    states_dropped: int = 0
    first_start_ns: int | None = None
    last_start_ns: int | None = None
    source: str = ""
    evaluators: dict[str, ScoreSummary] = field(default_factory=dict)
    labels: dict[str, LabelSummary] = field(default_factory=dict)
    baseline_id: str = field(init=False)

    def __post_init__(self) -> None:
        d = len(self.feature_names)
        mean, cov = _frozen(self.mean), _frozen(self.cov)
        if mean.shape != (d,) or cov.shape != (d, d):
            raise ValueError(
                f"baseline {self.key}: mean shape {mean.shape} / cov shape {cov.shape} do not "
                f"match {d} feature names; the baseline file is inconsistent, rebuild it"
            )
        if self.tool_inventory_source not in TOOL_SOURCES:
            raise ValueError(
                f"baseline {self.key}: tool_inventory_source must be one of {TOOL_SOURCES}, "
                f"got {self.tool_inventory_source!r}"
            )
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "cov", cov)
        body = self._content()
        digest = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        object.__setattr__(self, "baseline_id", digest[:16])

    @property
    def pass_rate(self) -> float | None:
        """passes / (passes + fails); None when no run has a known outcome."""
        known = self.passes + self.fails
        return self.passes / known if known else None

    @property
    def sd(self) -> NDArray[np.float64]:
        """Per-feature standard deviation (sqrt of the covariance diagonal)."""
        return np.sqrt(np.clip(np.diag(self.cov), 0.0, None))

    def coverage(
        self, target_models: Sequence[str] | None = None, state_lambda: float = 10.0
    ) -> CoverageReport:
        """Coverage of the baseline's runs (see ``coverage``)."""
        observed = self.tool_inventory_source == "observed"
        return coverage_from_counts(
            # An observed inventory covers itself by construction: not a measurement.
            tools=None if observed else self.tools,
            tool_source=self.tool_inventory_source,
            tools_used=self.tool_counts,
            path_counts=self.path_counts,
            n_states=len(self.states),
            models=list(self.models),
            target_models=target_models,
            boundaries=self.boundaries,
            boundaries_tested=self.boundaries_tested,
            state_lambda=state_lambda,
            n_runs=self.n_runs,
            paths_dropped=self.paths_dropped,
            states_dropped=self.states_dropped,
        )

    def _content(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "key": {"agent": self.key.agent, "version": self.key.version,
                    "scenario": self.key.scenario},
            "n_runs": self.n_runs,
            "passes": self.passes,
            "fails": self.fails,
            "unknown": self.unknown,
            "tools": list(self.tools),
            "tool_inventory_source": self.tool_inventory_source,
            "feature_names": list(self.feature_names),
            "mean": [float(v) for v in self.mean],
            "cov": [[float(v) for v in row] for row in self.cov],
            "path_counts": dict(sorted(self.path_counts.items())),
            "states": list(self.states),
            "models": dict(sorted(self.models.items())),
            "tool_counts": dict(sorted(self.tool_counts.items())),
            "boundaries": None if self.boundaries is None else list(self.boundaries),
            "boundaries_tested": list(self.boundaries_tested),
            "paths_dropped": self.paths_dropped,
            "states_dropped": self.states_dropped,
            "first_start_ns": self.first_start_ns,
            "last_start_ns": self.last_start_ns,
            "source": self.source,
            **({"evaluators": {k: v.to_dict() for k, v in sorted(self.evaluators.items())}}
               if self.evaluators else {}),
            **({"labels": {k: v.to_dict() for k, v in sorted(self.labels.items())}}
               if self.labels else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (lists, not arrays) including ``schema_version`` and the id."""
        d = self._content()
        d["baseline_id"] = self.baseline_id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "baseline") -> Baseline:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            On an unknown schema version, a missing field, or a ``baseline_id`` that does
            not match the content (the file was edited: delete ``baseline_id`` to accept).
        """
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"{where}: baseline schema_version {version!r} is not supported by this "
                f"assaywatch (it reads version {SCHEMA_VERSION}); rebuild the baseline with "
                "`assaywatch baseline build` or upgrade assaywatch"
            )
        try:
            k = d["key"]
            b = cls(
                key=StreamKey(str(k["agent"]), str(k.get("version", "")),
                              str(k.get("scenario", ""))),
                n_runs=int(d["n_runs"]),
                passes=int(d["passes"]),
                fails=int(d["fails"]),
                unknown=int(d["unknown"]),
                tools=tuple(d["tools"]),
                tool_inventory_source=str(d["tool_inventory_source"]),
                feature_names=tuple(d["feature_names"]),
                mean=np.asarray(d["mean"], dtype=np.float64),
                cov=np.asarray(d["cov"], dtype=np.float64).reshape(
                    len(d["feature_names"]), len(d["feature_names"])
                ),
                path_counts={str(p): int(c) for p, c in d.get("path_counts", {}).items()},
                states=tuple(d.get("states", ())),
                models={str(m): int(c) for m, c in d.get("models", {}).items()},
                tool_counts={str(t): int(c) for t, c in d.get("tool_counts", {}).items()},
                boundaries=None if d.get("boundaries") is None else tuple(d["boundaries"]),
                boundaries_tested=tuple(d.get("boundaries_tested", ())),
                paths_dropped=int(d.get("paths_dropped", 0)),
                states_dropped=int(d.get("states_dropped", 0)),
                first_start_ns=d.get("first_start_ns"),
                last_start_ns=d.get("last_start_ns"),
                source=str(d.get("source", "")),
                evaluators={str(k): ScoreSummary.from_dict(v)
                            for k, v in dict(d.get("evaluators") or {}).items()},
                labels={str(k): LabelSummary.from_dict(v)
                        for k, v in dict(d.get("labels") or {}).items()},
            )
        except KeyError as exc:
            raise ValueError(
                f"{where}: baseline is missing the field {exc.args[0]!r}; rebuild it with "
                "`assaywatch baseline build`"
            ) from None
        stored = d.get("baseline_id")
        if stored is not None and stored != b.baseline_id:
            raise ValueError(
                f"{where}: baseline_id {stored!r} does not match its content "
                f"({b.baseline_id!r}); the file was edited or corrupted. Rebuild it, or delete "
                "the baseline_id field to accept the edit"
            )
        return b


class BaselineBuilder:
    """Learns a :class:`Baseline` from runs in one pass (Welford; memory O(d^2)).

    Parameters
    ----------
    key:
        The stream the runs belong to (runs of other streams are rejected).
    tools:
        Fixed tool inventory; None: learn it from the runs (``tool_source`` "observed").
    tool_source:
        Where a fixed inventory came from (``"definitions"`` or ``"config"``).
    boundaries:
        All tool-parameter boundary ids, if configured.
    source:
        Free-text provenance stored in the baseline.
    max_distinct:
        Cap on distinct paths and states kept.
    """

    def __init__(
        self,
        key: StreamKey,
        tools: Sequence[str] | None = None,
        tool_source: str | None = None,
        *,
        boundaries: Collection[str] | None = None,
        source: str = "",
        max_distinct: int = DEFAULT_MAX_DISTINCT,
    ) -> None:
        if tool_source is None:
            tool_source = "observed" if tools is None else "config"
        if tool_source not in TOOL_SOURCES:
            raise ValueError(f"tool_source must be one of {TOOL_SOURCES}, got {tool_source!r}")
        if tools is None and tool_source != "observed":
            raise ValueError(f"tool_source {tool_source!r} needs a tools list")
        self.key = key
        self.fixed_tools = tools is not None
        self._tools: list[str] = sorted(tools) if tools is not None else []
        self.tool_source = tool_source
        self.source = source
        self._cov_tracker = CoverageTracker(
            tools=self._tools if self.fixed_tools else None,
            tool_source=tool_source,
            boundaries=None if boundaries is None else tuple(sorted(set(boundaries))),
            max_distinct=max_distinct,
        )
        self._outcomes: Counter[Outcome] = Counter()
        #: tools offered on the wire (see "Inventories from the wire")
        self._offered: set[str] = set()
        d = N_FIXED + len(self._tools)
        self._n = 0
        self._mean = np.zeros(d)
        self._m2 = np.zeros((d, d))
        self._first: int | None = None
        self._last: int | None = None
        #: evaluator -> its scores (the first MAX_SCORES)
        self._scores: dict[str, list[float]] = {}
        #: evaluator -> counts of its labels (evaluations without a score)
        self._labels: dict[str, Counter[str]] = {}

    @property
    def n_runs(self) -> int:
        return self._n

    def _grow(self, new_tools: list[str]) -> None:
        k = len(new_tools)
        self._tools.extend(new_tools)
        self._mean = np.concatenate([self._mean, np.zeros(k)])
        self._m2 = np.pad(self._m2, ((0, k), (0, k)))

    def add(self, run: Run) -> None:
        """Fold one run into the running statistics."""
        if run.key != self.key:
            raise ValueError(
                f"run {run.run_id} belongs to stream {run.key}, not {self.key}; "
                "use one BaselineBuilder per stream"
            )
        if not self.fixed_tools:
            known = set(self._tools)
            new = sorted({t for t in run.tools_used if t not in known})
            offered = run.attributes.get(TOOL_INVENTORY_ATTRIBUTE)
            if offered:
                self._offered.update(t for t in offered.split(",") if t)
                new = sorted(set(new) | {t for t in self._offered if t not in known})
            if new:
                self._grow(new)
        x = fingerprint(run, self._tools)
        self._n += 1
        delta = x - self._mean
        self._mean += delta / self._n
        self._m2 += np.outer(delta, x - self._mean)
        self._outcomes[run.outcome] += 1
        self._cov_tracker.add(run)
        self._first = run.start_ns if self._first is None else min(self._first, run.start_ns)
        self._last = run.start_ns if self._last is None else max(self._last, run.start_ns)
        for name, score in run.scores.items():
            self.add_score(name, score)
        for name, label in run.labels.items():
            self.add_label(name, label)

    def add_label(self, evaluator: str, label: str) -> None:
        """Fold one categorical label of ``evaluator`` (on the trace, or arrived late);
        the summary keeps at most ``label.MAX_LABELS`` categories."""
        counts = self._labels.get(evaluator)
        if counts is None:
            if len(self._labels) >= MAX_EVALUATORS:
                return
            counts = self._labels[evaluator] = Counter()
        if label in counts or len(counts) < 4 * MAX_LABELS:
            counts[label] += 1
        else:
            counts[OTHER] += 1

    def add_score(self, evaluator: str, score: float) -> None:
        """Fold one graded score of ``evaluator`` (on the trace, or arrived late)."""
        vals = self._scores.get(evaluator)
        if vals is None:
            if len(self._scores) >= MAX_EVALUATORS:
                return
            vals = self._scores[evaluator] = []
        if len(vals) < MAX_SCORES and math.isfinite(score):
            vals.append(float(score))

    def add_many(self, runs: Iterable[Run]) -> None:
        for r in runs:
            self.add(r)

    def freeze(self) -> Baseline:
        """The baseline of the runs added so far (the builder stays usable)."""
        order = sorted(range(len(self._tools)), key=lambda i: self._tools[i])
        perm = np.array([*range(N_FIXED), *(N_FIXED + i for i in order)], dtype=int)
        tools = tuple(self._tools[i] for i in order)
        mean = self._mean[perm]
        m2 = self._m2[np.ix_(perm, perm)]
        cov = m2 / (self._n - 1) if self._n >= 2 else np.zeros_like(m2)
        cov = (cov + cov.T) / 2.0  # remove rounding asymmetry
        ct = self._cov_tracker
        return Baseline(
            key=self.key,
            n_runs=self._n,
            passes=self._outcomes[Outcome.PASS],
            fails=self._outcomes[Outcome.FAIL],
            unknown=self._outcomes[Outcome.UNKNOWN],
            tools=tools,
            tool_inventory_source="definitions" if self._offered and not self.fixed_tools
            else self.tool_source,
            feature_names=tuple(feature_names(tools)),
            mean=mean,
            cov=cov,
            path_counts=dict(ct.path_counts),
            states=tuple(sorted(ct.states)),
            models=dict(ct.models),
            tool_counts=dict(ct.tools_used),
            boundaries=None if ct.boundaries is None else tuple(ct.boundaries),
            boundaries_tested=tuple(sorted(ct.boundaries_tested)),
            paths_dropped=ct.paths_dropped,
            states_dropped=ct.states_dropped,
            first_start_ns=self._first,
            last_start_ns=self._last,
            source=self.source,
            evaluators={name: ScoreSummary.from_scores(vals)
                        for name, vals in self._scores.items() if len(vals) >= 2},
            # an evaluator that scores is monitored by its scores, not by its labels
            labels={name: LabelSummary(dict(counts)) for name, counts in self._labels.items()
                    if name not in self._scores and sum(counts.values()) >= 2},
        )


def build_baseline(
    runs: Iterable[Run],
    key: StreamKey | None = None,
    tools: Sequence[str] | None = None,
    tool_source: str | None = None,
    source: str = "",
) -> Baseline:
    """Convenience: one baseline from the runs of one stream (key from the first run)."""
    it = iter(runs)
    first = next(it, None)
    if key is None:
        if first is None:
            raise ValueError("build_baseline needs at least one run or an explicit key")
        key = first.key
    builder = BaselineBuilder(key, tools, tool_source, source=source)
    if first is not None:
        builder.add(first)
    builder.add_many(it)
    return builder.freeze()
