"""Agent coverage (SPEC.md 4): tool, decision path, state, boundary and model coverage.

Dimensions
----------
``tool``
    C_tool = |tools used| / |inventory| (tools called but not in the inventory are ignored:
    they are reported separately, they do not inflate coverage).
``path``
    C_path = d / Chao1, d = distinct decision paths. Chao1 (Chao 1984) estimates the number
    of feasible paths from the rare ones: ``d + f1^2 / (2 f2)``, bias-corrected
    ``d + f1 (f1 - 1) / 2`` when f2 = 0 (f_k = paths seen exactly k times).
``state``
    C_state = 1 - exp(-|distinct abstract states| / lambda). The paper's state
    (graph location, variables, history hash) needs content we never store; our
    **abstract state** is a transition of the decision path: ``"<previous>><current>"``
    where each side is a step label (``llm``, ``tool:search``, ...; ``^`` before the first
    step) and the current label carries ``!`` when that step failed. It is what the agent
    did next given where it was, plus whether it went wrong -- a finite, content-free
    projection pi of the paper's state.
``boundary``
    C_boundary = tested / total tool-parameter boundaries. Spans carry no parameter
    values, so boundaries are opt-in: the caller names the boundary ids (e.g.
    ``"search.query:empty"``) and each run reports the ones it hit, by default in the
    comma-separated run attribute ``assaywatch.boundaries`` (``BOUNDARY_ATTRIBUTE``).
``model``
    C_model = tested / target models (target models from config).

A dimension that **cannot be measured** (no inventory or an observed one, no boundary
list, no target models) is reported as the vacuous value 1.0 ("all of nothing is
covered"), listed in ``not_measured``, and **excluded** from the overall geometric mean:
counting it as 1.0 in the mean would raise ``overall`` (the root would be taken over more
dimensions), scoring it 0 would block every gate without a boundary list. Consumers that
export or display dimensions should skip the ones in ``not_measured`` (``as_dict`` does).
``overall`` is the geometric mean of the measured dimensions, 0 as soon as one is 0 (SPEC).
Path and state coverage are always measured (0 before the first run).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from assaywatch.analyzers.model import Action, Run

#: Run attribute listing the tool-parameter boundaries a run exercised (comma-separated).
BOUNDARY_ATTRIBUTE = "assaywatch.boundaries"
#: Default cap on the distinct paths / states a tracker keeps.
DEFAULT_MAX_DISTINCT = 10_000
#: Paths longer than this (characters) are stored as a hash to bound memory.
MAX_PATH_CHARS = 512

DIMENSIONS: tuple[str, ...] = ("tool", "path", "state", "boundary", "model")


def chao1(counts: Iterable[int] | Mapping[Any, int]) -> float:
    """Chao1 estimate of the number of distinct classes (here: feasible decision paths).

    ``S = d + f1^2 / (2 f2)`` when f2 > 0, else the bias-corrected ``d + f1 (f1 - 1) / 2``,
    where d is the number of classes seen and f1, f2 the numbers seen once and twice.

    Parameters
    ----------
    counts:
        Observation count per distinct class (a mapping's values are used). Zero counts are
        ignored.

    Examples
    --------
    >>> chao1([1, 1, 2, 3])
    6.0
    >>> chao1([1, 1, 1, 3])
    7.0
    """
    values = list(counts.values()) if isinstance(counts, Mapping) else list(counts)
    if any(c < 0 for c in values):
        raise ValueError("chao1 counts must be non-negative")
    seen = [c for c in values if c > 0]
    d = len(seen)
    f1 = sum(1 for c in seen if c == 1)
    f2 = sum(1 for c in seen if c == 2)
    if f2 > 0:
        return d + f1 * f1 / (2.0 * f2)
    return d + f1 * (f1 - 1) / 2.0


#: ``Action.value`` by member: an enum's ``.value`` is a descriptor call, this a dict hit
#: (path_key and abstract_states run on every monitored run).
_ACTION_VALUE: dict[Action, str] = {a: a.value for a in Action}


def step_label(action: str, tool: str) -> str:
    """``"llm"`` or ``"tool:search"``: one element of a serialised decision path."""
    return f"{action}:{tool}" if tool else action


def path_key(run: Run) -> str:
    """The run's decision path serialised as ``"llm>tool:search>llm"`` ("" when empty).

    Paths longer than ``MAX_PATH_CHARS`` are replaced by ``"#"`` + a 16-byte BLAKE2b hex
    digest, which keeps them distinct without unbounded memory.
    """
    value = _ACTION_VALUE
    s = ">".join(
        f"{value[st.action]}:{st.tool}" if st.tool else value[st.action] for st in run.steps
    )
    return hashed_path(s) if len(s) > MAX_PATH_CHARS else s


def hashed_path(path: str) -> str:
    """``"#"`` + the 16-byte BLAKE2b hex digest of a serialised path: how
    :func:`path_key` keeps a path longer than ``MAX_PATH_CHARS``."""
    return "#" + hashlib.blake2b(path.encode(), digest_size=16).hexdigest()


def abstract_states(run: Run) -> set[str]:
    """The run's abstract states: path transitions ``prev>cur`` (``!`` marks an error)."""
    out: set[str] = set()
    prev = "^"
    value = _ACTION_VALUE
    for s in run.steps:
        cur = f"{value[s.action]}:{s.tool}" if s.tool else value[s.action]
        out.add(f"{prev}>{cur}{'!' if s.error else ''}")
        prev = cur
    return out


@dataclass(frozen=True, slots=True)
class CoverageParts:
    """What :meth:`CoverageTracker.add` reads of a run, when computed beforehand (the
    engine's one pass over the steps, ``monitor/engine/features.py``): the decision path
    (:func:`path_key`), the abstract states (:func:`abstract_states`), the distinct step
    models (truthy ``Step.model``) and the named tool calls (``Run.tools_used``)."""

    path: str
    states: Collection[str]
    step_models: Iterable[str]
    tools_used: Iterable[str]


def default_boundary_hits(run: Run) -> list[str]:
    """Boundary ids listed in the run attribute ``BOUNDARY_ATTRIBUTE``."""
    raw = run.attributes.get(BOUNDARY_ATTRIBUTE, "")
    return [b.strip() for b in raw.split(",") if b.strip()]


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Coverage per dimension (unmeasured ones are 1.0 and listed in ``not_measured``).

    Attributes
    ----------
    tool, path, state, boundary, model:
        The five dimensions in [0, 1].
    overall:
        Geometric mean of the measured dimensions (0 if any is 0).
    tool_inventory_source:
        ``"definitions"``, ``"config"`` or ``"observed"``: where the inventory came from.
    not_measured:
        Names of the dimensions that are None.
    distinct_paths, chao1_paths, distinct_states, n_runs:
        The raw figures behind path and state coverage.
    untested_tools, unlisted_tools:
        Inventory tools never called; tools called that are not in the inventory.
    paths_dropped, states_dropped:
        Distinct paths/states not kept because of the tracker's memory cap (path and state
        coverage are then lower bounds on what was seen).
    """

    tool: float
    path: float
    state: float
    boundary: float
    model: float
    overall: float
    tool_inventory_source: str = "observed"
    not_measured: tuple[str, ...] = ()
    distinct_paths: int = 0
    chao1_paths: float = 0.0
    distinct_states: int = 0
    n_runs: int = 0
    untested_tools: tuple[str, ...] = ()
    unlisted_tools: tuple[str, ...] = ()
    paths_dropped: int = 0
    states_dropped: int = 0

    def as_dict(self) -> dict[str, float]:
        """Measured dimensions and ``overall`` (the ``dimension`` label values to export)."""
        keep = [d for d in DIMENSIONS if d not in self.not_measured]
        return {d: float(getattr(self, d)) for d in (*keep, "overall")}


def geometric_mean(values: Sequence[float]) -> float:
    """Geometric mean of values in [0, 1]; exactly 0 when any value is 0."""
    if not values:
        raise ValueError("geometric mean of no values")
    if any(v <= 0.0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass
class CoverageTracker:
    """Incremental coverage of one stream in bounded memory.

    Parameters
    ----------
    tools:
        Tool inventory; None or empty means "observed": the inventory is the set of tools
        seen, so C_tool is 1 by construction and is listed as not measured.
    tool_source:
        Where ``tools`` came from (``"definitions"``, ``"config"``, ``"observed"``).
    target_models:
        Models the suite should exercise; None: model coverage not measured.
    boundaries:
        All boundary ids; None: boundary coverage not measured.
    boundary_hits:
        Extracts the boundary ids a run exercised (default: ``default_boundary_hits``).
    state_lambda:
        lambda of C_state (expected number of distinct abstract states).
    max_distinct:
        Cap on the distinct paths and on the distinct states kept; beyond it new ones are
        counted in ``paths_dropped`` / ``states_dropped`` and not stored.
    """

    tools: Sequence[str] | None = None
    tool_source: str = "observed"
    target_models: Sequence[str] | None = None
    boundaries: Collection[str] | None = None
    boundary_hits: Callable[[Run], Iterable[str]] = default_boundary_hits
    state_lambda: float = 10.0
    max_distinct: int = DEFAULT_MAX_DISTINCT
    n_runs: int = 0
    tools_used: Counter[str] = field(default_factory=Counter)
    path_counts: Counter[str] = field(default_factory=Counter)
    states: set[str] = field(default_factory=set)
    models: Counter[str] = field(default_factory=Counter)
    boundaries_tested: set[str] = field(default_factory=set)
    paths_dropped: int = 0
    states_dropped: int = 0

    def __post_init__(self) -> None:
        if self.tool_source not in ("definitions", "config", "observed"):
            raise ValueError(
                f"tool_source must be 'definitions', 'config' or 'observed', "
                f"got {self.tool_source!r}"
            )
        if not self.state_lambda > 0:
            raise ValueError(f"state_lambda must be > 0, got {self.state_lambda}")
        if self.max_distinct < 1:
            raise ValueError(f"max_distinct must be >= 1, got {self.max_distinct}")

    def add(self, run: Run, parts: CoverageParts | None = None) -> None:
        """Account for one run: O(steps) time, memory bounded by ``max_distinct``.

        ``parts``: the run's path, abstract states, step models and named tool calls when
        the caller computed them already (they must be :func:`path_key`'s,
        :func:`abstract_states`', the distinct truthy ``Step.model``s and
        ``Run.tools_used`` of this run)."""
        self.n_runs += 1
        if parts is None:
            tools_used: Iterable[str] = run.tools_used
            p = path_key(run)
            states: Collection[str] = abstract_states(run)
            step_models: Iterable[str] = {s.model for s in run.steps if s.model}
        else:
            tools_used, p, states, step_models = (parts.tools_used, parts.path, parts.states,
                                                  parts.step_models)
        for t in tools_used:
            self.tools_used[t] += 1
        if p in self.path_counts or len(self.path_counts) < self.max_distinct:
            self.path_counts[p] += 1
        else:
            self.paths_dropped += 1
        if len(self.states) + len(states) > self.max_distinct:
            # near the cap, which states are kept must not depend on a set's order
            states = sorted(states)
        for st in states:
            if st in self.states:
                continue
            if len(self.states) < self.max_distinct:
                self.states.add(st)
            else:
                self.states_dropped += 1
        for m in set(run.models).union(step_models):
            self.models[m] += 1
        if self.boundaries is not None:
            known = self.boundaries
            self.boundaries_tested.update(b for b in self.boundary_hits(run) if b in known)

    def report(self) -> CoverageReport:
        """The current coverage (see the module docstring for each dimension)."""
        return coverage_from_counts(
            tools=self.tools,
            tool_source=self.tool_source,
            tools_used=self.tools_used,
            path_counts=self.path_counts,
            n_states=len(self.states),
            models=self.models,
            target_models=self.target_models,
            boundaries=self.boundaries,
            boundaries_tested=self.boundaries_tested,
            state_lambda=self.state_lambda,
            n_runs=self.n_runs,
            paths_dropped=self.paths_dropped,
            states_dropped=self.states_dropped,
        )


def coverage_from_counts(
    *,
    tools: Sequence[str] | None,
    tool_source: str,
    tools_used: Mapping[str, int],
    path_counts: Mapping[str, int],
    n_states: int,
    models: Collection[str],
    target_models: Sequence[str] | None,
    boundaries: Collection[str] | None,
    boundaries_tested: Collection[str],
    state_lambda: float = 10.0,
    n_runs: int = 0,
    paths_dropped: int = 0,
    states_dropped: int = 0,
) -> CoverageReport:
    """Coverage from sufficient statistics (used by the tracker and by baselines)."""
    used = {t for t, c in tools_used.items() if c > 0}
    c_tool: float | None = None
    untested: tuple[str, ...] = ()
    unlisted: tuple[str, ...] = ()
    if tools:
        inv = set(tools)
        c_tool = len(used & inv) / len(inv)
        untested = tuple(sorted(inv - used))
        unlisted = tuple(sorted(used - inv))
    d = sum(1 for c in path_counts.values() if c > 0)
    est = chao1(path_counts)
    c_path = d / est if d > 0 else 0.0
    c_state = 1.0 - math.exp(-n_states / state_lambda)
    c_boundary: float | None = None
    if boundaries:
        c_boundary = len(set(boundaries_tested) & set(boundaries)) / len(set(boundaries))
    c_model: float | None = None
    if target_models:
        tm = set(target_models)
        c_model = len(tm & set(models)) / len(tm)
    vals = {"tool": c_tool, "path": c_path, "state": c_state, "boundary": c_boundary,
            "model": c_model}
    measured = [v for v in vals.values() if v is not None]
    return CoverageReport(
        tool=1.0 if c_tool is None else c_tool,
        path=c_path,
        state=c_state,
        boundary=1.0 if c_boundary is None else c_boundary,
        model=1.0 if c_model is None else c_model,
        overall=geometric_mean(measured),
        tool_inventory_source=tool_source,
        not_measured=tuple(k for k, v in vals.items() if v is None),
        distinct_paths=d,
        chao1_paths=est,
        distinct_states=n_states,
        n_runs=n_runs,
        untested_tools=untested,
        unlisted_tools=unlisted,
        paths_dropped=paths_dropped,
        states_dropped=states_dropped,
    )


def coverage(
    runs: Iterable[Run],
    tools: Sequence[str] | None,
    target_models: Sequence[str] | None = None,
    state_lambda: float = 10.0,
    boundaries: Collection[str] | None = None,
    *,
    tool_source: str = "config",
    boundary_hits: Callable[[Run], Iterable[str]] = default_boundary_hits,
) -> CoverageReport:
    """Coverage of a set of runs (SPEC.md 4); see the module docstring.

    Parameters
    ----------
    runs:
        The runs (one stream, or a suite).
    tools:
        The tool inventory; None or empty: tool coverage not measured (1.0, flagged).
    target_models:
        Models to cover; None: model coverage not measured (1.0, flagged).
    state_lambda:
        lambda of C_state.
    boundaries:
        All boundary ids; None: boundary coverage not measured.
    tool_source:
        Where the inventory came from, reported as is (``"observed"`` when ``tools`` is
        empty).
    boundary_hits:
        Extracts the boundary ids each run exercised.
    """
    tracker = CoverageTracker(
        tools=tools,
        tool_source=tool_source if tools else "observed",
        target_models=target_models,
        boundaries=boundaries,
        boundary_hits=boundary_hits,
        state_lambda=state_lambda,
        max_distinct=10**9,
    )
    for r in runs:
        tracker.add(r)
    return tracker.report()
