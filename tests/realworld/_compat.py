"""The one place where tests/realworld and bench_realistic import the monitor's engine, its
configuration and the gate, so a package restructure of ``assaywatch.monitor`` is fixed
here only.

Each name is looked up in a list of candidate modules, newest layout first, and the first
module that has it wins (ImportError only when none has it).

``FastEngine`` is the real :class:`Engine` with the two bookkeeping refreshes that raise
no alarm disabled: the pass-rate regression verdict (its exact power costs ~0.1 s per call
with a 10,000-run baseline, i.e. 4 ms per run at the Hotelling cadence) and the adaptive
budget recommendation. Neither feeds a detector, so alarms are those of the real engine
(checked by ``tests/realworld/test_world.py``). The real engine now computes both only
when a stream is read (``Engine.streams``), which the measurements do at most once at the
end; the override keeps that one read cheap too.
"""

from __future__ import annotations

import importlib
from typing import Any


def _find(name: str, modules: tuple[str, ...]) -> Any:
    errors = []
    for mod in modules:
        try:
            m = importlib.import_module(mod)
        except ImportError as exc:
            errors.append(f"{mod}: {exc}")
            continue
        if hasattr(m, name):
            return getattr(m, name)
        errors.append(f"{mod}: no {name}")
    raise ImportError(f"cannot find {name}: " + "; ".join(errors))


_ENGINE = ("assaywatch.monitor.engine.engine", "assaywatch.monitor.engine.core",
           "assaywatch.monitor.engine")
_CONFIG = ("assaywatch.monitor.config",)
_GATE = ("assaywatch.monitor.offline.gate", "assaywatch.monitor.gate")

Engine = _find("Engine", _ENGINE)
AlarmEvent = _find("AlarmEvent", _ENGINE)
DetectorConfig = _find("DetectorConfig", _CONFIG + _ENGINE)
decide = _find("decide", _GATE)
GatePolicy = _find("GatePolicy", _GATE)


class FastEngine(Engine):  # type: ignore[misc,valid-type]
    """:class:`Engine` without the alarm-free bookkeeping refreshes (module docstring)."""

    def _pass_rate_verdict(self, *args: Any) -> None:
        return None

    def _recommend(self, *args: Any) -> None:
        return None


__all__ = ["AlarmEvent", "DetectorConfig", "Engine", "FastEngine", "GatePolicy", "decide"]
