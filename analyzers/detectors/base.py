"""The interface every sequential change detector of the monitor implements.

A detector consumes one observation per run (a pass/fail bit, a fingerprint vector or a
scalar) and keeps a detection statistic. The monitor relies on exactly this surface:

* ``update(x) -> None`` feeds one observation.
* ``drift_detected`` is True right after the update at which the alarm fired (river's
  convention). The statistic keeps its alarm value until the next ``update``, which first
  restarts it from zero (``n`` and ``n_alarms`` keep counting): a change that persists
  therefore fires again, after about one more detection delay.
* ``statistic`` / ``threshold``: the alarm fires when ``statistic >= threshold``.
* ``n`` (updates seen), ``n_alarms``; ``reset()`` returns to the freshly built state.
* ``evidence()``: a JSON-safe snapshot written beside each alarm.
* ``get_state()`` / ``set_state(state)``: a JSON-safe checkpoint; a new instance built
  with the same arguments and given the state continues exactly where the old one was,
  without re-alarming.

Subclasses store their constructor arguments unchanged as public attributes, build their
state in ``_reset()`` and list the names of the state attributes in ``_state_fields``;
``get_state``/``set_state``/``__repr__`` are derived from these.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = ["Detector", "JSONValue", "SequentialDetector", "split_arl0"]

JSONValue = Any  # a JSON-serialisable value: None, bool, int, float, str, list, dict

_STATE_VERSION = 1


def _to_json(value: Any) -> JSONValue:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    return value


def _from_json(value: JSONValue) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        if "__float__" in value:
            return float(value["__float__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _repr_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    return repr(value)


def feature_labels(feature_names: Sequence[str] | None, d: int) -> list[str]:
    """Names of a detector's d features: the given ones (checked to be d), else f0..f{d-1}."""
    if feature_names is None:
        return [f"f{j}" for j in range(d)]
    names = [str(n) for n in feature_names]
    if len(names) != d:
        raise ValueError(f"feature_names has {len(names)} names for {d} features")
    return names


def split_arl0(target: float, n_detectors: int) -> float:
    """ARL0 each of a stream's ``n_detectors`` detectors gets so the union meets ``target``.

    Bonferroni in time: a detector with in-control ARL0 ``A`` false-alarms at a long-run
    rate of 1/A per run (renewal theorem, the detectors restart after each alarm). The
    union alarms at most at the sum of the rates, so giving each ``target * n_detectors``
    keeps the union's rate <= 1/target, i.e. union ARL0 >= target. It is conservative when
    the detectors' false alarms coincide (correlated inputs), exact for disjoint ones.

    Examples
    --------
    >>> split_arl0(10_000, 3)
    30000.0
    """
    if not (target > 1 and math.isfinite(target)):
        raise ValueError(f"target={target!r} must be a finite ARL0 in runs > 1")
    if n_detectors < 1:
        raise ValueError(f"n_detectors={n_detectors!r} must be >= 1")
    return float(target) * n_detectors


@runtime_checkable
class SequentialDetector(Protocol):
    """The surface the monitor's engine runs every alarming detector through (a stream's
    watches, ``monitor/engine/signals.py``): the :class:`Detector` subclasses and the
    evaluators' score and label CUSUMs (``score.py``, ``label.py``) have it."""

    def update(self, x: Any, /) -> None: ...

    @property
    def drift_detected(self) -> bool: ...

    @property
    def statistic(self) -> float: ...

    @property
    def threshold(self) -> float: ...

    def evidence(self) -> dict[str, Any]: ...


class Detector(ABC):
    """Abstract sequential change detector (see the module docstring for the contract)."""

    _state_fields: ClassVar[tuple[str, ...]] = ()

    _n: int
    _n_alarms: int
    _drift: bool

    def _reset_common(self) -> None:
        self._n = 0
        self._n_alarms = 0
        self._drift = False

    @abstractmethod
    def _reset(self) -> None:
        """Build the fresh state (must call ``_reset_common``)."""

    @abstractmethod
    def update(self, x: Any) -> None:
        """Feed one observation."""

    @property
    @abstractmethod
    def statistic(self) -> float:
        """Current detection statistic (alarm at ``statistic >= threshold``)."""

    @property
    @abstractmethod
    def threshold(self) -> float:
        """Alarm threshold h."""

    @abstractmethod
    def evidence(self) -> dict[str, float | int | str]:
        """JSON-safe snapshot to store beside an alarm."""

    @property
    def drift_detected(self) -> bool:
        """True right after the update at which the alarm fired."""
        return self._drift

    @property
    def n(self) -> int:
        """Number of updates seen since construction or the last ``reset()``."""
        return self._n

    @property
    def n_alarms(self) -> int:
        """Number of alarms fired since construction or the last ``reset()``."""
        return self._n_alarms

    def reset(self) -> None:
        """Forget everything seen: back to the freshly constructed state."""
        self._reset()

    def _begin_update(self) -> None:
        """Count the update and restart the statistic if the previous update alarmed."""
        if self._drift:
            self._restart()
            self._drift = False
        self._n += 1

    def _alarm(self, fired: bool) -> None:
        self._drift = fired
        if fired:
            self._n_alarms += 1

    @abstractmethod
    def _restart(self) -> None:
        """Set the statistic back to zero after an alarm (counters are kept)."""

    def get_state(self) -> dict[str, JSONValue]:
        """JSON-safe checkpoint of the detector's mutable state."""
        fields = ("_n", "_n_alarms", "_drift", *self._state_fields)
        return {
            "detector": type(self).__name__,
            "version": _STATE_VERSION,
            "state": {name: _to_json(getattr(self, name)) for name in fields},
        }

    def set_state(self, state: dict[str, JSONValue]) -> None:
        """Restore a checkpoint made by ``get_state`` of a detector built identically.

        Raises
        ------
        ValueError
            When the checkpoint was made by another detector class or state version, or
            lacks a field; rebuild the detector from its baseline instead.
        """
        kind = state.get("detector")
        if kind != type(self).__name__ or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"checkpoint is for detector {kind!r} (version {state.get('version')!r}), "
                f"not {type(self).__name__} version {_STATE_VERSION}; discard it and "
                "rebuild the detector"
            )
        values = state.get("state")
        fields = ("_n", "_n_alarms", "_drift", *self._state_fields)
        if not isinstance(values, dict) or any(name not in values for name in fields):
            raise ValueError(
                f"checkpoint for {kind} lacks fields; expected {list(fields)}; discard it"
            )
        for name in fields:
            self._set_field(name, _from_json(values[name]))

    def _set_field(self, name: str, value: Any) -> None:
        current = getattr(self, name, None)
        if isinstance(current, np.ndarray):
            arr = np.asarray(value, dtype=current.dtype)
            if arr.shape != current.shape:
                raise ValueError(
                    f"checkpoint field {name} has shape {arr.shape}, the detector expects "
                    f"{current.shape}: it was built with other arguments; discard it"
                )
            value = arr
        setattr(self, name, value)

    def __repr__(self) -> str:
        params = inspect.signature(type(self).__init__).parameters
        args = ", ".join(
            f"{name}={_repr_value(getattr(self, name))}"
            for name, p in params.items()
            if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
        )
        return f"{type(self).__name__}({args})"
