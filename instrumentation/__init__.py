"""Instrumentation that runs inside the user's agent process.

Depends on the OpenTelemetry API/SDK and exporters only; never imports
``assaywatch.monitor`` or ``assaywatch.analyzers``. Importing it has no side effects.
"""

from __future__ import annotations
