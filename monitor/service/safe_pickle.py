"""Reading checkpoints of earlier versions without letting them run code: an allow-listed
unpickler.

Checkpoints are now written as data (``statecodec.py``). Versions before pickled the
engine's state (streams, detectors over numpy arrays, baselines, the evaluation join): the
monitor's SQLite checkpoint of schema 2 (``state.py``) and the Kafka detectors' state of
schema 1 (``scaleout/records.py``). Such a checkpoint is read once, to upgrade, by
:func:`loads`, which resolves names only from :func:`allowed` (also the allow-list of
``statecodec.py``):

* classes of the ``assaywatch.analyzers`` package (pure statistics: no I/O, no threads)
  and the state classes of the monitor listed in :data:`MONITOR_STATE` (streams and their
  watches, the
  calibration cache and job, the evaluation join, span and evaluation records);
* enums and dataclasses of those modules (their ``__init__`` assigns fields);
* :data:`STDLIB` containers and :data:`NUMPY` array, dtype, scalar and bit-generator
  reconstructors (each builds a value from its arguments, nothing else).

Anything else (``os.system``, ``builtins.eval``, ``subprocess``, a function of the
monitor such as its CLI entry point, a class that opens files or starts threads) raises
:class:`UnsafeState` before it is called. The monitor's checkpoint is also MAC-checked
before it is read at all (``state.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import pickle
from typing import Any

__all__ = ["UnsafeState", "allowed", "loads"]

#: Monitor classes a checkpoint holds (module, name).
MONITOR_STATE: frozenset[tuple[str, str]] = frozenset({
    ("assaywatch.monitor.engine.streams", "StreamState"),
    ("assaywatch.monitor.engine.streams", "EvaluatorState"),
    ("assaywatch.monitor.engine.streams", "AlarmEvent"),
    ("assaywatch.monitor.engine.signals", "Watch"),
    ("assaywatch.monitor.engine.calibration", "CalibrationJob"),
    ("assaywatch.monitor.engine.calibration", "ThresholdCache"),
    ("assaywatch.monitor.pipeline.join", "EvaluationJoin"),
    ("assaywatch.monitor.pipeline.join", "LateEvaluation"),
    ("assaywatch.monitor.pipeline.join", "_RunDigest"),
    ("assaywatch.monitor.pipeline.outcome", "Evaluation"),
    ("assaywatch.monitor.receivers.spans", "SpanRecord"),
    ("assaywatch.monitor.receivers.spans", "SpanEvent"),
    ("assaywatch.monitor.scaleout.records", "PartitionState"),
})
#: Functions of the analyzers a checkpoint names (default factories).
ANALYZER_FUNCTIONS: frozenset[tuple[str, str]] = frozenset({
    ("assaywatch.analyzers.coverage", "default_boundary_hits"),
})
STDLIB: frozenset[tuple[str, str]] = frozenset({
    ("collections", "deque"), ("collections", "OrderedDict"), ("collections", "Counter"),
    ("collections", "defaultdict"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "complex"), ("builtins", "bytearray"), ("builtins", "object"),
    ("copyreg", "_reconstructor"),
})
NUMPY: frozenset[tuple[str, str]] = frozenset({
    ("numpy", "dtype"), ("numpy", "ndarray"),
    *((m, n) for m in ("numpy.core.numeric", "numpy._core.numeric") for n in ("_frombuffer",)),
    *((m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
      for n in ("_reconstruct", "scalar")),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
})


class UnsafeState(pickle.UnpicklingError):
    """The data names a callable outside the allow-list."""


def allowed(module: str, name: str) -> bool:
    """True when a checkpoint may name ``module.name`` (module docstring)."""
    key = (module, name)
    if key in STDLIB or key in NUMPY or key in MONITOR_STATE or key in ANALYZER_FUNCTIONS:
        return True
    if not module.startswith("assaywatch.analyzers.") and module != "assaywatch.analyzers":
        return False
    if "." in name:  # a dotted path could reach an attribute of a class
        return False
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(obj, type) and (issubclass(obj, enum.Enum) or dataclasses.is_dataclass(obj)
                                      or obj.__module__ == module)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafeState(f"the state names {module}.{name}, which a checkpoint never "
                              "holds: refused (it would run code)")
        return super().find_class(module, name)


def loads(data: bytes) -> Any:
    """``pickle.loads`` resolving only allow-listed names; :class:`UnsafeState` else."""
    return _Unpickler(io.BytesIO(data)).load()
