"""assaywatch: statistical regression detection for AI agents traced with OpenTelemetry.

Importing this package has no side effects. ``import assaywatch.auto`` instruments the
process; ``assaywatch.instrumentation.instrument(...)`` does the same with arguments.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
