"""What the engine reads of each run it monitors, in one pass over the run's steps.

A monitored run is read four times by the statistics, each its own loop over the steps: its
fingerprint (``analyzers.fingerprint``), its latency sums per charted kind
(``analyzers.detectors.latency``: ``run_stats`` then ``stats_vector``), and what the
stream's coverage tracker counts (``analyzers.coverage``: the decision path, the abstract
states, the step models and tools). With the compiled module (native/,
``assaywatch_native``) they are computed in one pass, with the same arithmetic in the same
order: the values are those of the Python functions bit for bit
(``tests/monitor/test_native_features.py``), which remain the specification and compute
any run the compiled pass declines (a field of an unexpected type, counts beyond 2^53) or
every run when the module is absent or ``ASSAYWATCH_NATIVE=0``.

The fingerprint's five logarithms are numpy's ``log1p`` on both paths (the compiled pass
leaves them to numpy: numpy's ``log1p`` and the C library's differ in the last bit for
some inputs).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.coverage import MAX_PATH_CHARS, CoverageParts, hashed_path
from assaywatch.analyzers.detectors import latency
from assaywatch.analyzers.fingerprint import N_FIXED, feature_names, fingerprint
from assaywatch.analyzers.model import Action, Run
from assaywatch.monitor.receivers.otlp.decode import native_available

try:
    import assaywatch_native as _native_module
except ImportError:  # pragma: no cover - the pure-Python install
    _native_module = None

__all__ = ["RunFeatures", "run_features"]

F64 = NDArray[np.float64]

_ACTIONS = (Action.LLM, Action.TOOL, Action.RETRIEVE, Action.HANDOFF, Action.AGENT,
            Action.OTHER)


class RunFeatures:
    """The features of runs of one layout: the stream's tool inventory ``tools`` (the
    fingerprint's ``tool:`` columns) and the latency kinds its chart reads ``kinds``
    (empty: the chart reads the fingerprint alone)."""

    __slots__ = ("d", "kinds", "size", "tools", "_plan")

    def __init__(self, tools: Sequence[str], kinds: Sequence[str]) -> None:
        feature_names(tools)  # the inventory's checks
        self.tools = tuple(tools)
        self.kinds = tuple(kinds)
        self.d = N_FIXED + len(self.tools)
        self.size = self.d + latency.N_STATS * len(self.kinds)
        plan_type = getattr(_native_module, "FeaturePlan", None)
        self._plan = None
        # (a kind listed twice is left to Python, which fills both of its places)
        if plan_type is not None and native_available() and \
                len(set(self.kinds)) == len(self.kinds):
            slots = {k: i for i, k in enumerate(self.kinds)}
            self._plan = plan_type(
                _ACTIONS, {t: i for i, t in enumerate(self.tools)}, len(self.tools),
                {k[len("tool:"):]: i for k, i in slots.items() if k.startswith("tool:")},
                slots.get("llm"), slots.get("retrieve"), len(self.kinds))

    def __call__(self, run: Run) -> tuple[F64, F64, CoverageParts | None]:
        """``(fingerprint, x, parts)``: the run's fingerprint; what the fingerprint chart
        reads (the fingerprint followed by the latency sums of ``kinds``; the fingerprint
        itself without kinds); the coverage parts (None from the Python functions: the
        tracker computes them)."""
        got = self._compute(run)
        if got is None:
            return self._python(run)
        row = np.frombuffer(got[0], dtype=np.float64)
        size = self.size
        logs = np.log1p(row[size:])
        row[0], row[3], row[11], row[12], row[13] = logs
        x = row[:size]
        return x[:self.d], x, _parts(got)

    def many(self, runs: Sequence[Run]) -> list[tuple[F64, F64, CoverageParts | None]]:
        """``[self(run) for run in runs]``, the same values, with one numpy pass over the
        runs' logarithms instead of one per run (numpy's ``log1p`` gives each element
        the same bits in an array of any length)."""
        if self._plan is None or len(runs) < 2:
            return [self(run) for run in runs]
        got = [self._compute(run) for run in runs]
        done = [g for g in got if g is not None]
        if not done:
            return [self._python(run) for run in runs]
        size, d = self.size, self.d
        mat = np.frombuffer(bytearray(b"".join(g[0] for g in done)),
                            dtype=np.float64).reshape(len(done), size + 5)
        mat[:, _LOG_COLUMNS] = np.log1p(np.ascontiguousarray(mat[:, size:]))
        out: list[tuple[F64, F64, CoverageParts | None]] = []
        i = 0
        for run, g in zip(runs, got, strict=True):
            if g is None:
                out.append(self._python(run))
                continue
            x = mat[i, :size]
            i += 1
            out.append((x[:d], x, _parts(g)))
        return out

    def _compute(self, run: Run) -> tuple[bytearray, str, list[str], list[str], list[str]] | None:
        """The compiled pass's answer for ``run`` (None: no plan, or it declines the run)."""
        plan = self._plan
        if plan is None or type(run.steps) is not list:
            return None
        got: tuple[bytearray, str, list[str], list[str], list[str]] | None = plan.compute(
            run.steps, run.output_length, run.duration_s, run.error)
        return got

    def _python(self, run: Run) -> tuple[F64, F64, None]:
        """The Python functions' fingerprint and chart input (the specification)."""
        fp = fingerprint(run, self.tools)
        if not self.kinds:
            return fp, fp, None
        lat = latency.stats_vector(latency.run_stats(run), self.kinds)
        return fp, np.concatenate([fp, lat]), None


def _parts(got: tuple[bytearray, str, list[str], list[str], list[str]]) -> CoverageParts:
    """The coverage parts of a compiled answer (a path too long kept as its digest, as
    ``coverage.path_key`` keeps it)."""
    path = got[1]
    if len(path) > MAX_PATH_CHARS:
        path = hashed_path(path)
    return CoverageParts(path, got[2], got[3], got[4])


#: The fingerprint's log columns, in the order the compiled pass gives their arguments.
_LOG_COLUMNS = [0, 3, 11, 12, 13]


@functools.lru_cache(maxsize=1024)
def run_features(tools: tuple[str, ...], kinds: tuple[str, ...]) -> RunFeatures:
    """The :class:`RunFeatures` of a layout, made once."""
    return RunFeatures(tools, kinds)
