"""``import assaywatch.auto``: instrument this process, as the first line of the agent.

Configures the OpenTelemetry SDK unless the application (or a distro) already set a
tracer provider, exporting OTLP per the standard ``OTEL_*`` variables (default: the local
``assaywatch monitor`` on localhost:4317, gRPC), and instruments every supported agent
framework found installed. Importing it again is a no-op; ``OTEL_SDK_DISABLED=true``
turns it into one. For arguments, call :func:`assaywatch.instrumentation.instrument`.
"""

from __future__ import annotations

from assaywatch.instrumentation import instrument
from assaywatch.instrumentation._safety import report

try:
    instrument()
except Exception:  # noqa: BLE001 - telemetry setup must never stop the agent from starting
    report("auto")
