"""assaywatch: statistical regression detection for AI agents traced with OpenTelemetry.

Importing this package has no side effects. ``import assaywatch.auto`` instruments the
process; ``assaywatch.instrumentation.instrument(...)`` does the same with arguments.
``assaywatch.stochastic`` (the pytest decorator of
``assaywatch.monitor.live.stochastic``) is imported on first access only.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "stochastic"]


def __getattr__(name: str) -> Any:
    if name == "stochastic":
        from assaywatch.monitor.live.stochastic import stochastic

        return stochastic
    raise AttributeError(f"module 'assaywatch' has no attribute {name!r}")
