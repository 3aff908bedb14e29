"""``AgentInstrumentor``: assaywatch under ``opentelemetry-instrument``.

Registered in the ``opentelemetry_instrumentor`` entry-point group (pyproject.toml), so
``opentelemetry-instrument python agent.py`` loads it with the other instrumentors. It is
the same switch as :func:`assaywatch.instrumentation.instrument`: configure the SDK when
no distro or app did, activate the GenAI framework instrumentations, add the scenario
processor. ``BaseInstrumentor`` makes it a singleton with idempotent
``instrument``/``uninstrument``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from assaywatch.instrumentation import _core


class AgentInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instrument agents: OpenAI, Anthropic, LangChain/LangGraph, OpenAI Agents SDK.

    Keyword arguments of ``instrument()`` are those of
    :func:`assaywatch.instrumentation.instrument` (``tracer_provider``, ``frameworks``,
    ``disable_openai_trace_export``, ...).
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        # Every framework is optional: each is instrumented only when installed.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        known = {"tracer_provider", "configure_sdk", "service_name", "exporter", "protocol",
                 "endpoint", "headers", "frameworks", "disable_openai_trace_export"}
        _core.instrument(**{k: v for k, v in kwargs.items() if k in known})

    def _uninstrument(self, **kwargs: Any) -> None:
        _core.uninstrument()
